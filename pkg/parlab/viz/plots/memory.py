"""Chapter 01 pictures: Figure 8-1 from a real step (:func:`parlab.experiments.book_step`),
memory bars against a GPU, failure cost."""

from __future__ import annotations

import math

from parlab.memory import Breakdown, WasteCurve
from parlab.models import BOOK_NAMES, BookMLP
from parlab.units import GB
from parlab.viz.lazy import plt

__all__ = ["figure_8_1", "memory_bars", "memory_split", "checkpoint_curve", "PART_COLORS"]

PART_COLORS = {"parameters": "#4C72B0", "gradients": "#DD8452", "optimizer_state": "#55A868",
               "master_weights": "#8172B2", "activations": "#C44E52", "other": "#8C8C8C"}
_GROUP = {"a": "#4C72B0", "b": "#C44E52", "c": "#C44E52", "d": "#DD8452", "e": "#DD8452",
          "f": "#64B5CD", "g": "#4C72B0", "h": "#55A868"}


def _network(ax, mlp: BookMLP, highlight: int) -> None:
    """Neurons as circles, layer by layer; the top neuron of layer ``highlight`` annotated."""
    sizes, gap = mlp.sizes, 2.2
    top = max(sizes)
    pos = [[(gap * i, (top - n) / 2 + j) for j in range(n)] for i, n in enumerate(sizes)]
    for a, b in zip(pos, pos[1:]):
        for p in a:
            for q in b:
                ax.plot([p[0], q[0]], [p[1], q[1]], color="#cccccc", lw=0.6, zorder=1)
    hot = pos[highlight][-1]
    for i, layer in enumerate(pos):
        for xy in layer:
            color = "#C44E52" if xy == hot else ("#dddddd" if i == 0 else "#4C72B0")
            ax.add_patch(plt.Circle(xy, 0.3, color=color, zorder=2))
        name = "input" if i == 0 else ("output" if i == len(sizes) - 1 else f"hidden {i}")
        ax.text(gap * i, -1.1, name, ha="center", fontsize=9)
    rec = mlp.layers[highlight - 1]
    shape = lambda t: "absent" if t is None else ("x".join(map(str, t.shape)) or "scalar")
    lines = [f"{BOOK_NAMES[k]}: {shape(t)}" for k, t in rec.items() if not k.endswith("b")]
    ax.annotate(f"layer {highlight} keeps (shapes)\n" + "\n".join(lines), hot,
                xytext=(0, top + 0.8), fontsize=8, family="monospace", va="bottom",
                arrowprops=dict(arrowstyle="->", color="#C44E52"),
                bbox=dict(boxstyle="round", fc="white", ec="#C44E52"))
    ax.set_xlim(-0.8, gap * (len(sizes) - 1) + 0.8)
    ax.set_ylim(-1.6, top + 5.8)
    ax.set_aspect("equal")
    ax.axis("off")


def figure_8_1(mlp: BookMLP, highlight: int = 2):
    """The network of a real step beside the bytes of each Figure 8-1 item, summed over layers."""
    rows = mlp.memory_rows()
    per_item: dict[str, int] = {}
    for row in rows:
        if row.layer != "input":
            per_item[row.item] = per_item.get(row.item, 0) + row.nbytes
    data = sum(r.nbytes for r in rows if r.layer == "input")
    total = sum(r.nbytes for r in rows)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6), width_ratios=[1.25, 1])
    _network(left, mlp, highlight)
    items = list(per_item)[::-1] + ["training data x, targets"]
    values = [per_item[i] for i in items[:-1]] + [data]
    colors = [_GROUP[i[0]] for i in items[:-1]] + ["#bbbbbb"]
    right.barh(items, values, color=colors)
    for y, v in enumerate(values):
        right.text(v, y, f" {v} B", va="center", fontsize=8)
    right.set_xlabel("bytes (all layers)")
    right.set_xlim(0, max(values) * 1.25)
    right.spines[["top", "right"]].set_visible(False)
    fig.suptitle(f"Figure 8-1 from a real training step: {total:,} bytes held "
                 f"(sizes {mlp.sizes}, batch {mlp.x.shape[0]}, {mlp.dtype})".replace("torch.", ""))
    fig.tight_layout()
    return fig


def _stack(ax, labels, breakdowns, capacity: float, title: str) -> None:
    bottoms = [0.0] * len(breakdowns)
    for part, color in PART_COLORS.items():
        values = [b.parts()[part] / GB for b in breakdowns]
        if any(values):
            ax.bar(labels, values, bottom=bottoms, color=color, label=part.replace("_", " "))
            bottoms = [a + v for a, v in zip(bottoms, values)]
    ax.axhline(capacity / GB, color="black", ls="--", lw=1)
    ax.text(-0.45, capacity / GB, f"GPU: {capacity / GB:g} GB", va="bottom", ha="left",
            fontsize=8)
    ax.set_ylabel("GB per GPU")
    ax.set_title(title, fontsize=10)
    ax.spines[["top", "right"]].set_visible(False)


def memory_bars(labels, breakdowns: list[Breakdown], title: str = ""):
    """Stacked bars, one per breakdown, against the GPU capacity of the first."""
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(labels) + 2), 4.2))
    _stack(ax, labels, breakdowns, breakdowns[0].capacity, title)
    ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def memory_split(one: Breakdown, split: Breakdown, split_label: str, title: str = ""):
    """Two panels, each on its own scale: everything on one GPU, and per GPU after a split."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2))
    _stack(axes[0], ["one GPU"], [one], one.capacity, "everything on one GPU")
    _stack(axes[1], [split_label], [split], split.capacity, "per GPU after the split")
    axes[1].legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1, 1))
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


def checkpoint_curve(curve: WasteCurve):
    """Expected wasted dollars against the checkpoint interval, with Young's interval marked,
    from a :class:`parlab.memory.WasteCurve` (:func:`parlab.memory.waste_curve`)."""
    run, mtbf_hours, best, at_best = curve.run, curve.mtbf_hours, curve.best, curve.at_best
    ks, waste, none = curve.intervals, curve.wasted_usd, curve.never
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(ks, [w / 1e6 for w in waste], color="#4C72B0")
    ax.plot([best], [at_best.wasted_usd / 1e6], "o", color="#C44E52")
    ax.annotate(f"Young: every {best:.2g} h, ${at_best.wasted_usd / 1e6:.2f} M",
                (best, at_best.wasted_usd / 1e6), textcoords="offset points", xytext=(8, 10),
                fontsize=8)
    never = none.wasted_usd
    ax.set_title(f"{run.gpus:,} GPUs, failures every {mtbf_hours:g} h; without checkpoints "
                 + ("the run never ends" if not math.isfinite(never) or never > 1e12
                    else f"${never / 1e6:,.1f} M wasted"), fontsize=10)
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (hours)")
    ax.set_ylabel("expected wasted electricity ($ M)")
    ax.set_ylim(0, min(max(waste), 4 * at_best.wasted_usd) / 1e6 * 1.05)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig
