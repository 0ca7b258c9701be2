"""Pictures of a traffic log: who sent what to whom in each step, and bytes per rank.

:func:`steps_figure` draws one small panel per step of a collective: the ranks sit on a
circle, and an arrow from src to dst, as thick as the message is large, carries its size.
A ring all-reduce shows the same rotating pattern 2(n-1) times; a naive one shows everyone
pointing at the root and back.
"""

from __future__ import annotations

import math

from parlab.comm import TrafficLog
from parlab.units import format_bytes
from parlab.viz.lazy import plt
from parlab.viz.style import rank_color

__all__ = ["steps_figure", "bytes_per_rank_figure"]


def _positions(n: int):
    """Rank r on a circle, rank 0 at the top, clockwise (the ring's direction)."""
    return [(math.sin(2 * math.pi * r / n), math.cos(2 * math.pi * r / n)) for r in range(n)]


def _draw_step(ax, records, n, names, biggest):
    pos = _positions(n)
    for rec in records:
        (x0, y0), (x1, y1) = pos[rec.src], pos[rec.dst]
        width = 0.8 + 3.2 * rec.nbytes / biggest if biggest else 0.8
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                    arrowprops=dict(arrowstyle="-|>", lw=width, color=rank_color(rec.src),
                                    shrinkA=14, shrinkB=14, connectionstyle="arc3,rad=0.18"))
        # the label sits off the middle of the chord, on the side the arc bends to
        mx, my = (x0 + x1) / 2, (y0 + y1) / 2
        dx, dy = x1 - x0, y1 - y0
        ax.text(mx - 0.22 * dy, my + 0.22 * dx, format_bytes(rec.nbytes), fontsize=7,
                ha="center", va="center", color=rank_color(rec.src), zorder=5,
                bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none", alpha=0.8))
    for r, (x, y) in enumerate(pos):
        ax.add_patch(plt.Circle((x, y), 0.17, color=rank_color(r), alpha=0.9, zorder=3))
        ax.text(x, y, names[r], ha="center", va="center", color="white", fontsize=8,
                weight="bold", zorder=4)
    ax.set_xlim(-1.45, 1.45)
    ax.set_ylim(-1.45, 1.45)
    ax.set_aspect("equal")
    ax.axis("off")


def steps_figure(log: TrafficLog, n: int | None = None, names=None, title: str = "",
                 columns: int = 4):
    """One panel per step of the log: an arrow src -> dst labelled with the bytes it carried."""
    steps = log._steps()
    if not steps:
        raise ValueError("the traffic log is empty: nothing to draw")
    n = n or max(log.ranks()) + 1
    names = list(names) if names is not None else [str(r) for r in range(n)]
    biggest = max(rec.nbytes for rec in log.records)
    columns = min(columns, len(steps))
    rows = math.ceil(len(steps) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(2.3 * columns, 2.5 * rows + 0.4),
                             squeeze=False)
    for ax, ((group, op, algorithm, call, step), records) in zip(axes.flat, steps.items()):
        _draw_step(ax, records, n, names, biggest)
        total = sum(r.nbytes for r in records)
        ax.set_title(f"{op} step {step}\n{format_bytes(total)} in all", fontsize=8)
    for ax in list(axes.flat)[len(steps):]:
        ax.axis("off")
    fig.suptitle(title or f"who sends what to whom, step by step ({n} ranks)", fontsize=10)
    fig.tight_layout()
    return fig


def bytes_per_rank_figure(logs: dict, title: str = "bytes each rank sends"):
    """Grouped bars of bytes sent per rank, one colour per log ({"ring": log, "naive": log})."""
    import numpy as np
    ranks = sorted({r for log in logs.values() for r in log.ranks()})
    fig, ax = plt.subplots(figsize=(1.1 * len(ranks) + 2.5, 2.8))
    width = 0.8 / len(logs)
    for i, (label, log) in enumerate(logs.items()):
        sent = log.per_rank()["sent"].reindex(ranks, fill_value=0)
        xs = np.arange(len(ranks)) + (i - (len(logs) - 1) / 2) * width
        bars = ax.bar(xs, sent.values, width, label=label)
        ax.bar_label(bars, [format_bytes(v) for v in sent.values], fontsize=7)
    ax.set_xticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    ax.set_ylabel("bytes sent")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
