"""Chapter 05's check of the planner against published runs: Narayanan et al. (2021), Table 1.

:func:`published_rows` prices every row with :func:`parlab.hybrid.predict` (the published
layout, the micro-batch size and chunks of the paper's run script, nothing tuned per row) and
returns one :class:`PublishedRow` each: what the paper measured, what the planner predicts,
and the error. :func:`published_table` prints them; the figure ``fig-05-published-runs``
(predicted against published) is registered here.
"""

from __future__ import annotations

from dataclasses import dataclass

from parlab.hybrid import NARAYANAN_2021_TABLE_1, Prediction, predict
from parlab.viz import figure
from parlab.viz.plots import published_figure

__all__ = ["PublishedRow", "published_rows", "published_table", "compute_ceiling",
           "TIME_TOLERANCE"]

#: The one tolerance of issue 31 for a step time (tests/test_published_runs.py).
TIME_TOLERANCE = 0.15


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
    at the planner's assumed speed: mfu x the GPU's peak (the roofline is 1 at these shapes)."""
    a = predict(run).layout.assumptions
    return a.mfu * a.gpu_tflops


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


@figure("fig-05-published-runs", "The planner against Narayanan et al. (2021), Table 1: "
        "achieved TFLOP/s per GPU, predicted against published")
def _published_runs():
    return published_figure(published_rows(), TIME_TOLERANCE, compute_ceiling())
