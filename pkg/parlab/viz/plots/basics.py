"""Chapter 00 pictures: what each rank holds before and after a collective."""

from __future__ import annotations

import torch

from parlab.viz.lazy import plt
from parlab.viz.style import rank_color, show

__all__ = ["format_values", "collective_table", "before_after", "show_collective"]


def format_values(t) -> str:
    """A tensor or list as a short, deterministic string of rounded numbers."""
    values = t.flatten().tolist() if isinstance(t, torch.Tensor) else list(t)
    return "[" + ", ".join(f"{round(float(v), 4):g}" for v in values) + "]"


def collective_table(results) -> str:
    """Rows of 'rank | before | after' from each rank's (before, after) pair."""
    rows = [(str(r), format_values(b), format_values(a)) for r, (b, a) in enumerate(results)]
    widths = [max(len(h), *(len(row[i]) for row in rows))
              for i, h in enumerate(("rank", "before", "after"))]
    line = lambda cells: " | ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
    return "\n".join([line(("rank", "before", "after")), "-+-".join("-" * w for w in widths)]
                     + [line(row) for row in rows])


def before_after(results, title: str):
    """Two rows of boxes, one box per rank: its tensor before (top) and after (bottom)."""
    n = len(results)
    fig, ax = plt.subplots(figsize=(1.9 * n + 1.2, 2.6))
    for rank, (before, after) in enumerate(results):
        for row, (label, t) in enumerate((("before", before), ("after", after))):
            y = 1 - row
            ax.add_patch(plt.Rectangle((rank + 0.05, y + 0.1), 0.9, 0.75, color=rank_color(rank),
                                       alpha=0.25 if row == 0 else 0.55, lw=0))
            ax.text(rank + 0.5, y + 0.48, format_values(t), ha="center", va="center", fontsize=9)
        ax.text(rank + 0.5, 2.0, f"rank {rank}", ha="center", va="bottom", fontsize=10,
                color=rank_color(rank), weight="bold")
    for y, label in ((1.48, "before"), (0.48, "after")):
        ax.text(-0.05, y, label, ha="right", va="center", fontsize=10)
    ax.set_xlim(-0.8, n)
    ax.set_ylim(0, 2.3)
    ax.axis("off")
    ax.set_title(title)
    return fig


def show_collective(results, title: str) -> None:
    """Print the before/after table of a collective and draw it (results: (before, after) per rank)."""
    print(collective_table(results))
    show(before_after(results, title))
