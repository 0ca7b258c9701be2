"""The planner's step model: the seconds of one training step, part by part.

Why this module exists: :mod:`parlab.hybrid.planner` searches layouts and
:mod:`parlab.hybrid.assumptions` lists what it takes as given; the arithmetic that turns one
layout into seconds lives here, so a reader can follow it in one place. The parts
(:data:`parlab.hybrid.assumptions.TIME_PARTS`) of a step of m micro-batches:

- ``compute``: m micro-batches through one stage, FLOPs at mfu x roofline of peak (or,
  with ``compute_model="kernels"``, each layer's kernels, :func:`kernel_times`). A
  pipeline runs at its slowest stage's pace (every micro-batch passes every stage, so the
  stage with the most layers sets each slot): with unequal stages (pp not dividing the
  layers, or the assumptions' ``stage_layers``) a slot is the even split's L/pp-layer stage
  scaled by the most layers any rank holds, max_k L_k x pp / L (:func:`slowest_stage_scale`;
  the embedding and the head stay spread evenly); ``recompute`` and ``tensor`` scale alike;
- ``recompute``: the forward FLOPs recomputation repeats;
- ``tensor``: Megatron's tensor-parallel all-reduces (never overlapped: the next matrix
  product needs their result);
- ``pipeline``: each micro-batch's activation forward and gradient back across each stage
  boundary; interleaved 1F1B (``virtual_stages`` = v) crosses every rank v times, so v times
  1F1B's (Narayanan et al. 2021, section 2.2.2). ``scatter_gather`` (their section 4.1):
  each of the tp GPUs of a stage sends 1/tp of the activation on its own NIC, and the
  receiving stage all-gathers the pieces over NVLink, instead of every GPU sending the whole;
- ``bubble``: the idle share of the pipeline, :func:`bubble_fraction` of the stage's busy time;
- ``data``: the data-parallel gradient all-reduce after the last micro-batch.
  ``overlap_data_parallel`` (PyTorch DDP's buckets): gradients are all-reduced in buckets
  while the backward of the last micro-batch still runs (earlier micro-batches only
  accumulate: DDP's ``no_sync``), so the all-reduce hides behind that backward, its window:
  2/3 of the micro-batch's compute (backward 4 of the 6 FLOPs per parameter and token), its
  recomputed forward and its tensor-parallel backward all-reduces. What does not fit in the
  window is exposed, and so is the last bucket (the first layers' gradients, ready only when
  the backward ends): exposed = max(all-reduce - window, all-reduce x bucket / gradient
  bytes), the bucket PyTorch's default 25 MB (``bucket_cap_mb``). Megatron's own "local"
  DDP of 2021 all-reduced after the backward, so it is not overlapped: see
  :mod:`parlab.hybrid.published`.
"""

from __future__ import annotations

from parlab import memory
from parlab.comm import allreduce_time, Topology
from parlab.hybrid.assumptions import Assumptions, bubble_fraction
from parlab.models import (
    block_matmul_efficiency, count_parameters, flops_seconds, head_seconds,
    layer_time
)

__all__ = ["DDP_BUCKET_BYTES", "micro_batch_efficiency", "step_times", "exposed_data_parallel",
           "slowest_stage_scale", "slowest_stage_layers", "kernel_times", "useful_flops"]

#: PyTorch DDP's default gradient bucket (``bucket_cap_mb=25``), in bytes.
DDP_BUCKET_BYTES = 25 * 2 ** 20


def micro_batch_efficiency(config, b: int, tp: int, a: Assumptions) -> float:
    """Roofline share of compute-bound speed for micro-batches of ``b`` sequences
    (:func:`parlab.models.block_matmul_efficiency` on b x seq tokens)."""
    return block_matmul_efficiency(config, b * a.sequence(config), tp,
                                   memory.PRECISIONS[a.precision].bytes, a.gpu_tflops,
                                   a.gpu_tb_per_s)


def slowest_stage_scale(config, pp: int, a: Assumptions) -> float:
    """The slowest pipeline rank's layers over an even share, max_k L_k / (L / pp): 1 when pp
    divides the L layers evenly (and no ``stage_layers`` say otherwise), 11 / (32 / 3) =
    1.03125 for Llama-3-8B's 32 layers on pp=3 (11, 11, 10). A pipeline runs at its slowest
    stage's pace, so the planner prices every slot as that stage's."""
    return slowest_stage_layers(config, pp, a) * pp / config.n_layers


def slowest_stage_layers(config, pp: int, a: Assumptions) -> int:
    """The most layers one of the ``pp`` pipeline ranks runs per micro-batch."""
    return max(memory.rank_layers(config.n_layers, pp, a.schedule, a.virtual_stages,
                                  a.stage_layers))


def exposed_data_parallel(allreduce_s: float, window_s: float, gradient_bytes: float) -> float:
    """Seconds of a data-parallel all-reduce left exposed when it overlaps a backward of
    ``window_s`` seconds (module docstring): at least its last bucket's share."""
    if allreduce_s <= 0:
        return 0.0
    last_bucket = allreduce_s * min(1.0, DDP_BUCKET_BYTES / gradient_bytes)
    return max(allreduce_s - window_s, last_bucket)


def kernel_times(config, tp, pp, b, a: Assumptions, recompute=None) -> tuple:
    """(compute, recompute, backward) seconds of one micro-batch on the slowest stage's rank
    with ``compute_model="kernels"``: its layers' :func:`parlab.models.layer_time` (weight and
    score products at the measured matmul speed x roofline, memory-bound ops at HBM speed),
    plus the output layer's product spread over the stages as the flat model spreads the
    embeddings (its share max_k L_k / L)."""
    seq, layers = a.sequence(config), slowest_stage_layers(config, pp, a)
    t = layer_time(config, b, seq, tp, a.sequence_parallel, recompute, a.attention_flops,
                   a.matmul_tflops, a.gpu_tb_per_s)
    head = head_seconds(config, b * seq, tp, a.matmul_tflops, a.gpu_tb_per_s) \
        * layers / config.n_layers
    return (layers * (t.forward + t.backward) + head, layers * t.recompute,
            layers * t.backward + head * 2 / 3)


def useful_flops(config, tp, pp, b, a: Assumptions) -> float:
    """FLOPs of one micro-batch on the slowest stage's rank that count as useful work: 6 x
    its parameters x tokens, and the attention scores' when ``attention_flops`` (what the
    flat model's compute part prices)."""
    seq, slowest = a.sequence(config), slowest_stage_scale(config, pp, a)
    flops = 6 * count_parameters(config)["total"] * slowest / (tp * pp) * b * seq
    if a.attention_flops:
        flops += 3 * memory.recompute_flops(config, b * seq, "selective", seq).extra \
            * slowest / (tp * pp)
    return flops


def step_times(config, dp, tp, pp, m, b, links, topology: Topology, a: Assumptions,
               gradient_bytes, recompute=None) -> dict:
    """Seconds per step, part by part (module docstring)."""
    seq = a.sequence(config)
    element = memory.PRECISIONS[a.precision].bytes
    rate = a.mfu * micro_batch_efficiency(config, b, tp, a)
    slowest = slowest_stage_scale(config, pp, a)  # 1 for an even split
    # one micro-batch through the slowest stage: its share of the model's FLOPs for b x seq
    # tokens (1/(tp x pp) of them for an even split), with the attention scores' if counted
    compute = flops_seconds(useful_flops(config, tp, pp, b, a), a.gpu_tflops, rate)
    extra = memory.recompute_flops(config, b * seq, recompute, seq).extra / (tp * pp)
    again = flops_seconds(extra * slowest, a.gpu_tflops, rate)
    backward = compute * 2 / 3
    if a.compute_model == "kernels":
        compute, again, backward = kernel_times(config, tp, pp, b, a, recompute)
    activation = b * seq * config.d_model * element                 # what crosses a boundary
    tensor = backward_tensor = 0.0
    if tp > 1:
        per_all_reduce = allreduce_time(activation, tp, "ring", topology.links[links["tensor"]])
        per_block = 4 + (2 if recompute == "full" else 0)  # full recompute: forward's 2 again
        tensor = per_block * slowest_stage_layers(config, pp, a) * per_all_reduce
        backward_tensor = tensor * (per_block - 2) / per_block
    pipeline = 0.0
    if pp > 1:
        chunks = 2 if a.schedule in memory.V_SCHEDULES else a.virtual_stages
        send = topology.links[links["pipeline"]].time(activation)
        if a.scatter_gather and tp > 1:   # 1/tp per NIC, then an all-gather over NVLink
            send = (topology.links[links["pipeline"]].time(activation / tp)
                    + allreduce_time(activation, tp, "ring", topology.links[links["tensor"]]) / 2)
        pipeline = 2 * chunks * send
    busy = compute + again + tensor + pipeline
    fraction = bubble_fraction(pp, m, a.schedule, a.virtual_stages)
    data = (allreduce_time(gradient_bytes, dp, "ring", topology.links[links["data"]])
            * (1.5 if a.zero == 3 else 1.0) if dp > 1 else 0.0)
    if a.overlap_data_parallel:
        data = exposed_data_parallel(data, backward + again + backward_tensor,
                                     gradient_bytes)
    times = {"compute": m * compute, "recompute": m * again,
             "bubble": m * busy * fraction / (1 - fraction), "tensor": m * tensor,
             "pipeline": m * pipeline, "data": data}
    if a.recompute_options == (None,):  # a search without recompute has no such part
        del times["recompute"]
    return times
