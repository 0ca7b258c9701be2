"""Worked solutions to chapter 02's exercises. Open this only once you have tried them.

The notebook never imports this module and nothing else in parlab does: reading it is a
choice. Each solution is worked out by hand from the question: Figure 8-2's model has
layers 4, 6, 6, 2, so the tensors W1 (6 x 4), b1 (6), W2 (6 x 6), b2 (6), W3 (2 x 6) and
b3 (2), every number a 4-byte float; a ring all-reduce on N GPUs cuts a tensor into N
chunks and each GPU sends N - 1 of them in the reduce-scatter and N - 1 in the all-gather.
The checkers compute their answers another way (from the model itself,
:func:`parlab.data_parallel.make_buckets` and :func:`parlab.comm.allreduce_bytes_per_rank`),
so the two must agree.

    from parlab.exercises.ch02_solutions import solutions
    print(solutions()["02.1"])
"""

from __future__ import annotations

import inspect

from parlab.exercises.registry import Solution

__all__ = ["Solution", "solutions", "average"]


#: Figure 8-2's tensors in the model's order: (name, numbers).
_TENSORS = [("W1", 6 * 4), ("b1", 6), ("W2", 6 * 6), ("b2", 6), ("W3", 2 * 6), ("b3", 2)]
_FP32 = 4


def _buckets() -> Solution:
    cap, lines, buckets = 200, [], []
    size = 0
    for name, numbers in reversed(_TENSORS):  # backward makes the last layer's first
        nbytes = numbers * _FP32
        if size == 0:
            buckets.append([])
        buckets[-1].append(name)
        size += nbytes
        if size >= cap:
            lines.append(f"  {name} ({nbytes} B): bucket {len(buckets)} holds {size} B >= {cap}, "
                         f"it closes")
            size = 0
        else:
            lines.append(f"  {name} ({nbytes} B): bucket {len(buckets)} holds {size} B")
    groups = ", ".join("[" + " ".join(b) + "]" for b in buckets)
    return Solution(len(buckets), (
        f"Bytes per tensor: " + ", ".join(f"{n} {k * _FP32}" for n, k in _TENSORS) + ".\n"
        f"From the last tensor back, each tensor joins the open bucket whole, and the bucket "
        f"closes once it holds {cap} B or more:\n" + "\n".join(lines) + "\n"
        f"The last bucket closes when backward has produced every gradient.\n"
        f"Buckets: {groups}, one all-reduce each. The first is over the cap: DDP adds a tensor "
        f"before it compares the total with the cap."))


def _ring_bytes() -> Solution:
    n = 4
    numbers = sum(k for _, k in _TENSORS)
    size = numbers * _FP32
    chunk = size / n
    return Solution(2 * (n - 1) * size // n, (
        f"The gradient has one number per parameter: {' + '.join(str(k) for _, k in _TENSORS)} "
        f"= {numbers} numbers = {size} B.\n"
        f"The ring cuts it into N = {n} chunks of {size} / {n} = {chunk:g} B (on average: "
        f"{numbers} numbers do not split evenly).\n"
        f"Reduce-scatter: each GPU sends N - 1 = {n - 1} chunks; all-gather: {n - 1} more.\n"
        f"2 x {n - 1} x {chunk:g} B = 2(N-1)/N x {size} B."))


def _layer_traffic() -> Solution:
    c_in, c_out, n = 6, 6, 2
    weight = c_in * c_out * _FP32
    return Solution(2 * (n - 1) * weight // n, (
        f"Data parallelism sends the weight's gradient, which has the weight's shape: "
        f"{c_out} x {c_in} = {c_in * c_out} numbers = {weight} B.\n"
        f"The batch (64 or 8) only changes how many samples are summed into it on the rank.\n"
        f"On a ring of N = {n}: each GPU sends N - 1 = 1 chunk of {weight} / {n} B in each of "
        f"the two passes, 2 x {weight // n} B."))


def average(grads):
    """02.4: one flat bucket, one all-reduce, divide by the number of ranks, copy back."""
    import torch
    import torch.distributed as dist

    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)  # the sum over all ranks, the same on every rank
    flat /= dist.get_world_size()
    for g, piece in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(piece.view_as(g))


def _write_average() -> Solution:
    return Solution(average, (
        "Flatten every tensor and concatenate them into one bucket, all-reduce the bucket "
        "once (a sum),\ndivide by the number of ranks, then cut the bucket back into pieces "
        "of each tensor's size and copy\neach piece into its tensor (in place: the caller "
        "keeps its own tensors).\n\n" + inspect.getsource(average)))


def solutions() -> dict[str, Solution]:
    """Every chapter 02 exercise's answer with its working, by exercise id."""
    return {"02.1": _buckets(), "02.2": _ring_bytes(), "02.3": _layer_traffic(),
            "02.4": _write_average()}
