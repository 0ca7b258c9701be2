"""Chapter 09 exercises: ZB-H1's idle time per rank, and DualPipeV's peak activations.

Each expected answer is computed when the checker runs, by the event-driven simulator
(:func:`parlab.pipeline.timeline`) on the exercise's schedule; a wrong answer gets a hint,
never the number, and the classic slips get a hint of their own.
"""

from __future__ import annotations

from parlab.exercises.registry import close, exercise, number, right, wrong
from parlab.pipeline import Durations, program, timeline

#: Exercise 09.1's pipeline: ZB-H1 on 4 ranks, 8 micro-batches, F, B, W per stage in ms.
RANKS_09_1, MICROBATCHES_09_1, PASSES_09_1 = 4, 8, Durations(2.0, 2.0, 1.0)
#: Exercise 09.2's pipeline: DualPipeV on 4 ranks with 8 micro-batches.
RANKS_09_2, MICROBATCHES_09_2 = 4, 8


@exercise("09.1", "ZB-H1 on 4 ranks with 8 micro-batches; one rank's stage takes F = 2 ms "
                  "forward, B = 2 ms for the input gradient and W = 1 ms for the weight "
                  "gradient. How many ms does each rank idle per batch?")
def _zb_h1_idle(answer):
    idle = timeline(program("zb-h1", RANKS_09_1, MICROBATCHES_09_1), PASSES_09_1).idle
    expected, value = idle[0], number(answer)
    f, b, w = PASSES_09_1[:3]
    p = RANKS_09_1
    if close(value, expected, rel=1e-6):
        return right("Each rank still waits for p - 1 = 3 stages to fill and drain, but a "
                     "deferred W fills part of each gap: (p - 1)(F + B - W).")
    if close(value, (p - 1) * (f + b + w), rel=1e-6):
        return wrong("That is 1F1B's idle time: there the whole backward B + W sits on the "
                     "path of the gradient. In ZB-H1, which of the three passes waits?")
    if close(value, (p - 1) * (f + b), rel=1e-6):
        return wrong("Right that W no longer delays the gradient; but the W's do not just "
                     "leave the gap: they run in it. Subtract what they fill.")
    if close(value, f + b - w, rel=1e-6):
        return wrong("That is one gap. How many stages' worth of waiting does a rank see "
                     "while the pipeline fills and drains?")
    if close(value, expected / (MICROBATCHES_09_1 * (f + b + w) + expected), rel=1e-6):
        return wrong("That is a fraction of the time; the question asks for milliseconds.")
    return wrong("Start from 1F1B's (p - 1)(F + B + W) and ask which pass no other rank "
                 "waits for, and where it can run instead.")


@exercise("09.2", "DualPipeV on 4 ranks with 8 micro-batches, each rank holding two of the "
                  "8 stages of the V. A (stage, micro-batch) pair holds its activations from "
                  "its F until its backward is complete (its W, where B and W are split). At "
                  "most how many pairs does the busiest rank hold at once?")
def _dualpipe_v_peak(answer):
    t = timeline(program("dualpipev", RANKS_09_2, MICROBATCHES_09_2))
    expected, value = max(t.peak_inflight), number(answer)
    p = RANKS_09_2
    if value == expected:
        return right("2p + 1: 2p pairs in flight, as ZBV, and one more while an F&B pair's "
                     "forward runs before its backward frees a micro-batch (DeepSeek's table "
                     "writes PP + 1, with PP = 2p stages). Each V stage is half a rank's "
                     "layers: 4.5 times one rank's activations, half more than 1F1B's first "
                     "rank.")
    if value == 2 * p:
        return wrong("That is ZBV's peak, 2p. In DualPipeV's middle phase a rank runs a "
                     "forward and a backward as one pair (F&B), the forward first: what does "
                     "it hold just before the backward of the pair frees its micro-batch?")
    if value == p:
        return wrong("That is 1F1B's peak on its first rank, counted in whole ranks' stages. "
                     "Here count pairs of the V: each rank holds two stages.")
    if close(value, expected / 2, rel=1e-6):
        return wrong("That is the peak in units of a whole rank's stage (a V stage is half). "
                     "The question counts (stage, micro-batch) pairs.")
    if value == 2 * MICROBATCHES_09_2:
        return wrong("That would hold every micro-batch of both stages at once, as GPipe "
                     "does; DualPipeV starts backwards long before the last forward.")
    return wrong("Follow rank 0: count its forwards before its first backward, then watch "
                 "what the F&B pairs of the middle phase add before they free.")
