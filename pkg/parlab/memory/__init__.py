"""What a GPU holds while it trains, and what a run costs: estimate, measure, energy.

``calculator`` (parameters, gradients, optimizer state, master weights and activations per GPU,
for any precision, optimizer, data / tensor / pipeline / context split and ZeRO stage),
``setup`` (every argument of an estimate or a measurement checked once, into one ``Setup``),
``fitting`` (the smallest GPU count that fits), ``ranks`` (every pipeline rank's estimate),
``breakdown`` (what an estimate or a measurement returns), ``modules`` and
``tracing`` (the estimate for any ``torch.nn.Module``: one training step traced with fake
tensors, nothing allocated, so a 7B model built on the meta device takes seconds),
``states`` (the one formula for the model states per GPU, sharded by ZeRO stages 0 to 3 over
the data-parallel ranks: :func:`model_state_bytes`, and the precision and optimizer tables it
reads), ``measurement`` (a real training step, counted part by part, to check the estimate),
``decoders`` (the GPT and Llama configs' closed forms: what one block saves, op by op, the
parameters per tensor-parallel rank, what recomputation drops; :func:`tp_problem`),
``recompute`` (activation recomputation: its formulas, a tracker of the bytes alive at any
moment, and a step measured with and without checkpointed layers), ``energy`` (power, the
electricity bill, and what a failure costs with and without checkpoints), ``serving`` (the
weights and key/value cache of a model that only answers, without training state),
``vshape`` (the layers and parameters a pipeline GPU holds, and the V schedules ZBV and
DualPipeV counted per rank: two chunks each, rank 0 holding both ends of the model),
``interleaved`` (interleaved 1F1B's peak in-flight chunks per rank), ``stages`` (how many
layers each pipeline stage holds: as even as possible, or the user's ``stage_layers``).
Imports :mod:`parlab.models`.
"""

from parlab.memory.states import (
    bytes_per_parameter_table, check_optimizer, model_state_bytes, ModelStates, OPTIMIZERS,
    PRECISIONS, ZERO_STAGES
)
from parlab.memory.breakdown import Breakdown, ESTIMATED_SCHEDULES, Plan
from parlab.memory.tracing import ModuleTrace, trace_module
from parlab.memory.interleaved import interleave_problem, interleaved_peak
from parlab.memory.stages import check_stage_layers, rank_layers, stage_layer_counts
from parlab.memory.vshape import fewest_microbatches, V_SCHEDULES, v_in_flight, v_problem
from parlab.memory.modules import stage_ranges
from parlab.memory.decoders import CP_METHODS, tensor_split_sizes, tp_problem
from parlab.memory.calculator import (
    activation_bytes, activations_per_layer, block_activations, estimate
)
from parlab.memory.fitting import min_gpus
from parlab.memory.ranks import estimate_ranks
from parlab.memory.measurement import forward_saved_bytes, measure
from parlab.memory.recompute import (
    layer_activations, live_bytes, measure_recompute, RECOMPUTE, recompute_flops, RecomputeFlops,
    RecomputeResult, Trace
)
from parlab.memory.energy import (
    expected_waste, failure_cost, rdma_retry_times, RetryTimes, RunCost, training_cost, Waste,
    waste_curve, WasteCurve, young_interval
)
from parlab.memory.korthikanti import compare_block, korthikanti_terms
from parlab.memory.serving import Serving, serving_bytes

__all__ = ["forward_saved_bytes", "check_optimizer", "bytes_per_parameter_table", "PRECISIONS",
           "OPTIMIZERS",
           "ESTIMATED_SCHEDULES", "ZERO_STAGES", "Breakdown", "Plan", "ModelStates", "estimate",
           "min_gpus", "model_state_bytes", "activation_bytes", "activations_per_layer", "measure",
           "RunCost", "Waste", "training_cost", "failure_cost", "expected_waste", "young_interval",
           "rdma_retry_times", "RetryTimes", "RECOMPUTE", "layer_activations", "recompute_flops",
           "RecomputeFlops", "Trace", "live_bytes", "measure_recompute", "RecomputeResult",
           "ModuleTrace", "trace_module", "stage_ranges", "block_activations", "korthikanti_terms",
           "compare_block", "tensor_split_sizes", "tp_problem", "Serving", "serving_bytes",
           "WasteCurve", "waste_curve", "CP_METHODS", "V_SCHEDULES", "fewest_microbatches",
           "v_in_flight", "v_problem", "estimate_ranks", "interleave_problem",
           "interleaved_peak", "check_stage_layers", "rank_layers", "stage_layer_counts"]
