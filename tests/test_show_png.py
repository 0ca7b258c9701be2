"""parlab.viz.style.png draws a figure once and cuts it as savefig(bbox_inches="tight") does;
an explorer under a figure the page already shows does not draw it again."""
import io

import matplotlib

matplotlib.use("agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from PIL import Image  # noqa: E402

from parlab.viz.style import png  # noqa: E402


def _savefig_tight(fig) -> np.ndarray:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    return np.asarray(Image.open(buffer).convert("RGBA"), dtype=float)


def _figure(kind: str):
    if kind == "edge to edge":  # drawn up to the canvas's edges: the padding lies outside it
        fig = plt.figure(figsize=(3, 2), facecolor="#f0e0d0")
        ax = fig.add_axes((0, 0, 1, 1))
        ax.imshow([[0, 1, 2], [2, 1, 0]])
        ax.set_axis_off()
        return fig
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1, 2], [2, 0, 1], label="a line")
    ax.set_title("a title that is wide enough")
    ax.set_xlabel("x")
    if kind == "legend outside":  # drawn past the figure's right edge: savefig widens it
        ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5))
    else:
        fig.tight_layout()
    return fig


@pytest.mark.parametrize("kind", ["inside", "edge to edge", "legend outside"])
def test_png_is_the_tight_savefig_image(kind):
    fig = _figure(kind)
    reference = _savefig_tight(fig)
    if kind != "legend outside":  # the one-draw way, not savefig's
        fig.savefig = None
    ours = np.asarray(Image.open(io.BytesIO(png(fig))).convert("RGBA"), dtype=float)
    plt.close(fig)
    # the same picture: the size within a pixel (rounding of the cut), and the pixels alike
    assert abs(ours.shape[0] - reference.shape[0]) <= 1
    assert abs(ours.shape[1] - reference.shape[1]) <= 1
    rows, cols = min(ours.shape[0], reference.shape[0]), min(ours.shape[1], reference.shape[1])
    difference = np.abs(ours[:rows, :cols] - reference[:rows, :cols]).mean()
    assert difference < 2, difference  # of 255; the whole image one pixel off: about 4


def test_png_of_a_figure_without_a_pyplot_canvas():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(2, 2))
    fig.add_subplot().plot([0, 1])
    assert png(fig).startswith(b"\x89PNG")


@pytest.mark.parametrize("shown_above", [False, True])
def test_an_explorer_draws_its_default_view_once_or_not_where_the_page_shows_it(shown_above):
    import ipywidgets as w

    from parlab.viz import explore

    calls = []

    def draw(n):
        calls.append(n)
        fig, ax = plt.subplots(figsize=(2, 2))
        ax.plot(range(n))
        return fig

    slider = w.IntSlider(value=2, min=1, max=5)
    explorer = explore(draw, {"n": slider}, "a line of n points", shown_above=shown_above)
    assert calls == ([] if shown_above else [2])
    live = explorer.widget.children[1]
    said = "".join(o.get("text", "") for o in live.outputs)
    assert ("move a control" in said) == shown_above
    slider.value = 3  # a moved control draws in the live output, either way
    assert calls[-1] == 3 and len(calls) == (1 if shown_above else 2)
