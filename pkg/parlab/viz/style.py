"""The shared look of every picture: one colour per GPU name and per rank, and how a figure is shown.

Colours are fixed per GPU name (A1 is the same blue in every chapter) so a reader can follow
one GPU from figure to figure.
"""

from __future__ import annotations

__all__ = ["GPU_COLORS", "RANK_COLORS", "rank_color", "show", "figure_title"]

#: One colour per GPU name, used by every chapter so A1 looks the same everywhere.
GPU_COLORS = {
    "A1": "#4C72B0", "A2": "#55A868", "A3": "#8172B2", "B1": "#C44E52", "B2": "#DD8452",
    "B3": "#937860", "C1": "#64B5CD", "C2": "#8C8C8C", "C3": "#CCB974", "C4": "#DA8BC3",
}
RANK_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B2", "#937860", "#DA8BC3",
               "#8C8C8C", "#CCB974", "#64B5CD"]


def rank_color(rank: int) -> str:
    """A stable colour for a rank number."""
    return RANK_COLORS[rank % len(RANK_COLORS)]


def show(fig, caption: str | None = None) -> None:
    """Display a figure once and close it; return None so a notebook cell shows nothing more.

    A cell that ends with a Figure object shows it twice under nbval (which runs cells
    without history, so a trailing ``;`` does not hide the return value). Displaying
    explicitly and closing avoids that everywhere. The figure's title (:func:`figure_title`)
    and ``caption`` travel in the output's metadata: the book site uses the title as the
    image's alternative text and prints a caption under the figure only where one is given
    that says more than the title drawn in the image.
    """
    import matplotlib.pyplot as plt
    from IPython.display import display

    meta = {"title": figure_title(fig)} if figure_title(fig) else {}
    if caption:
        meta["caption"] = caption
    display(fig, metadata={"parlab": meta} if meta else None)
    plt.close(fig)


def figure_title(fig) -> str:
    """The figure's title: its suptitle, else the title of its only titled axes, else ""."""
    suptitle = fig.get_suptitle() if hasattr(fig, "get_suptitle") else ""
    if suptitle:
        return " ".join(suptitle.split())
    titles = [t for ax in fig.axes if (t := ax.get_title())]
    return " ".join(titles[0].split()) if len(titles) == 1 else ""
