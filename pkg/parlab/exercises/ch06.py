"""Chapter 06 exercises: ZeRO memory, ZeRO traffic, the fewest GPUs, recomputation, an all-reduce in halves.

Each expected answer is computed when the checker runs, from the calculators the notebook
uses (:func:`parlab.memory.model_state_bytes`, :func:`parlab.sharded.zero_bytes_per_rank`)
or from a real run on the toy backend; a wrong answer gets a hint, never the number.
"""

from __future__ import annotations


from parlab.hardware import GPU_MEMORY_GB
from parlab.units import GB
from parlab.exercises.registry import close, exercise, right, wrong
from parlab.memory import model_state_bytes
from parlab.sharded import zero_bytes_per_rank



@exercise("06.1", "A model of 7.5 billion parameters trains with bf16 mixed precision and Adam "
                  "on 64 data-parallel GPUs with ZeRO stage 2. How many GB of model states "
                  "(parameters, gradients, master weights, optimizer state) does each GPU hold?")
def _stage_2_memory(answer):
    psi, n = 7_500_000_000, 64
    value = float(answer)
    by_stage = {k: model_state_bytes(psi, "adam", "bf16", n, k).total / 1e9 for k in range(4)}
    if close(value, by_stage[2], rel=0.02):
        return right("The 2-byte parameters stay whole on every GPU; the gradients and the "
                     "12 bytes of optimizer state per parameter are split 64 ways.")
    if close(value, by_stage[0], rel=0.02):
        return wrong("That is plain data parallelism: every GPU keeps everything. Which parts "
                     "does stage 2 split over the 64 GPUs?")
    if close(value, by_stage[1], rel=0.02):
        return wrong("That splits only the optimizer state. Stage 2 splits one part more.")
    if close(value, by_stage[3], rel=0.02):
        return wrong("That splits the parameters too, which is stage 3.")
    return wrong("Count bytes per parameter: 2 for bf16 weights, 2 for their gradients, and "
                 "K for the fp32 master copy and Adam's two moments. Then divide only the "
                 "parts that stage 2 shards.")


@exercise("06.2", "Our ZeRO-3 run on 4 ranks trains a model whose fp32 parameters take P bytes. "
                  "How many times P does each rank send per step?")
def _stage_3_traffic(answer):
    n = 4
    expected = zero_bytes_per_rank(1.0, n, 3)
    value = float(answer)
    if close(value, expected, rel=0.02):
        return right("Two all-gathers and one reduce-scatter, each sending (N-1)/N of P: half "
                     "as much again as plain data parallelism's all-reduce.")
    if close(value, zero_bytes_per_rank(1.0, n, 0), rel=0.02):
        return wrong("That is an all-reduce's traffic (stages 0 to 2). Stage 3 also frees the "
                     "parameters: when must they come back?")
    if close(value, 3.0, rel=0.02) or close(value, 2.0, rel=0.02):
        return wrong("In a ring collective a rank does not send its whole tensor: it sends "
                     "all but its own 1/N of it.")
    return wrong("List the collectives of one step (before forward, before backward, after "
                 "backward) and what fraction of P each rank sends in each.")


@exercise("06.3", "A 70-billion-parameter model trains with bf16 mixed precision and Adam, "
                  f"ZeRO stage 3, on {GPU_MEMORY_GB} GB GPUs. Counting model states only, "
                  "what is the fewest "
                  "data-parallel GPUs on which it fits?")
def _fewest_gpus(answer):
    psi, capacity = 70_000_000_000, GPU_MEMORY_GB * GB
    fits = lambda n: model_state_bytes(psi, "adam", "bf16", n, 3).total <= capacity  # noqa: E731
    expected = next(n for n in range(1, 10_000) if fits(n))
    try:
        value = int(answer)
    except (TypeError, ValueError):
        return wrong("Give a whole number of GPUs.")
    if value != float(answer):
        return wrong("Give a whole number of GPUs.")
    if value == expected:
        return right("Stage 3 divides every byte of the 16 per parameter, so the GPUs needed "
                     "fall exactly as 1/N. Activations and buffers would need more in practice.")
    if value < expected:
        return wrong(f"On that many GPUs each one still holds more than {GPU_MEMORY_GB} "
                     "GB.")
    if fits(value - 1):
        return wrong("It fits on fewer GPUs than that. Which is the first count that fits?")
    return wrong(f"Count the bytes per parameter first, then divide the whole by "
                 f"{GPU_MEMORY_GB} GB.")


@exercise("06.5", "Write all_reduce_in_halves(t): sum the 1-D tensor t in place over all ranks "
                  "using only dist.reduce_scatter_tensor and dist.all_gather_into_tensor (its "
                  "length is a multiple of the number of ranks).")
def _halves(answer):
    from parlab.comm import run_with_traffic

    if not callable(answer):
        return wrong("Pass your function itself: check('06.5', all_reduce_in_halves).")
    for world_size in (2, 4):
        results, log = run_with_traffic(_try_halves, world_size, answer)
        ops = {r.op for r in log.records}
        error = max(results)
        if "all_reduce" in ops:
            return wrong("The point is to do without all_reduce: use the other two collectives.")
        if error > 1e-5:
            return wrong(f"On {world_size} ranks the result differs from the sum by {error:.2g}. "
                         f"Each rank gets one reduced slice first; then everyone needs every slice.")
        ring = 2 * (world_size - 1) * 4 * 8 * world_size    # bytes of an all-reduce, all ranks
        if log.total_bytes() != ring:
            return wrong(f"The sum is right, but on {world_size} ranks the ranks sent "
                         f"{log.total_bytes()} bytes where a ring all-reduce sends {ring}. "
                         f"Use one reduce-scatter and one all-gather, nothing else.")
    return right("A reduce-scatter and an all-gather are the two halves of a ring all-reduce, "
                 "which is why ZeRO stages 1 and 2 cost no more traffic than plain data "
                 "parallelism: they only split the halves apart.")


def _try_halves(fn):
    """Rank side of 06.5: a float tensor of 8 per rank, summed; returns the largest error."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    make = lambda r: torch.randn(8 * world, generator=torch.Generator().manual_seed(r))  # noqa: E731
    t = make(rank)
    expected = sum(make(r) for r in range(world))
    fn(t)
    return float((t - expected).abs().max())


@exercise("06.4", "Full activation recomputation re-runs every layer's forward pass during the "
                  "backward pass. By what factor does it multiply a step's FLOPs (forward 2, "
                  "backward 4 FLOPs per parameter per token)?")
def _recompute_factor(answer):
    forward, backward = 2, 4
    expected = (2 * forward + backward) / (forward + backward)
    value = float(answer)
    if close(value, expected, rel=0.01):
        return right("One more forward on top of forward and backward: a third more compute, "
                     "paid to keep only each layer's input instead of all it saves.")
    if close(value, 2.0, rel=0.02):
        return wrong("Recomputation repeats the forward pass only, not the backward pass.")
    if close(value, expected - 1, rel=0.01):
        return wrong("That is the extra share; the question asks for the factor on the total.")
    return wrong("Add one forward pass to a step of forward plus backward, and compare.")
