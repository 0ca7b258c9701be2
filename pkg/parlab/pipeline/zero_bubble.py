"""Schedules that split the backward: ZB-H1, ZBV and DualPipeV, as per-rank programs.

Why the split helps. A stage's backward computes two things: the gradient of its input,
which the previous stage waits for, and the gradient of its weights, which nobody waits
for until the optimizer step. Qi et al. (2024, "Zero Bubble Pipeline Parallelism", §2)
call them B and W; PyTorch writes them ``"I"`` and ``"W"`` (``1I0``, ``1W0``), and keeps
``"B"`` for the full backward, B + W as one pass (chapter 03's backward). Here durations and
closed forms use Qi et al.'s letters, actions PyTorch's codes (see
:class:`parlab.pipeline.schedules.Action`). Running B as soon as its gradient arrives and
W later moves the next stage's wait earlier, and the W's fill the idle slots.

Each generator returns ``{rank: [actions in the order the rank runs them]}``; the
event-driven simulator (:func:`parlab.pipeline.timeline`) puts them in time, so the
bubbles are derived, never typed in. With p ranks and m micro-batches:

* **ZB-H1** (Qi et al. §2.1, Figure 3 top): 1F1B's order, with W after B, except that rank
  s holds back its first s weight gradients and runs them last. Every rank then has p
  micro-batches started whose W has not run (1F1B: p - s), so rank 0, which holds the most,
  keeps 1F1B's peak (a later rank s holds s W's more than 1F1B's rank s). The idle time
  per rank shrinks from 1F1B's (p - 1)(F + B + W) to (p - 1)(F + B - W) while W is no
  longer than F and B; a longer W overfills the gap it was meant for, and the idle time
  becomes (p - 1)(F + B - min(F, B, W)).
* **ZBV** (Qi et al. §6, the V schedule; PyTorch's ``ScheduleZBVZeroBubble``): 2p stages,
  rank r holding stages r and 2p - 1 - r (the "V": the data go down the ranks and back up,
  so the first and the last stage are both on rank 0). Warm-up forwards of both chunks,
  then one F, one B and one W of each chunk in turn, then the B's and W's that remain.
* **DualPipeV** (DeepSeek-V3 report §3.2.1's DualPipe "cut in half", as the DualPipe
  repository's ``dualpipev.py`` and PyTorch's ``ScheduleDualPipeV`` order it): the same V,
  in eight phases (forwards of chunk 0, forwards of both, B-W-F of chunk 1, then pairs
  "forward of one chunk with the full backward of the other", then the backwards, the
  second half of them split into B and W to fill the tail).

**F&B.** DualPipe's pairs overlap a forward of one chunk with a backward of the other so
that one pass's expert all-to-all hides behind the other's computation. Nothing here
models all-to-alls, and CPU ranks have no second stream to overlap on, so by default the
simulator runs a pair as its two passes one after the other, the forward first as PyTorch's
``OVERLAP_F_B`` lists them (F&B = F + B + W, and the forward need not wait for the
backward's gradient). Given a time for F&B (``Durations.overlap``), it runs the pair as
one action, as DeepSeek's code does: it starts once both inputs are there and takes F&B.
"""

from __future__ import annotations

from collections import deque

from parlab.checks import check_count
from parlab.pipeline.schedules import Action

__all__ = ["v_stages", "zb_h1", "zbv", "dualpipe_v", "ZERO_BUBBLE"]


def v_stages(rank: int, ranks: int) -> tuple[int, int]:
    """The two stages rank ``rank`` holds in a V placement on ``ranks`` ranks: r and 2p-1-r."""
    check_count("ranks", ranks, "pipeline ranks")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < ranks:
        raise ValueError(f"rank must be one of 0 to {ranks - 1} on {ranks} ranks, got {rank!r}")
    return rank, 2 * ranks - 1 - rank


def _counts(p, m) -> None:
    check_count("p", p, "pipeline ranks")
    check_count("m", m, "micro-batches per batch")


def zb_h1(p: int, m: int) -> dict[int, list[Action]]:
    """ZB-H1 (Qi et al. 2024, §2.1): 1F1B with W split off, rank s deferring its first s W's."""
    _counts(p, m)
    programs = {}
    for s in range(p):
        warmup = min(p - 1 - s, m)  # as 1F1B
        order = [Action(s, "F", i) for i in range(warmup)]
        waiting: deque[int] = deque()  # micro-batches whose W is held back

        def backward(i):
            order.append(Action(s, "I", i))
            waiting.append(i)
            if len(waiting) > s:  # rank s keeps s weight gradients for the end
                order.append(Action(s, "W", waiting.popleft()))

        for i in range(m - warmup):
            order.append(Action(s, "F", warmup + i))
            backward(i)
        for i in range(m - warmup, m):
            backward(i)
        order += [Action(s, "W", i) for i in waiting]
        programs[s] = order
    return programs


def zbv(p: int, m: int) -> dict[int, list[Action]]:
    """ZBV (Qi et al. 2024, §6; PyTorch's ``ScheduleZBVZeroBubble``) on p ranks, 2p stages.

    Built for at least 2p - 1 micro-batches, as PyTorch builds it; with fewer, the actions
    of the micro-batches that do not exist are left out, as PyTorch leaves them out.
    """
    _counts(p, m)
    n = max(2 * p - 1, m)
    programs = {}
    for r in range(p):
        down, up = v_stages(r, p)  # chunk 0 (going down the ranks), chunk 1 (coming back)
        count = {(stage, kind): 0 for stage in (down, up) for kind in "FIW"}
        order: list[Action] = []

        def run(stage, kind, microbatch=None):
            i = count[(stage, kind)] if microbatch is None else microbatch
            if microbatch is None:
                count[(stage, kind)] += 1
            order.append(Action(stage, kind, i))

        for _ in range(2 * (p - r) - 1):  # warm-up: chunk 0 only
            run(down, "F")
        for _ in range(r):  # both chunks
            run(up, "F")
            run(down, "F")
        for _ in range(p - r):  # chunk 1's first backwards, W at once
            run(up, "F"), run(up, "I"), run(up, "W")
        while count[(up, "F")] < count[(down, "F")] or count[(down, "F")] < n:  # steady
            if count[(down, "F")] < n:
                run(down, "F")
            run(down, "I"), run(down, "W")
            run(up, "F"), run(up, "I"), run(up, "W")
        for _ in range(r):  # cool-down: input gradients first, W's deferred
            run(down, "I"), run(up, "I")
        for _ in range(p - r):
            run(down, "I"), run(down, "W")
        for stage in (up, down):
            while count[(stage, "W")] < count[(stage, "I")]:
                run(stage, "W")
        programs[r] = [a for a in order if a.microbatch < m]
    return programs


def dualpipe_v(p: int, m: int) -> dict[int, list]:
    """DualPipeV (DeepSeek's ``dualpipev.py``; PyTorch's ``ScheduleDualPipeV``), m >= 2p.

    An overlapped pair F&B is one item, the tuple (forward, full backward "B"), as PyTorch's
    ``OVERLAP_F_B`` holds them.
    A backward split into "I" queues its "W"; a "W" step runs the oldest queued one, and
    does nothing when none is queued (as PyTorch; DeepSeek's code asserts there is one).

    Fewer than 2p micro-batches is a ValueError: the first phases alone start 2p forwards
    on the last rank, as DeepSeek's code and PyTorch's ``ScheduleDualPipeV`` require.

    An odd number of ranks is accepted, on purpose. DeepSeek's README asks for an even PP,
    but PP counts *stages*, and a V on p ranks has 2p of them, even for any p; DeepSeek's
    ``dualpipev.py`` and PyTorch's ``ScheduleDualPipeV`` both build and run DualPipeV on 3
    ranks, and so does this one (a test compares its order with PyTorch's on 3 ranks).
    Refusing it would refuse what both reference implementations accept. (The original,
    bidirectional DualPipe, with its two copies of every stage, is the one whose ranks must
    pair up: it is not built here.)
    """
    _counts(p, m)
    if m < 2 * p:
        raise ValueError(f"DualPipeV needs at least 2 x ranks = {2 * p} micro-batches (one per "
                         f"stage of the V), got microbatches={m}")
    programs = {}
    for r in range(p):
        down, up = v_stages(r, p)
        count = {(stage, kind): 0 for stage in (down, up) for kind in "FB"}
        queued: deque[Action] = deque()
        order: list[Action] = []

        def forward(stage):
            order.append(Action(stage, "F", count[(stage, "F")]))
            count[(stage, "F")] += 1

        def backward(stage, split):
            i = count[(stage, "B")]
            count[(stage, "B")] += 1
            order.append(Action(stage, "I" if split else "B", i))
            if split:
                queued.append(Action(stage, "W", i))

        def weight():
            if queued:
                order.append(queued.popleft())

        for _ in range(2 * (p - r - 1)):  # 1: forwards of chunk 0
            forward(down)
        for _ in range(r + 1):  # 2: forwards of both chunks
            forward(down), forward(up)
        for _ in range(p - r - 1):  # 3: B, W, F of chunk 1
            backward(up, True), weight(), forward(up)
        def pair(f_stage, b_stage):  # F&B: one item, the forward and the full backward
            start = len(order)
            forward(f_stage), backward(b_stage, False)
            order[start:] = [tuple(order[start:])]

        for i in range(m - 2 * p + r + 1):  # 4: the main phase, F&B pairs
            if i == 0 and r == p - 1:  # the last rank's first two are not overlapped
                forward(down), backward(up, False)
            else:
                pair(down, up)
            pair(up, down)
        for _ in range(p - r - 1):  # 5: B of chunk 1, then F&B
            backward(up, False)
            pair(up, down)
        split = False
        for i in range(r + 1):  # 6: backwards of both chunks, the second half split
            split = split or (i == (r + 1) // 2 and r % 2 == 1)
            backward(up, split)
            split = split or (i == (r + 1) // 2 and r % 2 == 0)
            backward(down, split)
        for _ in range(p - r - 1):  # 7: W, then B of chunk 0
            weight(), backward(down, True)
        for _ in range(r + 1):  # 8: the W's left
            weight()
        programs[r] = order
    return programs


#: name -> (program generator, placement, one-line description)
ZERO_BUBBLE = {
    "zb-h1": (zb_h1, "loop", "ZB-H1: 1F1B with the weight gradients W deferred to fill the "
                             "bubble, at 1F1B's peak activation memory"),
    "zbv": (zbv, "v", "ZBV: two stages per rank in a V, F, B and W of both chunks in turn"),
    "dualpipev": (dualpipe_v, "v", "DualPipeV: DeepSeek's DualPipe cut in half, on a V"),
}
