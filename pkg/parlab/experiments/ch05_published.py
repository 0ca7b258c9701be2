"""Chapter 05's check of the planner against published runs: Narayanan et al. (2021), Table 1,
and Korthikanti et al. (2022), Tables 3 and 5.

:func:`published_rows` prices every row with :func:`parlab.hybrid.predict` (the published
layout, the micro-batch size and chunks of the paper's run script, nothing tuned per row) and
returns one :class:`PublishedRow` each: what the paper measured, what the planner predicts,
and the error. :func:`published_table` prints them; the figure ``fig-05-published-runs``
(predicted against published) is registered here. :func:`korthikanti_rows` and
:func:`korthikanti_table` do the same for Korthikanti et al.'s iteration times, each model
priced twice (full recompute; sequence parallelism + selective recompute) with
:func:`parlab.hybrid.predict_iteration`; :func:`korthikanti_memory_table` sets the same
paper's activation-memory formulas beside the estimate
(:mod:`parlab.hybrid.published_korthikanti_memory`).
"""

from __future__ import annotations

from dataclasses import dataclass

from parlab.hybrid import (
    IterationPrediction, KORTHIKANTI_2022, KORTHIKANTI_TECHNIQUES, memory_comparisons,
    NARAYANAN_2021_TABLE_1, paper_flops, Prediction, predict, predict_iteration
)
from parlab.viz import figure
from parlab.viz.plots import published_figure

__all__ = ["PublishedRow", "published_rows", "published_table", "compute_ceiling",
           "TIME_TOLERANCE", "KorthikantiRow", "korthikanti_rows", "korthikanti_table",
           "MEMORY_TOLERANCE", "korthikanti_memory_table"]

#: The one tolerance of issue 31 for a step time (tests/test_published_runs.py).
TIME_TOLERANCE = 0.15
#: The one tolerance of issue 31 for memory (tests/test_published_korthikanti_memory.py).
MEMORY_TOLERANCE = 0.10


@dataclass(frozen=True)
class PublishedRow:
    """One row of the comparison: the paper's run and the planner's price of it."""

    row: int
    params_billion: float
    layout: str                 # "tp 8 x pp 64 x dp 6, b 1, v 1"
    published_tflops: float     # achieved TFLOP/s per GPU, as published
    predicted_tflops: float     # the planner's, by the paper's FLOP count
    error: float                # (predicted - published) / published step time
    prediction: Prediction

    @property
    def within(self) -> bool:
        return abs(self.error) <= TIME_TOLERANCE


def published_rows(runs=NARAYANAN_2021_TABLE_1) -> list[PublishedRow]:
    """Every run of ``runs`` beside the planner's prediction."""
    out = []
    for n, run in enumerate(runs, start=1):
        p = predict(run)
        layout = (f"tp {run.tp} x pp {run.pp} x dp {run.dp}, b {run.micro_batch}, "
                  f"v {run.virtual_stages}")
        out.append(PublishedRow(n, run.params_billion, layout, run.tflops_per_gpu,
                                p.tflops_per_gpu, p.time_error, p))
    return out


def compute_ceiling(run=NARAYANAN_2021_TABLE_1[-1]) -> float:
    """TFLOP/s per GPU that the paper's FLOPs would reach with no bubble and no communication
    at the model's compute speed: the paper's F over the predicted step's compute and
    recompute parts (priced by their kernels, :mod:`parlab.models.kernels`), on every GPU."""
    p = predict(run)
    seconds = p.layout.times["compute"] + p.layout.times["recompute"]
    return paper_flops(run) / (seconds * run.gpus) / 1e12


def published_table(rows: list[PublishedRow]) -> str:
    """The rows as aligned text: row, parameters, layout, TFLOP/s published and predicted,
    the step-time error and whether it is within the tolerance."""
    lines = [f"{'row':>3}  {'params':>7}  {'layout':<32}  {'published':>9}  {'predicted':>9}  "
             f"{'step error':>10}"]
    for r in rows:
        mark = "" if r.within else "  (miss)"
        lines.append(f"{r.row:>3}  {r.params_billion:>6g}B  {r.layout:<32}  "
                     f"{r.published_tflops:>9g}  {r.predicted_tflops:>9.0f}  "
                     f"{r.error:>+10.0%}{mark}")
    return "\n".join(lines)


@dataclass(frozen=True)
class KorthikantiRow:
    """One model of Korthikanti et al. (2022), Table 5, priced both ways."""

    full: IterationPrediction       # full recompute, no sequence parallelism
    present: IterationPrediction    # sequence parallelism + selective recompute

    @property
    def name(self) -> str:
        return self.full.run.name

    @property
    def published_speedup(self) -> float:
        """Full-recompute time over present-work time, as measured (Table 5)."""
        return self.full.published_s / self.present.published_s

    @property
    def predicted_speedup(self) -> float:
        return self.full.step_time_s / self.present.step_time_s

    def within(self, method: str) -> bool:
        return abs(getattr(self, method).time_error) <= TIME_TOLERANCE


def korthikanti_rows(runs=KORTHIKANTI_2022) -> list[KorthikantiRow]:
    """Every model of ``runs`` priced with full recompute and with the paper's method."""
    return [KorthikantiRow(predict_iteration(run, "full"), predict_iteration(run, "present"))
            for run in runs]


def korthikanti_table(rows: list[KorthikantiRow]) -> str:
    """Two lines per model: the iteration time published and predicted with each method, the
    error, and on the second line the speed-up of the paper's method, published and predicted."""
    lines = [f"{'model':<5}  {'layout':<24}  {'method':<20}  {'published':>9}  "
             f"{'predicted':>9}  {'error':>5}  {'speed-up (pub / pred)':>21}"]
    for r in rows:
        run = r.full.run
        layout = f"tp {run.tp} x pp {run.pp}, b {run.micro_batch}, v {run.virtual_stages}"
        for method, label, first in (("full", "full recompute", True),
                                     ("present", "SP + selective", False)):
            p = getattr(r, method)
            mark = "" if r.within(method) else " (miss)"
            speed = (f"{r.published_speedup - 1:+.0%} / {r.predicted_speedup - 1:+.0%}"
                     if not first else "")
            lines.append(f"{r.name if first else '':<5}  {layout if first else '':<24}  "
                         f"{label:<20}  {p.published_s:>8.2f}s  {p.step_time_s:>8.2f}s  "
                         f"{p.time_error:>+5.0%}  {speed:>21}{mark}")
    return "\n".join(lines)


def korthikanti_memory_table(comparisons=None) -> str:
    """Korthikanti et al.'s activations on the first pipeline stage (Table 2 x equation 5,
    interleaving and section 4.3 included), one line per technique of Table 2 and one column
    per model of Table 3: the paper's GB per GPU, ours (``memory.estimate`` with Megatron's
    dropout, less the layer being recomputed) and the error."""
    comparisons = memory_comparisons() if comparisons is None else comparisons
    models = list(dict.fromkeys(c.run.name for c in comparisons))
    cell = {(c.run.name, c.method): c for c in comparisons}
    lines = [f"{'technique':<16}" + "".join(f"  {m + ' paper / ours GB':>28}" for m in models)]
    for method in KORTHIKANTI_TECHNIQUES:
        row = f"{method:<16}"
        for m in models:
            c = cell[m, method]
            mark = " (miss)" if abs(c.first_stage_error) > MEMORY_TOLERANCE else ""
            row += (f"  {c.paper_first / 1e9:>8.1f} / {c.ours_first / 1e9:>6.1f} "
                    f"{c.first_stage_error:>+6.1%}{mark}").rjust(30)
        lines.append(row)
    return "\n".join(lines)


@figure("fig-05-published-runs", "The planner against Narayanan et al. (2021), Table 1: "
        "achieved TFLOP/s per GPU, predicted against published")
def _published_runs():
    return published_figure(published_rows(), TIME_TOLERANCE, compute_ceiling())
