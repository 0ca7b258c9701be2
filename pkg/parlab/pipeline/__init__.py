"""Pipeline parallelism (chapter 03, Figures 8-3 to 8-14): schedules, simulator, executor.

``schedules`` (schedules as per-rank action lists: book, naive, GPipe, 1F1B, interleaved),
``simulator`` (the per-step table, bubble and in-flight activations of a schedule),
``notation`` (the chapter's labels: F1/E1, y1 A1->A2, one time step in words), ``runner``
(the one executor: any model's stages run through a schedule on real ranks), ``executor``
(chapter 03's network run that way, logged step by step and checked), ``torch_pipelining``
(``torch.distributed.pipelining`` beside ours), ``tradeoffs`` (the schedules' trade-offs as
numbers), ``slots`` (actions against busy slots: the book's doubled steps, and the same
schedule with one action per slot), ``zero_bubble`` (schedules that split the backward into B and
W: ZB-H1, ZBV, DualPipeV), ``programs`` (every schedule as each rank's order of actions, with
its placement: loop or V), ``events`` (the event-driven simulator: durations for F, B, W and
transfers; idle time, activations and parameters per rank), ``split_backward`` (the input
gradient I and the weight gradient W on real ranks, and a program put into the executor's
steps), ``program_run`` (any program, V placement included, trained on real ranks over SGD
steps). Imports :mod:`parlab.launch`, :mod:`parlab.comm` and
:mod:`parlab.memory`.
"""

from parlab.pipeline.schedules import Action, from_order, Schedule, schedule
from parlab.pipeline.simulator import Event, simulate, Simulation, stage_gpu_name, StageTransfer
from parlab.pipeline.runner import run_schedule, split_layers, StageRun
from parlab.pipeline.notation import action_code, describe_step, transfer_label
from parlab.pipeline.executor import (
    execute, Execution, Network, reference, reference_step, run_network, stage_layers
)
from parlab.pipeline.torch_pipelining import (
    our_action_order, torch_action_order, torch_pipelining, TorchRun, TORCH_SCHEDULES,
    V_SCHEDULES_NEED_TORCH,
)
from parlab.pipeline.slots import (
    doubled_steps, one_action_per_slot, slot_count, SlotCount, work_percent
)
from parlab.pipeline.zero_bubble import dualpipe_v, v_stages, zb_h1, zbv, ZERO_BUBBLE
from parlab.pipeline.programs import PROGRAMS, program, program_from_order, Program
from parlab.pipeline.events import Durations, Timed, Timeline, timeline
from parlab.pipeline.split_backward import program_steps, SplitBackward, weight_modules
from parlab.pipeline.program_run import execute_program, execute_programs, ProgramRun
from parlab.pipeline.tradeoffs import (
    COMPARED, compare, comparison_table, ScheduleCost, Tradeoffs, tradeoffs
)

__all__ = ["Action", "Schedule", "schedule", "from_order", "StageTransfer", "Event", "Simulation",
           "simulate", "stage_gpu_name", "run_schedule", "split_layers", "StageRun", "run_network",
           "stage_layers", "action_code", "describe_step", "transfer_label",
           "Network", "Execution", "execute", "reference", "reference_step", "TorchRun",
           "torch_pipelining", "our_action_order", "torch_action_order", "TORCH_SCHEDULES", "V_SCHEDULES_NEED_TORCH", "compare", "comparison_table", "ScheduleCost",
           "COMPARED",
           "SlotCount", "slot_count", "work_percent", "one_action_per_slot", "doubled_steps",
           "Tradeoffs", "tradeoffs", "zb_h1", "zbv", "dualpipe_v", "v_stages", "ZERO_BUBBLE",
           "Program", "program", "program_from_order", "PROGRAMS", "Durations", "Timed",
           "Timeline", "timeline", "program_steps", "SplitBackward", "weight_modules",
           "execute_program", "execute_programs", "ProgramRun"]
