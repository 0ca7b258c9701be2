"""Run any model's pipeline stages through a schedule on real ranks: the one executor.

A pipeline rank holds one or more (virtual) stages of a model, as modules. It follows its
row of the schedule step by step: a forward action (``kF i``) runs stage k on micro-batch i
and keeps what the backward will need; a backward action (``kB i``) runs autograd back
through it; a split backward runs the input gradient (``kI i``) first and the weight
gradient (``kW i``) later (:mod:`parlab.pipeline.split_backward`). Between the steps,
activations travel forward and their gradients backward with ``dist.send``/``dist.recv``;
between two stages on the same rank (interleaving's chunks, the tip of a V placement, where
rank p - 1 holds stages p - 1 and p) they stay on the rank. :func:`run_schedule` knows nothing about what the stages
hold: chapter 03's four-layer network (:mod:`parlab.pipeline.executor`), a GPT whose blocks
are split by tensor parallelism (:mod:`parlab.hybrid`), any model cut by :func:`split_layers`.

No deadlock, on any backend: in each step's communication phase every rank walks the same
globally ordered list of that step's transfers (from :func:`parlab.pipeline.simulate`) and
does its part (send if it is the source, recv if it is the destination). The earliest
unfinished transfer always has both of its ranks waiting on it, so the phase completes,
even with blocking sends and with transfers going both ways between two ranks.

Collectives inside a stage (tensor parallelism's all-reduces) are safe too: the ranks of
one tensor group hold the same stages and walk the same row in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from parlab.launch import recording, span
from parlab.checks import check_count
from parlab.memory import check_stage_layers
from parlab.pipeline.programs import Program
from parlab.pipeline.schedules import Schedule
from parlab.pipeline.simulator import Event, StageTransfer, simulate
from parlab.pipeline.split_backward import program_steps, SplitBackward

__all__ = ["StageRun", "run_schedule", "split_layers"]


def split_layers(layers: int, stages: int, stage: int, *, first: int = 0,
                 last: int = 0, what: str = "model", stage_layers=None) -> range:
    """Which of ``layers`` layers (0-based) pipeline stage ``stage`` of ``stages`` holds.

    The ``first`` layers ride with stage 0 and the ``last`` ones with the last stage (a
    GPT's embeddings and its head, as Megatron places them); the layers between are split
    into equal, contiguous shares, or into ``stage_layers`` (one count per stage, positive,
    summing to the layers between: the unequal stages of :mod:`parlab.memory.stages`, as
    Megatron-LM's ``--decoder-first/last-pipeline-num-layers`` make them, the same counts
    :func:`parlab.memory.estimate` takes). ``what`` names the model in errors.
    """
    check_count("stages", stages, "pipeline stages x chunks")
    middle = layers - first - last
    if stage_layers is not None:
        counts = check_stage_layers(stage_layers, middle, stages, f"the {what}")
    elif middle < stages:
        raise ValueError(f"stages={stages} is more than the {what}'s {middle} layers: every "
                         f"stage needs at least one layer")
    elif middle % stages:
        raise ValueError(f"the {what}'s {middle} layers do not split evenly over {stages} "
                         f"stages x chunks; choose a divisor of {middle}, or give "
                         f"stage_layers, one count per stage")
    else:
        counts = (middle // stages,) * stages
    if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < stages:
        raise ValueError(f"stage must be in 0..{stages - 1}, got {stage!r}")
    start = first + sum(counts[:stage])
    return range(0 if stage == 0 else start,
                 layers if stage == stages - 1 else start + counts[stage])


@dataclass
class StageRun:
    """What one pipeline rank did: its log lines, its share of the loss (non-zero on the
    rank holding the last stage), per step the messages the toy backend logged as sent by
    it (None on other backends), and its timed actions and transfers."""

    events: list[Event]
    loss: float
    traffic: list | None
    spans: list


def run_schedule(sched: Schedule | Program, modules: dict, inputs: Sequence, targets: Sequence,
                 loss_fn: Callable, activation_shape: Callable[[int, int], tuple], *,
                 peers: Sequence[int] | None = None, group=None,
                 transfers_by_step: list[list[StageTransfer]] | None = None,
                 dtype: torch.dtype | None = None) -> StageRun:
    """Run this rank's row of ``sched`` over the stages it holds.

    - ``sched``: a :class:`Schedule` (chapter 03's time steps), or a
      :class:`parlab.pipeline.Program` (any schedule, split backward and V placement
      included), put into steps by :func:`parlab.pipeline.split_backward.program_steps`.
    - ``modules``: ``{virtual stage k: module}`` for every stage this rank holds
      (``sched.rank_of(k)`` is its pipeline rank); gradients accumulate in their parameters.
    - ``inputs`` / ``targets``: the micro-batches fed to stage 0 and to the loss (read only
      on the ranks holding the first and the last stage).
    - ``loss_fn(output, target)``: micro-batch i's share of the batch loss (the shares add
      up to the batch loss, so the gradients equal one process's).
    - ``activation_shape(k, i)``: the shape of stage k's output for micro-batch i (what
      stage k + 1 receives, and the shape of the gradient that comes back); ``dtype`` that
      of the tensors received (default: the dtype of the stages' parameters).
    - ``peers[r]``: the global rank of pipeline rank r (default: ranks 0..stages-1);
      ``group``: the process group the sends and receives go through (its label is what the
      toy backend's log shows).
    """
    from parlab.launch import rank_device
    device = rank_device()  # this rank's GPU under NCCL, else the CPU
    if isinstance(sched, Program):
        sched, by_step = program_steps(sched)
        transfers_by_step = transfers_by_step or by_step
    peers = list(range(sched.stages)) if peers is None else list(peers)
    if len(peers) != sched.stages:
        raise ValueError(f"peers must name the global rank of each of the {sched.stages} "
                         f"pipeline ranks, got {peers}")
    me = peers.index(dist.get_rank())
    K = sched.virtual_stages
    mine = {k for k in range(K) if sched.rank_of(k) == me}
    if set(modules) != mine:
        raise ValueError(f"pipeline rank {me} holds stages {sorted(mine)} of {sched.name} "
                         f"({sched.placement} placement), got modules for {sorted(modules)}")
    if len(inputs) != sched.microbatches or len(targets) != sched.microbatches:
        raise ValueError(f"{sched.name} runs {sched.microbatches} micro-batches: give as many "
                         f"inputs and targets (got {len(inputs)} and {len(targets)})")
    if transfers_by_step is None:
        transfers_by_step = [rec.transfers for rec in simulate(sched).records]
    dtype = dtype or next((q.dtype for m in modules.values() for q in m.parameters()
                           if q.is_floating_point()), torch.get_default_dtype())
    split = {a.stage for t in range(sched.steps) for a in sched.actions(me, t) if a.kind == "I"}
    passes = SplitBackward({k: modules[k] for k in split})
    inbox, saved, outbox, pending, events = {}, {}, {}, {}, []
    loss_total = torch.zeros((), device=device, dtype=dtype)
    toy_log = _toy_log()
    traffic, seen = ([], len(toy_log())) if toy_log else (None, 0)  # this call's messages
    with recording() as recorder:
        for step in range(sched.steps):
            step_events = {}  # (kind of what it sends, stage, micro-batch) -> log line
            for action in sched.actions(me, step):
                k, i = action.stage, action.microbatch
                with span(str(action), "compute", step=step + 1, stage=k, kind=action.kind,
                          microbatch=i):
                    produced = _run_action(action, K, modules, passes, inputs, targets, loss_fn,
                                           inbox, saved, pending, device)
                if action.kind == "F":
                    if k == K - 1:
                        loss_total += produced.detach()
                    produced, target_stage, kind = produced.detach(), k + 1, "y"
                else:
                    target_stage, kind = k - 1, "E" if action.kind != "W" else "W"
                if kind != "W" and 0 <= target_stage < K:
                    if sched.rank_of(target_stage) == me:  # the next chunk is here: no transfer
                        inbox[(kind, k, i)] = produced
                    else:
                        outbox[(kind, k, i)] = produced
                step_events[(kind, k, i)] = [step + 1, me, str(action), None]
            for transfer in transfers_by_step[step]:  # the same global order on every rank
                key = (transfer.kind, transfer.src_stage, transfer.microbatch)
                if transfer.src == me:
                    tensor = outbox.pop(key).contiguous()
                    with _transfer_span("send", transfer, peers[transfer.dst], tensor, step):
                        dist.send(tensor, peers[transfer.dst], group=group)
                    step_events[key][3] = transfer  # logged once it has really been sent
                elif transfer.dst == me:
                    shape = activation_shape(min(transfer.src_stage, transfer.dst_stage),
                                             transfer.microbatch)
                    buffer = torch.empty(shape, device=device, dtype=dtype)
                    with _transfer_span("recv", transfer, peers[transfer.src], buffer, step):
                        dist.recv(buffer, peers[transfer.src], group=group)
                    inbox[key] = buffer
            events += [Event(*e) for e in step_events.values()]
            if toy_log:  # what the backend itself logged in this step's communication phase
                log = toy_log()
                traffic.append([r for r in log[seen:] if r.src == peers[me]])
                seen = len(log)
    passes.close()
    return StageRun(events, float(loss_total), traffic, recorder.spans)


def _run_action(action, K, modules, passes, inputs, targets, loss_fn, inbox, saved, pending,
                device):
    """Compute one action; returns what it makes for a neighbour (F: the output, or the loss
    on the last stage; B and I: the input gradient, None on stage 0; W: None)."""
    k, i = action.stage, action.microbatch
    if action.kind == "F":
        inp = inputs[i].to(device) if k == 0 else inbox.pop(("y", k - 1, i))
        inp = inp.detach().requires_grad_(k > 0)
        out, noted = passes.forward(modules[k], inp)
        if k == K - 1:
            out = loss_fn(out, targets[i].to(device))
        saved[(k, i)] = (inp, out, noted)
        return out
    if action.kind == "W":
        passes.weight_gradient(pending.pop((k, i)))
        return None
    inp, out, noted = saved.pop((k, i))
    grad = None if k == K - 1 else inbox.pop(("E", k + 1, i))
    if action.kind == "I":
        input_grad, pending[(k, i)] = passes.input_gradient(inp, out, grad, noted)
        return input_grad
    out.backward(grad)
    return inp.grad if k > 0 else None


def _transfer_span(op: str, transfer: StageTransfer, peer: int, tensor, step: int):
    """A communication span named after the action whose result moves: "send 2F0 -> 3"."""
    produced_by = f"{transfer.src_stage}{'F' if transfer.kind == 'y' else 'B'}{transfer.microbatch}"
    arrow = "->" if op == "send" else "<-"
    return span(f"{op} {produced_by} {arrow} {peer}", "communication", op=op, peer=peer,
                bytes=tensor.numel() * tensor.element_size(),
                tensor=f"{transfer.kind}{transfer.microbatch + 1}", step=step + 1)


def _toy_log():
    """The toy backend's per-rank message log function, when this group runs on it."""
    if dist.get_backend() != "toy":
        return None
    from parlab.comm.toy import transfers
    return transfers
