"""Worked solutions to chapter 03's exercises. Open this only once you have tried them.

The notebook never imports this module and nothing else in parlab does: reading it is a
choice. Each solution is worked out by hand from the rule every schedule of the chapter
follows: an action runs in the earliest time step in which its input has arrived, and a
tensor made in step t can be used in step t + 1 (on the last stage, a micro-batch's error
is computed the step after its output). The checkers compute their answers another way,
with the simulator (:mod:`parlab.pipeline`), so the two must agree.

    from parlab.exercises.ch03_solutions import solutions
    print(solutions()["03.1"])
"""

from __future__ import annotations

from fractions import Fraction

from parlab.exercises.registry import Solution

__all__ = ["Solution", "solutions"]


def _gpipe_bubble() -> Solution:
    p, m = 4, 8
    steps = 2 * (m + p - 1)
    busy = 2 * m
    share = Fraction(steps - busy, steps)
    return Solution(share, (
        f"GPipe runs all {m} forwards, then all {m} backwards. The last stage starts its first "
        f"forward in step p = {p}\nand its last forward in step m + p - 1 = {m + p - 1}; the "
        f"backwards come back the same way, so the\nschedule takes 2 (m + p - 1) = {steps} "
        f"steps (the GPipe run printed above the exercise, with m = 4,\ntook 2 (4 + 3) = 14). "
        f"Each GPU is busy in 2m = {busy} of them and idle in\n{steps} - {busy} = "
        f"{steps - busy} = 2 (p - 1): every row of the Gantt chart has the same "
        f"{steps - busy} empty\ncells, whatever m is. The "
        f"idle share of all slots is\n{steps - busy} / {steps} = {share} = (p - 1) / "
        f"(m + p - 1)."))


def _one_f_one_b_memory() -> Solution:
    p, m = 4, 8
    first_error = 2 * p  # micro-batch 1: forward on stages 1..p, its error back to stage 1
    return Solution(p, (
        f"A1 forwards micro-batch 1 in step 1. It reaches the last stage in step {p}, whose "
        f"error is computed\nin step {p + 1} and walks back one stage per step: A1 can run its "
        f"first backward in step {first_error}.\nIn 1F1B A1 does not forward in every step "
        f"until then (that would be {first_error - 1} micro-batches): it runs\njust enough "
        f"forwards to fill the pipeline from itself to the last stage, one per stage,\n"
        f"p = {p}, and waits. "
        f"From its first backward on, it\nalternates one "
        f"backward (freeing a micro-batch) with one forward (adding one), so the count\n"
        f"never rises above {p}, whether m is {m} or 800. (GPipe would hold all m = {m}.)"))


def _interleaved_messages() -> Solution:
    p, m, v = 4, 4, 2
    chunks = p * v
    boundaries = chunks - 1
    return Solution(2 * m * boundaries, (
        f"With v = {v} chunks on each of p = {p} GPUs the model is {chunks} chunks, and chunk k "
        f"lives on GPU k mod p:\nevery pair of neighbouring chunks sits on two different GPUs. "
        f"A micro-batch crosses\n{chunks} - 1 = {boundaries} boundaries forward (an activation "
        f"each) and {boundaries} back (an error each).\n{m} micro-batches x 2 x {boundaries} "
        f"= {2 * m * boundaries} messages. (One chunk per GPU: 2 x {m} x {p - 1} = "
        f"{2 * m * (p - 1)}, the book's run.)"))


def _write_gpipe() -> Solution:
    order = {0: ["0F0", "0F1", None, None, "0B0", "0B1"],
             1: [None, "1F0", "1F1", "1B0", "1B1", None]}
    return Solution(order, (
        "Step 1: rank 0 forwards micro-batch 0. Step 2: rank 0 forwards micro-batch 1, rank 1 "
        "forwards\nmicro-batch 0 (its activation arrived). Step 3: rank 1 forwards micro-batch "
        "1; rank 0 has\nnothing to do. Step 4: rank 1, the last stage, computes micro-batch 0's "
        "error (GPipe: all\nforwards first). Step 5: rank 1 does micro-batch 1's error, rank 0 "
        "micro-batch 0's (its error\narrived). Step 6: rank 0 finishes micro-batch 1. Six steps "
        "= 2 (m + p - 1) with m = p = 2.\n(Rank 1 could run 1F1 and 1B0 in one step, as the book's schedule does, but a GPU does one action per step:\nthat step would be two steps of work, so 6 is the fair minimum.)"))


def solutions() -> dict[str, Solution]:
    """Every chapter 03 exercise's answer with its working, by exercise id."""
    return {"03.1": _gpipe_bubble(), "03.2": _one_f_one_b_memory(),
            "03.3": _interleaved_messages(), "03.4": _write_gpipe()}
