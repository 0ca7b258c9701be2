"""The slides' trade-offs between pipeline schedules, as numbers: time, bubble, memory, traffic.

:func:`compare` lines up naive, GPipe, 1F1B and interleaved at one (p, m, v): time and bubble
from the simulator, activation memory in bytes (through
:func:`parlab.memory.activation_bytes`) and the tensors sent between stages.
"""

from __future__ import annotations

from dataclasses import dataclass

from parlab import memory
from parlab.checks import check_count
from parlab.models import get_config
from parlab.pipeline.schedules import SCHEDULES, schedule
from parlab.pipeline.simulator import Simulation, simulate
from parlab.units import format_bytes

__all__ = ["compare", "comparison_table", "ScheduleCost", "peak_activation_bytes", "COMPARED",
           "DEFAULT_MODEL", "Tradeoffs", "tradeoffs"]

#: The schedules the comparison lines up (the book's own is GPipe-like: same time as "book").
COMPARED = ("naive", "gpipe", "1f1b", "interleaved")
#: The comparison's default model: one sequence of 2048 tokens per micro-batch, bf16.
DEFAULT_MODEL = "GPT-3 175B"


def peak_activation_bytes(sim: Simulation, stage_bytes) -> list[int]:
    """Per rank, the most activation bytes it holds at once while running ``sim``'s schedule.

    ``stage_bytes(k)`` is what one micro-batch leaves on (virtual) stage ``k`` between its
    forward and its backward. Walks the schedule action by action, as the simulator does
    for the count of in-flight micro-batches.
    """
    p = sim.schedule.stages
    held, peak = [0] * p, [0] * p
    for record in sim.records:
        for rank, action in record.compute:
            held[rank] += stage_bytes(action.stage) * (1 if action.kind == "F" else -1)
            peak[rank] = max(peak[rank], held[rank])
    return peak


@dataclass
class ScheduleCost:
    """One schedule at one (p, m, v): what it costs."""

    name: str
    steps: int
    time: float            # in units of one micro-batch through one whole stage
    bubble_fraction: float
    peak_inflight: int     # most micro-batches (chunk x micro-batch pairs) on one rank
    peak_bytes: int        # most activation bytes on one rank
    transfers: int         # tensors sent between ranks per batch
    error: str = ""        # why this schedule cannot run at this (p, m, v)


def compare(stages: int = 4, microbatches: int = 8, chunks: int = 2, model=DEFAULT_MODEL,
            microbatch_size: int = 1, seq: int = 2048, precision: str = "bf16",
            names=COMPARED) -> list[ScheduleCost]:
    """Naive, GPipe, 1F1B and interleaved (with ``chunks``) side by side.

    Activation bytes come from :func:`parlab.memory.activation_bytes` for ``model``
    (a transformer config name or config) with ``microbatch_size`` sequences of ``seq``
    tokens per micro-batch; the naive schedule pushes all of them at once. A schedule that
    cannot run at these numbers gets a row with ``error`` set instead of failing the rest.
    """
    for arg, value, what in (("stages", stages, "pipeline stages"),
                             ("microbatches", microbatches, "micro-batches per batch"),
                             ("chunks", chunks, "model chunks per rank, for 'interleaved'"),
                             ("microbatch_size", microbatch_size, "sequences per micro-batch"),
                             ("seq", seq, "tokens per sequence")):
        check_count(arg, value, what)  # bad input fails here, not as an error row per schedule
    names = (names,) if isinstance(names, str) else tuple(names)
    unknown = [n for n in names if n not in SCHEDULES]
    if unknown or not names:
        raise ValueError(f"names must be one or more of {sorted(SCHEDULES)}, got {names!r}")
    if precision not in memory.PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of "
                         f"{list(memory.PRECISIONS)}")
    if isinstance(model, str):
        get_config(model)  # an unknown name fails here, not as an error row per schedule
    rows = []
    for name in names:
        v = chunks if name == "interleaved" else 1
        try:
            sim = simulate(schedule(name, stages, microbatches, v))
            batch = microbatch_size * (microbatches if name == "naive" else 1)
            cache: dict[int, int] = {}

            def stage_bytes(k, batch=batch, pv=stages * v):
                if k not in cache:
                    cache[k] = memory.activation_bytes(model, batch, seq, precision, stage=k,
                                                       pp=pv)
                return cache[k]

            rows.append(ScheduleCost(name, sim.steps, sim.time, round(sim.bubble_fraction, 4),
                                   max(sim.peak_inflight),
                                   max(peak_activation_bytes(sim, stage_bytes)),
                                   len(sim.transfers)))
        except ValueError as exc:
            rows.append(ScheduleCost(name, 0, 0.0, float("nan"), 0, 0, 0, str(exc)))
    return rows


@dataclass
class Tradeoffs:
    """:func:`compare` over many m at one (p, v), and interleaved over many v at one (p, m)."""

    stages: int
    microbatches: int
    chunks: int
    by_m: dict            # {m: {schedule name: ScheduleCost}}, m ascending
    by_v: dict            # {v: ScheduleCost of "interleaved" at v chunks}, v as given


def tradeoffs(stages: int = 4, microbatches: int = 8, chunks: int = 2,
              m_values=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32), v_values=(1, 2, 3, 4)) -> Tradeoffs:
    """The slides' trade-offs as curves: every schedule against m (``microbatches`` included),
    and what interleaving buys and costs against v (at ``microbatches``)."""
    m_values = sorted(set(m_values) | {microbatches})
    by_m = {m: {r.name: r for r in compare(stages, m, chunks)} for m in m_values}
    by_v = {v: compare(stages, microbatches, v, names=("interleaved",))[0] for v in v_values}
    return Tradeoffs(stages, microbatches, chunks, by_m, by_v)


def comparison_table(rows: list[ScheduleCost]) -> str:
    """The rows of :func:`compare` as aligned text (time in micro-batch-stage units)."""
    header = ("schedule", "steps", "time", "bubble", "peak in-flight", "peak activations",
              "transfers")
    body = []
    for r in rows:
        if r.error:
            body.append((r.name, "-", "-", "-", "-", "-", "-"))
        else:
            body.append((r.name, str(r.steps), f"{r.time:g}", f"{r.bubble_fraction:.3f}",
                         str(r.peak_inflight), format_bytes(r.peak_bytes), str(r.transfers)))
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w)
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    notes = [f"{r.name}: {r.error}" for r in rows if r.error]
    return "\n".join([line(header)] + [line(b) for b in body] + notes)

