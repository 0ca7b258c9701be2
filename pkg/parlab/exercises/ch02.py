"""Chapter 02 exercises: averaging, ring traffic, traffic per layer, and writing the sync.

The expected answers are computed when a checker runs (from the same quantities the
notebook uses), and a wrong answer gets the reason it is wrong, never the number.
"""

from __future__ import annotations


from parlab.exercises.registry import close, exercise, right, wrong



@exercise("02.1", "Four ranks each hold 8 samples of a 32-sample batch and each computes the "
                  "mean loss over its own samples. After the all-reduce has summed their "
                  "gradients, what must each rank divide the sum by, so that the update equals "
                  "one process training on the mean loss over all 32 samples?")
def _divide_by(answer):
    ranks, per_rank = 4, 8
    value = float(answer)
    if value == ranks:
        return right("Each local gradient is already a mean over its own samples; the sum of "
                     "the ranks' means is as many times too large as there are ranks.")
    if value == ranks * per_rank:
        return wrong("That would divide by the samples twice: each rank's loss is already a "
                     "mean over its own samples.")
    if value == per_rank:
        return wrong("The samples per rank are already divided out by each rank's mean loss. "
                     "What else does the sum add up?")
    if value == 1:
        return wrong("Without a division the step is too large: the sum adds several means.")
    return wrong("Write the mean over 32 samples as an average of the four ranks' means.")


@exercise("02.2", "Eight GPUs synchronize 1.2 GB of gradients with a ring all-reduce. How many "
                  "GB does each GPU send per step?")
def _ring_bytes(answer):
    n, gradient_gb = 8, 1.2
    expected = 2 * (n - 1) / n * gradient_gb
    value = float(answer)
    if close(value, expected):
        return right("The ring sends almost the whole gradient twice: once while reducing "
                     "(reduce-scatter), once while sharing (all-gather), each time all but "
                     "one of the N chunks.")
    if close(value, gradient_gb) or close(value, (n - 1) / n * gradient_gb):
        return wrong("That is one pass around the ring. An all-reduce needs a reducing pass "
                     "and a sharing pass.")
    if close(value, (n - 1) * gradient_gb) or close(value, 2 * (n - 1) * gradient_gb):
        return wrong("That is what the root of the naive algorithm sends. In a ring each "
                     "rank forwards chunks of 1/N of the gradient.")
    if close(value, 2 * gradient_gb):
        return wrong("Close: count the chunks a rank sends in each pass; there are N chunks "
                     "and N-1 steps per pass.")
    return wrong("Cut the gradient into N chunks; count the chunks one rank sends in the "
                 "reduce-scatter and in the all-gather.")


@exercise("02.3", "A fully connected layer has C_in = 1024 inputs and C_out = 4096 outputs (fp32 "
                  "weights; ignore the bias). The batch grows from 32 to 256 samples per GPU. "
                  "How many bytes does data parallelism synchronize for this layer per step?")
def _bytes_per_layer(answer):
    c_in, c_out, dtype_bytes, old, new = 1024, 4096, 4, 32, 256
    expected = c_in * c_out * dtype_bytes
    value = float(answer)
    if value == expected:
        return right("The gradient has the shape of the weights, C_in x C_out, whatever the "
                     "batch: a larger batch costs more computation, not more traffic.")
    if value in (expected * new / old, expected * new, expected * old):
        return wrong("The gradient is summed over the samples before it is sent. Does its "
                     "shape depend on the batch?")
    if value == c_in * c_out:
        return wrong("That counts numbers; the question asks for bytes (fp32).")
    if value in (new * c_out * dtype_bytes, new * c_in * dtype_bytes, old * c_out * dtype_bytes):
        return wrong("That is the size of activations, which tensor parallelism moves. Data "
                     "parallelism moves gradients.")
    return wrong("Which tensor does data parallelism synchronize, and what is its shape?")


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
