"""Interleaved 1F1B's memory: how much of a stage's activations a rank holds at its peak.

Why this module exists: Narayanan et al. (2021, section 2.2.2) give each of the pp ranks v
model chunks (rank r holds chunks r, r + pp, r + 2 pp, ...), so a micro-batch visits every
rank v times and the bubble shrinks v-fold. The price is memory: a rank starts more forwards
before its first backward. :func:`interleaved_peak` counts the (chunk, micro-batch) pairs a
rank holds at once, as the schedule of :func:`parlab.pipeline.schedule` ("interleaved",
PyTorch's ``ScheduleInterleaved1F1B`` order) runs them: rank r warms up with
(v - 1) x per_round + 2 (pp - 1 - r) forwards (per_round = pp when m is a multiple of pp,
m when m < pp), then holds one more until its first backward, never more than all m v
pairs. Each pair holds 1/v of a stage, so rank 0 holds (v pp + pp - 1) / v stages' worth
= pp (1 + (pp - 1)/(v pp)) micro-batches, Korthikanti et al.'s (2022, section 4.2.3)
count; 1F1B's first stage holds pp. The two ends of the model are not spread over chunks:
the embedding's output (chunk 0, rank 0) and the head's logits (the last chunk, rank pp - 1)
are held for as many micro-batches as 1F1B holds there (rank 0 runs a round of pp forwards
of chunk 0 before any of chunk pp, as 1F1B's first stage runs pp; the last chunk runs each
backward right after its forward), so :func:`held_bytes` counts them so. The tests hold these counts to the simulator's
``peak_inflight``.

Which (pp, m, v) the schedule runs (:func:`interleave_problem`): the layers of a rank cut
into v equal chunks (layers divisible by pp x v), and the micro-batches in equal rounds
(m <= pp, or m a multiple of m // pp: the simulator's rule, looser than the paper's "m a
multiple of pp").
"""

from __future__ import annotations

from parlab.checks import check_count

__all__ = ["interleaved_peak", "interleave_problem", "held_bytes"]


def _per_round(pp: int, m: int) -> int:
    return m // max(1, m // pp)


def interleave_problem(schedule: str, pp: int, microbatches: int, virtual_stages: int,
                       layers: int | None) -> str:
    """Why ``virtual_stages`` chunks per rank cannot run, or '' when they can (v = 1 always can)."""
    v, m = virtual_stages, microbatches
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        return f"virtual_stages must be a positive int (model chunks per rank), got {v!r}"
    if v == 1:
        return ""
    if schedule != "1f1b":
        return (f"virtual_stages={v} interleaves 1F1B; schedule={schedule!r} holds one chunk "
                f"per rank (use schedule='1f1b' or virtual_stages=1)")
    if layers is not None and layers % (pp * v):
        return (f"virtual_stages={v}: the {layers} layers on pp={pp} ranks do not cut into "
                f"{v} equal chunks per rank; pp x virtual_stages must divide {layers}")
    if m % max(1, m // pp):
        return (f"interleaved 1F1B runs the micro-batches in {m // pp} equal rounds, and "
                f"microbatches={m} is not a multiple of {m // pp}; use a multiple of pp={pp}, "
                f"or at most {pp} micro-batches")
    return ""


def interleaved_peak(pp: int, microbatches: int, virtual_stages: int, rank: int = 0) -> int:
    """The most (chunk, micro-batch) pairs rank ``rank`` holds at once in interleaved 1F1B
    (module docstring); with one chunk per rank, 1F1B's min(pp - rank, m) micro-batches."""
    for name, value in (("pp", pp), ("microbatches", microbatches),
                        ("virtual_stages", virtual_stages)):
        check_count(name, value)
    m, v = microbatches, virtual_stages
    if v == 1:
        return min(pp - rank, m)
    return min((v - 1) * _per_round(pp, m) + 2 * (pp - 1 - rank) + 1, m * v)


def held_bytes(s, stage: int, kept: int, ends: int) -> int:
    """Activation bytes pipeline ``stage`` of job ``s`` (a :class:`~parlab.memory.Setup`)
    holds at its peak: ``kept`` bytes per micro-batch through the whole stage, ``ends`` of
    them the embedding's or the head's (module docstring)."""
    return round(s.held(stage) * (kept - ends)) + s.in_flight(stage) * ends
