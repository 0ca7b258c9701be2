"""Chapter 08 pictures: the ring of key/value blocks step by step, the causal work each
rank gets under each way of cutting the sequence, and memory per GPU against its length. They draw chapter 08's results (positions
and counts computed by :mod:`parlab.context_parallel` and :mod:`parlab.experiments`); they
compute nothing else."""

from __future__ import annotations

from parlab.viz.lazy import plt, ticker
from parlab.viz.style import TAB10_COLORS

__all__ = ["ring_steps_figure", "causal_work_figure", "memory_by_sequence_figure"]


def ring_steps_figure(world: int, computed: list[list[float]], layout: str):
    """A grid of ranks (rows) by steps (columns): which rank's key/value block each rank
    holds at each step (rank r holds rank r - t's at step t), coloured by owner, and the
    share of that block it computes under a causal mask (``computed[r][t]``, 0 to 1)."""
    fig, ax = plt.subplots(figsize=(1.5 + 1.35 * world, 0.9 + 0.62 * world),
                           layout="constrained")
    for r in range(world):
        for t in range(world):
            owner, share = (r - t) % world, computed[r][t]
            ax.add_patch(plt.Rectangle((t, r), 0.94, 0.86, color=TAB10_COLORS[owner],
                                       alpha=0.25 + 0.6 * share, lw=0))
            label = "skipped" if share == 0 else ("whole" if share == 1 else f"{share:.0%}")
            ax.text(t + 0.47, r + 0.43, f"K,V of {owner}\n{label}", ha="center", va="center",
                    fontsize=8)
    ax.set_xlim(0, world)
    ax.set_ylim(world, 0)
    ax.set_xticks([t + 0.47 for t in range(world)], [f"step {t}" for t in range(world)])
    ax.set_yticks([r + 0.43 for r in range(world)], [f"rank {r}" for r in range(world)])
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(f"Ring attention on {world} ranks, causal, {layout} layout: the K,V block each "
                 f"rank holds at each step\n(passed on to the next rank before every step but "
                 f"the last), and how much of it the rank computes", fontsize=9)
    return fig


def causal_work_figure(work: dict, unit_pairs: float, unit_flops: float):
    """Bars per rank for each layout: unmasked (query, key) pairs and the FLOPs ring attention
    computed, each divided by its value for one whole ``S/p`` block (so 1 = one block)."""
    layouts = list(work)
    world = len(next(iter(work.values()))["unmasked pairs"])
    fig, axes = plt.subplots(1, 2, figsize=(9.5, 3.4), layout="constrained", sharey=True)
    width = 0.8 / len(layouts)
    for ax, key, unit, title in ((axes[0], "unmasked pairs", unit_pairs,
                                  "unmasked (query, key) pairs"),
                                 (axes[1], "ring FLOPs", unit_flops,
                                  "FLOPs ring attention computed (forward)")):
        for i, layout in enumerate(layouts):
            values = [v / unit for v in work[layout][key]]
            xs = [r + (i - (len(layouts) - 1) / 2) * width for r in range(world)]
            ax.bar(xs, values, width, color=TAB10_COLORS[i], label=layout)
            for x, value in zip(xs, values):
                ax.text(x, value, f"{value:.2g}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(world), [f"rank {r}" for r in range(world)])
        ax.set_title(title, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("in S/p x S/p blocks")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Causal attention's work per rank on {world} ranks, by layout", fontsize=10)
    return fig


def memory_by_sequence_figure(curves: dict, lengths, capacity_gb: float):
    """One panel per model: memory per GPU (GB) against sequence length, one line per layout
    (``curves[model][layout]``: GB at each of ``lengths``), and a GPU's capacity as a line."""
    fig, axes = plt.subplots(1, len(curves), figsize=(10, 3.8), layout="constrained")
    for ax, (model, layouts) in zip(axes, curves.items()):
        for i, (label, values) in enumerate(layouts.items()):
            ax.plot(lengths, values, marker="o", ms=3, color=TAB10_COLORS[i % len(TAB10_COLORS)],
                    label=label)
        ax.axhline(capacity_gb, color="0.3", ls="--", lw=1)
        ax.text(lengths[0], capacity_gb * 1.08, f"{capacity_gb:.0f} GB GPU", fontsize=7)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
            axis(ticker.FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "1235" else ""))
        ax.set_xticks(lengths, [f"{n // 1024}K" for n in lengths])
        ax.set_xlabel("tokens per sequence")
        ax.set_title(model, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("memory per GPU (GB, log scale)")
    fig.suptitle("Memory on the busiest GPU as the sequence grows, by layout", fontsize=10)
    return fig
