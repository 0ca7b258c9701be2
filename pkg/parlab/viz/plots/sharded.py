"""Chapter 06 pictures: what each rank holds and sends under ZeRO and FSDP, and how it scales.

They draw the tables and logs of chapter 06's runs (:mod:`parlab.experiments`) and of
:func:`parlab.sharded.zero_scaling`; they compute nothing.
"""

from __future__ import annotations

from parlab.hardware import GPU_MEMORY_GB
from parlab.sharded import STATE_PARTS
from parlab.viz.lazy import plt
from parlab.viz.plots.memory import PART_COLORS

__all__ = ["zero_memory_figure", "zero_traffic_figure", "zero3_timeline_figure",
           "zero_scaling_figure", "STAGE_COLORS"]

STAGE_COLORS = {0: "#8C8C8C", 1: "#4C72B0", 2: "#55A868", 3: "#C44E52"}
_OP_COLORS = {"all_gather": "#4C72B0", "reduce_scatter": "#DD8452", "all_reduce": "#8172B2"}


def zero_memory_figure(table, ranks: int = 4):
    """Stacked bars: the bytes one rank held per run on ``ranks`` ranks, and the formula's total."""
    rows = table[table.ranks == ranks].reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(8, 0.55 * len(rows) + 1.4))
    for i, row in rows.iterrows():
        left = 0
        for part in STATE_PARTS:
            ax.barh(i, row[part], left=left, color=PART_COLORS[part],
                    label=part.replace("_", " ") if i == 0 else None)
            left += row[part]
        ax.plot([row["formula"]] * 2, [i - 0.42, i + 0.42], color="black", lw=2,
                label="formula (ZeRO paper)" if i == 0 else None)
        ax.text(left, i, f"  {row['held']:,} B", va="center", fontsize=9)
    ax.set_yticks(range(len(rows)), rows.run)
    ax.invert_yaxis()
    ax.set_xlabel("bytes one rank holds after the backward pass (every rank the same)")
    ax.set_xlim(0, rows.held.max() * 1.25)
    ax.set_title(f"Model states per rank, {ranks} ranks, fp32 Adam: measured vs formula")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


def zero_traffic_figure(table):
    """Bytes each rank sent per step, per run and world size, with the closed forms.

    One legend for all panels, below them (outside every axes), so that it never covers a bar
    whatever their heights.
    """
    sizes = sorted(table.ranks.unique())
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.2 * len(sizes), 3.8), sharey=True,
                             squeeze=False, layout="constrained")
    for ax, n in zip(axes[0], sizes):
        rows = table[table.ranks == n].reset_index(drop=True)
        colors = [STAGE_COLORS[s] for s in rows.stage]
        ax.bar(range(len(rows)), rows["sent per step"], color=colors)
        ax.scatter(range(len(rows)), rows["closed form"], color="black", marker="_", s=400,
                   zorder=3, label="closed form 2 or 3 × (N−1)/N × P")
        ax.set_xticks(range(len(rows)), rows.run, rotation=30)
        ax.set_title(f"{n} ranks")
    axes[0][0].set_ylabel("bytes each rank sends per step")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", fontsize=8, frameon=False)
    fig.suptitle("Traffic per rank and step (toy backend's log)")
    return fig


def zero3_timeline_figure(collectives, layers: int):
    """One step of ZeRO-3: each collective in call order, on the row of the layer it serves."""
    fig, ax = plt.subplots(figsize=(9, 0.6 * layers + 1.6))
    for order, row in collectives.iterrows():
        ax.barh(row.layer, 0.9, left=order, color=_OP_COLORS[row.collective],
                alpha=1.0 if row.phase == "forward" else 0.6)
        ax.text(order + 0.45, row.layer, f"{row.phase}\n{row['bytes sent per rank']} B",
                ha="center", va="center", fontsize=7.5, color="white")
    for op, color in _OP_COLORS.items():
        if op in set(collectives.collective):
            ax.barh([0], [0], color=color, label=op.replace("_", "-"))
    ax.set_yticks(range(layers), [f"layer {i}" for i in range(layers)])
    ax.invert_yaxis()
    ax.set_xlabel("collectives of one step, in the order rank 0 called them (bytes each rank sent)")
    ax.set_title("ZeRO-3: gather before forward, gather again before backward, then scatter")
    ax.legend(fontsize=8, loc="lower left", bbox_to_anchor=(1.0, 0.0))
    fig.tight_layout()
    return fig


def zero_scaling_figure(table, params: float, capacity_gb: float = GPU_MEMORY_GB):
    """Model states per GPU, and communication against compute per step, as GPUs grow."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    for stage, rows in table.groupby("stage"):
        left.plot(rows.gpus, rows["GB per GPU"], marker="o", color=STAGE_COLORS[stage],
                  label=f"stage {stage}")
        right.plot(rows.gpus, rows["comm s"], marker="o", color=STAGE_COLORS[stage],
                   label=f"stage {stage}: sending")
    first = table[table.stage == 0]
    right.plot(first.gpus, first["compute s"], color="black", ls="--",
               label="compute (fixed global batch)")
    left.axhline(capacity_gb, color="black", ls=":", label=f"{capacity_gb:g} GB GPU")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("data-parallel GPUs")
        ax.legend(fontsize=8)
    left.set_ylabel("GB of model states per GPU")
    right.set_ylabel("seconds per step")
    left.set_title(f"{params / 1e9:g} B parameters, bf16 + Adam")
    right.set_title("ring traffic at 400 Gb/s vs compute at 40 % of an H100")
    fig.tight_layout()
    return fig
