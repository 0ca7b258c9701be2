"""Chapter 07 pictures: who sends whom how much in an expert-parallel dispatch, and what the
capacity factor trades. They draw chapter 07's results (:mod:`parlab.experiments`); they
compute nothing."""

from __future__ import annotations

from parlab.viz.lazy import plt

__all__ = ["dispatch_matrix_figure", "capacity_figure", "balance_figure", "matrix_panel"]


def matrix_panel(ax, matrix, load, closed_form: float, label: str, vmax: float):
    """One heat map: bytes rank s (row) sent rank d (column) in one dispatch."""
    n = len(matrix)
    image = ax.imshow(matrix, cmap="Blues", vmin=0, vmax=vmax)
    for s in range(n):
        for d in range(n):
            text = "home" if s == d else f"{matrix[s][d]:,}"
            ax.text(d, s, text, ha="center", va="center", fontsize=8,
                    color="white" if matrix[s][d] > 0.6 * vmax else "black")
    ax.set_xticks(range(n), [f"rank {d}" for d in range(n)])
    ax.set_yticks(range(n), [f"rank {s}" for s in range(n)])
    per = len(load) // n
    held = [f"{d * per}" if per == 1 else f"{d * per}-{(d + 1) * per - 1}" for d in range(n)]
    ax.set_xlabel(f"to (rank d holds expert{'s' if per > 1 else ''} " + ", ".join(held) + ")",
                  fontsize=8)
    ax.set_ylabel("from")
    sent = [sum(row) - row[s] for s, row in enumerate(matrix)]
    ax.set_title(f"{label}: each rank sends {min(sent):,}-{max(sent):,} B\n"
                 f"(even-load closed form {closed_form:,.0f} B); load per expert "
                 f"{list(load)}", fontsize=9)
    return image


def dispatch_matrix_figure(even, skewed):
    """Two heat maps of bytes rank s sent rank d in one dispatch: an even and a skewed router."""
    vmax = max(max(max(row) for row in run.matrix) for run in (even, skewed)) or 1
    fig, axes = plt.subplots(1, 2, figsize=(10.5, 4.6), layout="constrained")
    for ax, run in zip(axes, (even, skewed)):
        image = matrix_panel(ax, run.matrix, run.load, run.closed_form,
                             "skewed router" if run.skewed else "even router", vmax)
    fig.colorbar(image, ax=axes, shrink=0.8, label="bytes in one dispatch (the combine "
                                                   "sends as many back)")
    fig.suptitle("Expert-parallel dispatch, one all-to-all, logged by the toy backend")
    return fig


def capacity_figure(even, skewed):
    """Dropped assignments and padded buffer rows against the capacity factor, for an even
    and a skewed router (tables from ``capacity_sweep``)."""
    fig, ax = plt.subplots(figsize=(7.5, 4))
    for table, name, style in ((even, "even router", "-"), (skewed, "skewed router", "--")):
        factors = table["capacity factor"]
        ax.plot(factors, 100 * table["dropped"], style, marker="o", color="#C44E52",
                label=f"dropped ({name})")
        ax.plot(factors, 100 * table["padding"], style, marker="s", color="#4C72B0",
                label=f"padding ({name})")
    ax.set_xlabel("capacity factor (capacity = ceil(k × tokens × factor / experts))")
    ax.set_ylabel("% of assignments dropped / % of buffer rows empty")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    ax.set_title("A larger capacity drops fewer tokens and sends more empty rows")
    fig.tight_layout()
    return fig


def balance_figure(table):
    """max/mean load per step, one line per way of balancing (a table from ``balancing_runs``)."""
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    colors = {"no balancing": "#8C8C8C", "auxiliary loss": "#4C72B0", "bias update": "#55A868"}
    for name in [c for c in table.columns if c != "step"]:
        ax.plot(table["step"], table[name], label=name, color=colors.get(name), lw=2)
    ax.axhline(1.0, color="black", lw=0.8, ls=":")
    ax.set_xlabel("training step")
    ax.set_ylabel("busiest expert's load / mean load")
    ax.set_ylim(0.9, None)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9)
    ax.set_title("A router that leans towards one expert, left alone or balanced")
    fig.tight_layout()
    return fig
