"""Chapter 04's figures as a reader sees them: labels inside their boxes (8-15, 8-18), a colour
scale for the heat maps (8-16), and the steps of 8-18 in the order they can happen.

The geometry is read from the rendered figure (matplotlib's window extents, in pixels), the
order of the collectives from the toy backend's log."""
import matplotlib
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from parlab.models import CONFIGS, count_parameters  # noqa: E402
from parlab.experiments import collective_calls, qkv_example, run_attention  # noqa: E402
from parlab.viz.plots import book_attention_figure, local_qkv_figure, transformer_figure  # noqa: E402
from parlab.viz.plots.tensor_parallel import book_attention_rows  # noqa: E402


def _inside(inner, outer, slack=0.5) -> bool:
    return (inner.x0 >= outer.x0 - slack and inner.x1 <= outer.x1 + slack
            and inner.y0 >= outer.y0 - slack and inner.y1 <= outer.y1 + slack)


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def text_problems(fig) -> list[str]:
    """Every label that crosses the edge of a box: a text whose anchor lies in a box must fit
    inside the smallest such box; a text outside every box must not overlap any."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    problems = []
    for ax in fig.axes:
        boxes = [p.get_window_extent(renderer) for p in ax.patches]
        for text in ax.texts:
            if not text.get_text().strip():  # an arrow drawn by annotate
                continue
            extent = text.get_window_extent(renderer)
            anchor = ax.transData.transform(text.get_position())
            holders = [b for b in boxes if b.contains(*anchor)]
            if holders:
                smallest = min(holders, key=lambda b: b.width * b.height)
                if not _inside(extent, smallest):
                    problems.append(f"{text.get_text()!r} runs over its box")
                others = [b for b in boxes if not b.contains(*anchor)]
            else:
                others = boxes
            problems += [f"{text.get_text()!r} overlaps a box it is not in"
                         for b in others if _overlap(extent, b)][:1]
    plt.close(fig)
    return problems


@pytest.mark.parametrize("name", ["GPT-3 175B", "GPT-2 small", "tiny"])
def test_figure_8_15_labels_fit_their_boxes(name):
    config = CONFIGS[name]
    assert text_problems(transformer_figure(config, count_parameters(config))) == []


def test_the_fit_check_finds_an_overflowing_label():
    fig, ax = plt.subplots(figsize=(4, 2))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 4)
    ax.add_patch(plt.Rectangle((4, 1), 2, 1))
    ax.text(5, 1.5, "a label far too long for its little box", ha="center", va="center")
    ax.add_patch(plt.Rectangle((0, 3), 1, 0.5))
    ax.text(0.2, 3.25 - 1, "outside", fontsize=30)  # outside both, but covering the first
    assert len(text_problems(fig)) == 2


def test_figure_8_16_has_one_labelled_colour_scale_for_all_panels():
    fig = local_qkv_figure(qkv_example())
    images = [im for ax in fig.axes for im in ax.images]
    assert len(images) == 9
    bars = [im.colorbar for im in images if im.colorbar is not None]
    assert len(bars) == 1
    bar = bars[0]
    assert bar.ax in fig.axes and "value" in bar.ax.get_ylabel()
    low, high = bar.mappable.get_clim()
    for im in images:  # every panel on the bar's scale, and the bar spans every value shown
        assert im.get_clim() == (low, high) and im.get_cmap().name == bar.cmap.name
        data = np.asarray(im.get_array())
        assert low <= data.min() and data.max() <= high
    plt.close(fig)


@pytest.fixture(scope="module")
def book_run():
    return run_attention("book", backend="toy")


def test_figure_8_18_backward_gathers_before_it_recomputes(book_run):
    calls = collective_calls(book_run.traffic["backward"])
    rows = book_attention_rows([(c.op, c.wire_bytes) for c in calls], "backward")
    texts = [text for _, text, _ in rows]
    at = {key: next(i for i, t in enumerate(texts) if key in t)
          for key in ("Q slices again", "K slices again", "recompute", "dV (own)",
                      "dQ contributions", "dK contributions", "keep own slice", "dX contributions",
                      "A1: dX")}
    assert at["Q slices again"] < at["recompute"] and at["K slices again"] < at["recompute"]
    assert at["recompute"] < at["dV (own)"] < at["dQ contributions"] < at["keep own slice"]
    assert at["dK contributions"] < at["keep own slice"] < at["dX contributions"] < at["A1: dX"]
    # the collectives keep the log's call order and bytes
    logged = [(c.op.replace("_", "-"), c.wire_bytes) for c in calls]
    drawn = [(t.split(":")[0], n) for kind, t, n in rows if kind == "collective"]
    assert drawn == logged == [("all-gather", 256), ("all-gather", 256), ("all-reduce", 512),
                               ("all-reduce", 512), ("reduce", 384)]


def test_figure_8_18_draws_the_rows_top_to_bottom_and_inside_their_boxes(book_run):
    fig = book_attention_figure(book_run)
    backward = fig.axes[1]
    drawn = [t.get_text() for t in sorted(backward.texts, key=lambda t: t.get_position()[1])]
    calls = [(c.op, c.wire_bytes) for c in collective_calls(book_run.traffic["backward"])]
    expected = [text for _, text, _ in book_attention_rows(calls, "backward")]
    assert [d.split("  (")[0] for d in drawn] == expected  # the y axis points down
    assert text_problems(fig) == []
