"""matplotlib drawings of the book's figures, one module per chapter.

Each module registers the figures it can draw with :func:`parlab.figures.figure`, so
``python -m parlab.figures`` finds them. Shared look: the GPU colours and names below.
"""

from __future__ import annotations

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


def show(fig) -> None:
    """Display a figure once and close it; return None so a notebook cell shows nothing more.

    A cell that ends with a Figure object shows it twice under nbval (which runs cells
    without history, so a trailing ``;`` does not hide the return value). Displaying
    explicitly and closing avoids that everywhere.
    """
    import matplotlib.pyplot as plt
    from IPython.display import display

    display(fig)
    plt.close(fig)
