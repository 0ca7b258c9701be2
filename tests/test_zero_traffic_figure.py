"""Chapter 06's traffic figure (bytes each rank sends per step, on 2 and 4 ranks): its legend
must not cover the bars or the closed-form ticks.

The geometry is read from the rendered figure (matplotlib's window extents, in pixels); the
bars' heights come from the closed form 2 or 3 x (N-1)/N x P worked out here by hand, the
same values the chapter's logged runs print.
"""
import math

import matplotlib
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from parlab.viz.plots import zero_traffic_figure  # noqa: E402


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def _marker_boxes(ax, collection, renderer):
    """One pixel box per scatter marker: its centre, and half its size (s is points²)."""
    from matplotlib.transforms import Bbox

    sizes = collection.get_sizes()
    centres = collection.get_offset_transform().transform(collection.get_offsets())
    boxes = []
    for i, (x, y) in enumerate(centres):
        half = math.sqrt(sizes[i % len(sizes)]) / 2 * ax.figure.dpi / 72
        boxes.append(Bbox([[x - half, y - half], [x + half, y + half]]))
    return boxes


def legend_problems(fig) -> list[str]:
    """Every legend (the figure's or an axes') that covers a bar or marker of any axes."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    problems = []
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            data = [p.get_window_extent(renderer) for p in ax.patches]
            for collection in ax.collections:
                data += _marker_boxes(ax, collection, renderer)
            hits = sum(_overlap(box, d) for d in data)
            if hits:
                problems.append(f"a legend covers {hits} bars/markers of {ax.get_title()!r}")
    return problems


def _table(parameter_bytes: int = 4 * 1864) -> pd.DataFrame:
    """The rows the chapter's table has, with the bytes from the closed form, by hand: stages
    0-2 send 2 (N-1)/N P per rank and step, stage 3 and FSDP2 3 (N-1)/N P."""
    rows = []
    for n in (2, 4):
        for name, stage in [("ZeRO-0", 0), ("ZeRO-1", 1), ("ZeRO-2", 2), ("ZeRO-3", 3),
                            ("FSDP2", 3)]:
            sent = (3 if stage == 3 else 2) * (n - 1) * parameter_bytes / n
            rows.append({"run": name, "ranks": n, "stage": stage, "sent per step": sent,
                         "closed form": sent})
    return pd.DataFrame(rows)


def test_the_chapter_values_are_the_logged_ones():
    """The hand-made table holds what the chapter prints: 7,456 and 11,184 B on 2 ranks."""
    from parlab.sharded import ZeroSpec

    assert 4 * ZeroSpec().parameters == 4 * (16 * 32 + 32 + 32 * 32 + 32 + 32 * 8 + 8) == 4 * 1864
    table = _table()
    two = table[table.ranks == 2].set_index("run")["sent per step"]
    assert two["ZeRO-0"] == 7456 and two["ZeRO-3"] == 11184
    four = table[table.ranks == 4].set_index("run")["sent per step"]
    assert four["FSDP2"] == 16776


@pytest.mark.parametrize("table", [_table(), _table().assign(**{"sent per step": 1.0,
                                                                  "closed form": 1.0})],
                         ids=["chapter values", "all bars equally tall"])
def test_the_legend_covers_no_bar_and_lies_outside_every_panel(table):
    fig = zero_traffic_figure(table)
    assert legend_problems(fig) == []
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    assert len(legends) == 1  # one legend for both panels
    box = legends[0].get_window_extent(renderer)
    assert legends[0].get_texts()[0].get_text().startswith("closed form")
    for ax in fig.axes:
        assert not _overlap(box, ax.get_window_extent(renderer))  # the axes' data region
        for label in ax.get_xticklabels() + [ax.title]:  # and no run name or panel title
            assert not _overlap(box, label.get_window_extent(renderer)), label.get_text()
    assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1  # inside the saved image
    assert fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1
    plt.close(fig)


def test_the_overlap_check_finds_the_old_placement():
    """The placement this figure used to have, a legend in each panel's upper left corner,
    covers the tall 4-rank bars: the check must see it."""
    fig = zero_traffic_figure(_table())
    for legend in list(fig.legends):
        legend.remove()
    for ax in fig.axes:
        ax.legend(fontsize=8, loc="upper left")
    problems = legend_problems(fig)
    assert any("'4 ranks'" in p for p in problems)
    plt.close(fig)


def test_the_marker_boxes_are_where_the_markers_are():
    fig, ax = plt.subplots(figsize=(4, 3), dpi=100)
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 10)
    points = ax.scatter([5], [5], s=400, marker="_")
    fig.canvas.draw()
    (box,) = _marker_boxes(ax, points, fig.canvas.get_renderer())
    centre = ax.transData.transform((5, 5))
    assert np.allclose([(box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2], centre)
    assert box.width == pytest.approx(20 * 100 / 72)  # sqrt(400) points wide
    plt.close(fig)
