"""The shared look of every picture: one colour per GPU name and per rank, and how a figure is shown.

Colours are fixed per GPU name (A1 is the same blue in every chapter) so a reader can follow
one GPU from figure to figure.
"""

from __future__ import annotations

__all__ = ["GPU_COLORS", "RANK_COLORS", "TAB10_COLORS", "rank_color", "microbatch_color", "show",
           "png", "figure_title"]

#: One colour per GPU name, used by every chapter so A1 looks the same everywhere.
GPU_COLORS = {
    "A1": "#4C72B0", "A2": "#55A868", "A3": "#8172B2", "B1": "#C44E52", "B2": "#DD8452",
    "B3": "#937860", "C1": "#64B5CD", "C2": "#8C8C8C", "C3": "#CCB974", "C4": "#DA8BC3",
}

#: matplotlib's "tab10" palette as RGB triples, the very values ``plt.get_cmap("tab10").colors``
#: gives, written out so that a plot module need not import matplotlib to name them: one per
#: micro-batch in every Gantt chart, one per owner in chapter 08's pictures.
TAB10_COLORS = tuple(tuple(int(code[i:i + 2], 16) / 255 for i in (1, 3, 5)) for code in (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf"))
RANK_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B2", "#937860", "#DA8BC3",
               "#8C8C8C", "#CCB974", "#64B5CD"]


def rank_color(rank: int) -> str:
    """A stable colour for a rank number."""
    return RANK_COLORS[rank % len(RANK_COLORS)]


def microbatch_color(microbatch: int) -> tuple:
    """A micro-batch's colour in every pipeline chart (Gantt charts, timelines, traces)."""
    return TAB10_COLORS[microbatch % len(TAB10_COLORS)]


def show(fig, caption: str | None = None) -> None:
    """Display a figure once and close it; return None so a notebook cell shows nothing more.

    A cell that ends with a Figure object shows it twice under nbval (which runs cells
    without history, so a trailing ``;`` does not hide the return value). Displaying
    explicitly and closing avoids that everywhere. The figure's title (:func:`figure_title`)
    and ``caption`` travel in the output's metadata: the book site uses the title as the
    image's alternative text and prints a caption under the figure only where one is given
    that says more than the title drawn in the image. The image is :func:`png`'s; the text
    face is the figure's own (``<Figure size ... with N Axes>``), as when a figure is displayed.
    """
    import matplotlib.pyplot as plt
    from IPython.display import display

    meta = {"title": figure_title(fig)} if figure_title(fig) else {}
    if caption:
        meta["caption"] = caption
    display(_Rendered(png(fig), repr(fig)), metadata={"parlab": meta} if meta else None)
    plt.close(fig)


class _Rendered:
    """A drawn figure as the display system sees it: its PNG and its plain-text face."""

    def __init__(self, data: bytes, text: str):
        self.data, self.text = data, text

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"image/png": self.data, "text/plain": self.text}


def png(fig, pad_inches: float | None = None, dpi: float | None = None,
        metadata: dict | None = None) -> bytes:
    """``fig`` as PNG bytes, cut to what it draws plus ``pad_inches`` (rc ``savefig.pad_inches``
    by default): the image ``savefig(bbox_inches="tight")`` and Jupyter's inline display make.

    They draw the figure twice, once without output to measure it and once for real (up to a
    third of a figure's display time). Here it is drawn once, measured with the
    renderer that drew it, and the pixels are cut out (padding past the canvas's edge takes
    the background colour). A figure that draws past its own edges (a legend outside the
    axes) goes savefig's way, which enlarges the canvas to show it.
    ``dpi`` (the figure's own by default) and ``metadata`` (PNG text chunks) as for savefig.
    """
    import io

    import matplotlib as mpl
    import matplotlib.image
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    pad = mpl.rcParams["savefig.pad_inches"] if pad_inches is None else pad_inches
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    own_dpi = fig.dpi
    buffer = io.BytesIO()
    try:
        fig.dpi = own_dpi if dpi is None else dpi
        canvas.draw()
        width, height = canvas.get_width_height(physical=True)
        drawn = fig.get_tightbbox(canvas.get_renderer()).transformed(fig.dpi_scale_trans)
        if min(drawn.x0, drawn.y0, width - drawn.x1, height - drawn.y1) < -0.5:  # past an edge
            fig.savefig(buffer, format="png", bbox_inches="tight", pad_inches=pad, dpi=fig.dpi,
                        metadata=metadata)
        else:
            matplotlib.image.imsave(buffer, _cut(canvas, drawn.padded(pad * fig.dpi), fig),
                                    format="png", dpi=fig.dpi, metadata=metadata)
    finally:
        fig.dpi = own_dpi
    return buffer.getvalue()


def _cut(canvas, box, fig):
    """The pixels of ``box`` (display units, y up) from the drawn ``canvas``; where the box
    reaches past the canvas (the padding around a figure drawn up to its edge), the figure's
    background colour, as savefig paints it over its enlarged canvas."""
    import numpy as np
    from matplotlib.colors import to_rgba_array

    width, height = canvas.get_width_height(physical=True)
    left, right = round(box.x0), round(box.x1)
    top, bottom = round(height - box.y1), round(height - box.y0)
    pixels = np.asarray(canvas.buffer_rgba())
    background = (to_rgba_array(fig.get_facecolor())[0] * 255).round().astype(np.uint8)
    out = np.empty((bottom - top, right - left, 4), np.uint8)
    out[:] = background
    rows, cols = slice(max(top, 0), min(bottom, height)), slice(max(left, 0), min(right, width))
    out[rows.start - top:rows.stop - top, cols.start - left:cols.stop - left] = pixels[rows, cols]
    return out


def figure_title(fig) -> str:
    """The figure's title: its suptitle, else the title of its only titled axes, else ""."""
    suptitle = fig.get_suptitle() if hasattr(fig, "get_suptitle") else ""
    if suptitle:
        return " ".join(suptitle.split())
    titles = [t for ax in fig.axes if (t := ax.get_title())]
    return " ".join(titles[0].split()) if len(titles) == 1 else ""
