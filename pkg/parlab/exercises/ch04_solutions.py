"""Worked solutions to chapter 04's exercises. Open this only once you have tried them.

The notebook never imports this module and nothing else in parlab does: reading it is a
choice. Each solution is worked out by hand, step by step, from the sizes in the question
and the cost of a ring collective (on N GPUs, all together: an all-gather or a
reduce-scatter sends N - 1 pieces of size S/N per GPU, (N - 1) S in all; an all-reduce is
both, 2 (N - 1) S; a broadcast from one GPU sends S to each of the other N - 1). The
checkers compute their answers another way (from :mod:`parlab.tensor_parallel.counting`),
so the two must agree.

    from parlab.exercises.ch04_solutions import solutions
    print(solutions()["04.2"])
"""

from __future__ import annotations

from parlab.exercises.registry import Solution

__all__ = ["Solution", "solutions"]


#: The chapter's small runs: batch 2 x 4 tokens x d_model 8 on 2 GPUs; X holds 4-byte floats.
_BATCH, _SEQ, _D, _GPUS = 2, 4, 8, 2
_X = _BATCH * _SEQ * _D * 4
_SHAPE = f"{_BATCH} x {_SEQ} x {_D} floats = {_X} B"


def _ring(n: int, size: int, op: str) -> int:
    """Bytes all GPUs of a ring of ``n`` send together for one collective on ``size`` bytes."""
    return {"broadcast": (n - 1) * size, "all_gather": (n - 1) * size,
            "all_reduce": 2 * (n - 1) * size}[op]


def _attention_share() -> Solution:
    d, tp = 12288, 8
    whole = 4 * d * d
    return Solution(whole // tp, (
        f"Each of W_Q, W_K, W_V, W_O is d_model x d_model = {d:,} x {d:,} = {d * d:,}.\n"
        f"The four make {whole:,}. Tensor parallelism cuts every one of them into {tp} equal "
        f"pieces\n(W_Q, W_K, W_V by heads, W_O by input features), so one GPU holds "
        f"{whole:,} / {tp}."))


def _mlp_forward() -> Solution:
    return Solution(_ring(_GPUS, _X, "all_reduce"), (
        f"Nothing moves between fc1 and fc2: each GPU's slice of the hidden layer is exactly\n"
        f"the slice of fc2's input its rows of fc2 need. The one forward collective is the\n"
        f"all-reduce of fc2's partial outputs, which have the input's shape: {_SHAPE}.\n"
        f"A ring all-reduce on {_GPUS} GPUs sends 2 (N - 1) x S in all = "
        f"2 x {_GPUS - 1} x {_X}. (d_ff never enters.)"))


def _book_forward() -> Solution:
    parts = [("broadcast of X from A1", _ring(_GPUS, _X, "broadcast")),
             ("all-gather of Q", _ring(_GPUS, _X, "all_gather")),
             ("all-gather of K", _ring(_GPUS, _X, "all_gather")),
             ("all-reduce of the partial outputs of W_O", _ring(_GPUS, _X, "all_reduce"))]
    lines = "\n".join(f"  {what}: {b} B" for what, b in parts)
    return Solution(sum(b for _, b in parts),
                    f"X, Q, K and the output all have {_SHAPE}. On {_GPUS} GPUs:\n{lines}")


def _rail_bytes() -> Solution:
    batch, widths, rails = 4, (6, 4), 2
    sends = [(hop, batch * w * 4) for hop, w in zip(("H1 -> H2", "H2 -> Out"), widths)]
    lines = "\n".join(f"  {hop}: {b} B on each of the {rails} rails" for hop, b in sends)
    return Solution(rails * sum(b for _, b in sends), (
        "After its all-gather (NVLink, inside the server) every GPU of a stage holds the "
        "stage's whole\noutput, and sends it to the next stage's GPU on its own rail. The "
        "output layer sends nothing on.\nMicro-batches split the same bytes into more "
        f"messages.\n{lines}"))


def _break_even() -> Solution:
    c_in, c_out, n = 64, 96, 2
    data = _ring(n, c_in * c_out * 4, "all_reduce")
    # reduce-output: all-reduce of the outputs (B x C_out) forward, all-gather of the input
    # gradient (B x C_in) backward: per sample
    per_sample = _ring(n, c_out * 4, "all_reduce") + _ring(n, c_in * 4, "all_gather")
    return Solution(data // per_sample, (
        f"Data parallelism: one all-reduce of the weight gradient, {c_in} x {c_out} x 4 B, "
        f"= {data} B per step, whatever B.\nReduce-output: forward, an all-reduce of the "
        f"partial outputs (B x {c_out} x 4 B); backward, an all-gather\nof the input gradient "
        f"(B x {c_in} x 4 B): {per_sample} B per sample.\n"
        f"{per_sample} x B <= {data} holds up to B = {data} / {per_sample}, rounded down. "
        f"(The slide's count, B x C_in <= C_in x C_out,\nwould say up to C_out = {c_out}.)"))


def solutions() -> dict[str, Solution]:
    """Every chapter 04 exercise's answer with its working, by exercise id."""
    return {"04.1": _attention_share(), "04.2": _mlp_forward(), "04.3": _book_forward(),
            "04.4": _rail_bytes(), "04.5": _break_even()}
