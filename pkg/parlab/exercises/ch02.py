"""Chapter 02 exercises: predict the buckets, the ring's bytes and a layer's traffic before the
notebook prints them, then write the averaging step yourself.

Every expected answer is computed when a checker runs, from the model and formulas the
notebook itself uses (:data:`parlab.experiments.FIGURE_8_2`,
:func:`parlab.data_parallel.make_buckets`, :func:`parlab.comm.allreduce_bytes_per_rank`);
a wrong answer gets a hint about which quantity to think about, never the number. The
worked solutions are in :mod:`parlab.exercises.ch02_solutions`, which the notebook does not
import: a reader opens it by choice.
"""

from __future__ import annotations

from parlab.exercises.registry import close, exercise, number, right, wrong

#: 02.1: the bucket cap; 02.2: the ring's size; 02.3: the layer (the model's second weight
#: matrix, index 2 among weight, bias, weight, ...) and the batch it is asked about.
_CAP, _RING_GPUS, _LAYER_TENSOR, _BATCH = 200, 4, 2, 64


def _parameters() -> list:
    """The parameter tensors of Figure 8-2's model (layers 4, 6, 6, 2; fp32), in order."""
    from parlab.data_parallel import make_model
    from parlab.experiments import FIGURE_8_2
    return list(make_model(FIGURE_8_2).parameters())


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def _bucket_count() -> int:
    """02.1: all-reduce calls per step with DDP's buckets under a cap of ``_CAP`` bytes."""
    from parlab.data_parallel import make_buckets
    return len(make_buckets(_parameters(), _CAP))


def _buckets_never_over_cap() -> int:
    """02.1's usual slip: a bucket that may never pass the cap (DDP's may, by one tensor)."""
    count, size = 0, None
    for nbytes in map(_nbytes, reversed(_parameters())):
        if size is None or size + nbytes > _CAP:
            count, size = count + 1, 0
        size += nbytes
    return count


def _ring_mean_bytes() -> float:
    """02.2: bytes one GPU sends per step, on average, for the whole gradient on a ring."""
    from parlab.comm import allreduce_bytes_per_rank
    sent = allreduce_bytes_per_rank(sum(map(_nbytes, _parameters())), _RING_GPUS, "ring")
    return sum(sent) / len(sent)


def _layer_bytes() -> int:
    """02.3: bytes rank 0 sends for one weight matrix's all-reduce on a ring of 2."""
    from parlab.comm import allreduce_bytes_per_rank
    return int(allreduce_bytes_per_rank(_nbytes(_parameters()[_LAYER_TENSOR]), 2, "ring")[0])


@exercise("02.1", f"Figure 8-2's model (layers 4, 6, 6, 2: a weight matrix and a bias each, "
                  f"fp32) packs its gradients into buckets with a cap of {_CAP} bytes, the way DDP "
                  f"does: from the last tensor back, each tensor whole, and a bucket closes as "
                  f"soon as it holds the cap or more. How many all-reduce calls does a step make?")
def _buckets(answer):
    params, value, expected = _parameters(), number(answer), _bucket_count()
    if value == expected:
        return right("Whole tensors, last first: each one joins the open bucket, and the bucket "
                     "closes once it reaches the cap, so a bucket can end up over it. Fewer "
                     "calls, the same bytes.")
    if value != int(value) or value < 1:
        return wrong("Give a whole, positive number of all-reduce calls.")
    if value == len(params):
        return wrong("That is one all-reduce per tensor, with no buckets at all. Several small "
                     "tensors fit under the cap together.")
    if value == 1:
        return wrong("One bucket would hold the whole gradient. Add up the tensors' bytes: "
                     "does the bucket reach the cap before the last tensor is in?")
    if value == _buckets_never_over_cap():
        return wrong("That keeps every bucket at or under the cap: a tensor that would push a "
                     "bucket over it starts a new one. DDP adds the tensor first and only then "
                     "looks at the total. When does a bucket close under that rule?")
    if value > len(params):
        return wrong("There cannot be more buckets than tensors.")
    return wrong("Write down each tensor's bytes (a weight is C_out x C_in numbers, a bias "
                 "C_out, 4 bytes each), start from the last one, add each tensor to the open "
                 "bucket, and close the bucket as soon as its total reaches the cap.")


@exercise("02.2", f"Figure 8-2's model syncs its whole gradient (fp32) in one bucket with a "
                  f"ring all-reduce on {_RING_GPUS} GPUs. How many bytes does one GPU send per "
                  f"step, on average over the {_RING_GPUS}?")
def _ring_bytes(answer):
    value, expected = number(answer), _ring_mean_bytes()
    n, size = _RING_GPUS, sum(map(_nbytes, _parameters()))
    if close(value, expected):
        return right("Two passes around the ring, a reduce-scatter and an all-gather, each "
                     "sending N - 1 of the N chunks: 2(N-1)/N of the gradient. Uneven chunks "
                     "make single GPUs differ by a few bytes; the average is exact.")
    if close(value, expected / 4):
        return wrong("Is your answer in numbers or in bytes? Look again at the unit the "
                     "question asks for.")
    if close(value, size):
        return wrong("That is the whole gradient once, what each GPU sends on a ring of 2. "
                     "With more GPUs the ring cuts the gradient into N chunks: count the chunks "
                     "one GPU sends.")
    if close(value, (n - 1) / n * size):
        return wrong("That counts one pass around the ring, the reduce-scatter. A ring "
                     "all-reduce has a second half: what does the all-gather half of the ring "
                     "send?")
    if close(value, (n - 1) * size):
        return wrong("That is what the naive algorithm's root sends. In a ring each GPU only "
                     "forwards chunks of 1/N of the gradient.")
    if close(value, 2 * size):
        return wrong("That is where the ring levels off for very many GPUs. On a ring of only "
                     "a few GPUs, how many of the chunks does one GPU send in each pass?")
    if value > 2 * size:
        return wrong("Each step of the ring sends one chunk (1/N of the gradient), not the "
                     "whole gradient.")
    return wrong("Start from the gradient's bytes (every parameter has a gradient, 4 bytes "
                 "each), cut it into N chunks, and count the chunks one GPU sends in the "
                 "reduce-scatter and in the all-gather.")


@exercise("02.3", f"Figure 8-2's model syncs one all-reduce per tensor on a ring of 2 ranks. For "
                  f"the second layer's weight matrix (6 inputs, 6 outputs, fp32), how many bytes "
                  f"does rank 0 send per step with a batch of {_BATCH} samples?")
def _layer_traffic(answer):
    value, expected = number(answer), _layer_bytes()
    weight = _parameters()[_LAYER_TENSOR]
    c_out, c_in = weight.shape
    if value == expected:
        return right("The gradient has the weight's shape, C_in x C_out, whatever the batch: "
                     "the samples are summed into it before anything is sent. On a ring of 2 "
                     "each rank sends half of it twice, one tensor's worth. A larger batch costs "
                     "computation, not traffic.")
    if value == c_in * c_out:
        return wrong("Is your answer in numbers or in bytes? Look again at the unit the "
                     "question asks for.")
    if value == 2 * expected:
        return wrong("That sends the whole tensor in each of the ring's two passes. How does "
                     "a ring share the work of one pass among its ranks?")
    if value > expected and value % expected == 0:
        return wrong("That grows with the batch. The gradient is summed over the samples "
                     "before it is sent: does its shape depend on how many there were?")
    if value in (_BATCH * c_out * 4, _BATCH * c_in * 4):
        return wrong("That is the size of the layer's activations (batch x neurons), which "
                     "tensor parallelism moves. Data parallelism moves gradients.")
    if value == expected + c_out * 4:
        return wrong("The bias is a tensor of its own, with its own all-reduce. Count the "
                     "weight matrix only.")
    return wrong("Which tensor does data parallelism synchronize for this layer, what is its "
                 "shape, and how much of it does one of 2 ranks send in a ring all-reduce?")


@exercise("02.4", "Write average(grads): on each rank, average a list of gradient tensors in "
                  "place across all ranks with a single all_reduce call (pack them into one "
                  "flat bucket).")
def _write_average(answer):
    from parlab.launch import run
    if not callable(answer):
        return wrong("Pass the function itself: check('02.4', average).")
    for world_size in (2, 3):
        outcome = run(_try_average, world_size, answer, timeout=30)
        for calls, error in outcome:
            if calls != 1:
                return wrong(f"On {world_size} ranks your function called all_reduce {calls} "
                             f"time(s). Concatenate the flattened tensors into one bucket first.")
            if error > 1e-5:
                return wrong(f"On {world_size} ranks the result differs from the average by "
                             f"{error:.2g}. Sum over ranks, divide by their number, and copy "
                             f"each piece back into its tensor.")
    return right("One all-reduce for many tensors: one latency instead of many, the reason "
                 "production frameworks bucket gradients.")


def _try_average(average):
    """Rank side of 02.4: counts all_reduce calls, compares with the true average."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    shapes = [(3, 2), (4,), (2, 2, 2)]
    make = lambda r: [torch.randn(s, generator=torch.Generator().manual_seed(10 * r + i))
                      for i, s in enumerate(shapes)]
    grads = make(rank)
    expected = [sum(parts) / world for parts in zip(*(make(r) for r in range(world)))]
    calls = [0]
    original = dist.all_reduce

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    dist.all_reduce = counted
    try:
        average(grads)
    finally:
        dist.all_reduce = original
    error = max(float((g - e).abs().max()) for g, e in zip(grads, expected))
    return calls[0], error
