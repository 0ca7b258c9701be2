"""Chapter 03's Gantt charts as a reader sees them: the active-GPU percentage above each step
stays readable, also where the interleaved schedule's steps are half as wide.

The geometry is read from the rendered figure (matplotlib's window extents, in pixels), as
chapter 04's figure tests do."""
import matplotlib
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from parlab.pipeline import schedule, simulate  # noqa: E402
from parlab.viz.plots import gantt_figure, step_figure  # noqa: E402


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def label_problems(fig) -> list[str]:
    """Every percentage label that overlaps another, a cell of its chart, or the chart's
    title."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    problems = []
    for n, ax in enumerate(fig.axes):
        labels = [t for t in ax.texts if t.get_text().endswith("%")]
        extents = [t.get_window_extent(renderer) for t in labels]
        cells = [p.get_window_extent(renderer) for p in ax.patches]
        title = ax.title.get_window_extent(renderer)
        for i, (label, extent) in enumerate(zip(labels, extents)):
            where = f"panel {n}, label {i} ({label.get_text()})"
            problems += [f"{where} overlaps label {j}" for j, other in enumerate(extents)
                         if j > i and _overlap(extent, other)]
            problems += [f"{where} overlaps a cell" for cell in cells if _overlap(extent, cell)][:1]
            if _overlap(extent, title):
                problems.append(f"{where} overlaps the title")
    plt.close(fig)
    return problems


def _section_5_charts():
    """The Gantt charts of the notebook's section 5: p = 4, m = 4, v = 2 for interleaved."""
    return [simulate(schedule(name, 4, 4, 2 if name == "interleaved" else 1))
            for name in ("naive", "book", "gpipe", "1f1b", "interleaved")]


def test_section_5_gantt_labels_do_not_overlap():
    sims = _section_5_charts()
    fig = gantt_figure(sims)
    # one label per time step wherever the chart labels its steps; interleaved has 22 steps,
    # each half a time unit wide (v = 2)
    counts = [sum(t.get_text().endswith("%") for t in ax.texts) for ax in fig.axes]
    assert counts[1:] == [11, 14, 14, 22]
    assert label_problems(fig) == []


@pytest.mark.parametrize("name,p,m,v", [("interleaved", 4, 4, 2), ("1f1b", 4, 8, 1),
                                        ("book", 4, 4, 1)])
def test_step_figure_gantt_labels_do_not_overlap(name, p, m, v):
    sim = simulate(schedule(name, p, m, v))
    assert label_problems(step_figure(sim, 1)) == []


def test_the_label_check_finds_overlapping_labels():
    """The check is not blind: labels as they were drawn before (upright text 6 pt wide in
    half-unit columns) overlap, and it says so."""
    fig, ax = plt.subplots(figsize=(4, 1.5))
    ax.set_xlim(0, 16)
    ax.set_ylim(1, -1)
    for k in range(20):
        ax.text(0.25 + 0.5 * k, -0.65, "100%", ha="center", va="bottom", fontsize=6)
    assert any("overlaps label" in problem for problem in label_problems(fig))
