"""Chapter 05 pictures: the planner's layouts, where ranks sit on a rail-optimized cluster, the
CNN's compute against its parameters, and the 3D job's traffic by group and link.

Every drawing takes what the package computed (a :class:`parlab.hybrid.Search`, a
:class:`parlab.hybrid.Placement`, a :class:`parlab.hybrid.CnnCommunication`, a
:class:`parlab.hybrid.Run3D`), never numbers typed in here.
"""

from __future__ import annotations

from parlab.viz.lazy import patches, plt
from parlab.viz.style import rank_color

__all__ = ["layouts_figure", "placement_figure", "cnn_figure", "traffic_3d_figure",
           "candidates", "published_figure"]

_PART_COLORS = {"compute": "#4C72B0", "recompute": "#8172B2", "bubble": "#CCCCCC",
                "tensor": "#DD8452", "pipeline": "#55A868", "data": "#C44E52"}
_MEMORY_COLORS = {"parameters": "#4C72B0", "gradients": "#64B5CD", "optimizer_state": "#8172B2",
                  "master_weights": "#CCB974", "activations": "#DD8452", "other": "#8C8C8C"}
_LINK_COLORS = {"nvlink": "#55A868", "rail": "#4C72B0", "spine": "#C44E52"}


def candidates(search, top: int = 8) -> list:
    """One layout per (dp, tp, pp): the fastest that fits, else the smallest that does not.

    Fitting ones first (fastest first), then the near misses (smallest memory first).
    """
    best: dict = {}
    for lay in search.layouts:
        key = (lay.dp, lay.tp, lay.pp)
        old = best.get(key)
        rank = (not lay.fits, lay.step_time_s if lay.fits else lay.memory_per_gpu_bytes)
        if old is None or rank < (not old.fits, old.step_time_s if old.fits
                                  else old.memory_per_gpu_bytes):
            best[key] = lay
    ordered = sorted(best.values(), key=lambda lay: (not lay.fits, lay.step_time_s if lay.fits
                                                     else lay.memory_per_gpu_bytes))
    return ordered[:top]


def layouts_figure(search, top: int = 8, title: str = ""):
    """Step time (stacked by part) and memory per GPU (stacked by part) of the best layouts."""
    layouts = candidates(search, top)
    if not layouts:
        raise ValueError("the search evaluated no layout: nothing to draw")
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 0.55 * len(layouts) + 1.8),
                                      sharey=True)
    labels = [f"dp {x.dp} · tp {x.tp} · pp {x.pp}, m={x.microbatches}" for x in layouts]
    ys = range(len(layouts))
    for y, lay in zip(ys, layouts):
        start = 0.0
        for part, seconds in lay.times.items():
            left.barh(y, seconds, left=start, color=_PART_COLORS[part],
                      alpha=1.0 if lay.fits else 0.35, label=part if y == 0 else None)
            start += seconds
        left.text(start, y, f" {start:.4g} s" if lay.fits else " does not fit",
                  va="center", fontsize=8)
        start = 0.0
        for part, nbytes in lay.memory.parts().items():
            right.barh(y, nbytes / 1e9, left=start, color=_MEMORY_COLORS[part],
                       alpha=1.0 if lay.fits else 0.35, label=part.replace("_", " ")
                       if y == 0 else None)
            start += nbytes / 1e9
        right.text(start, y, f" {start:.1f} GB", va="center", fontsize=8)
    capacity = layouts[0].memory.capacity / 1e9
    right.axvline(capacity, color="black", ls="--", lw=1)
    right.text(capacity, -0.7, f"{capacity:g} GB", ha="center", fontsize=8)
    left.set_yticks(list(ys), labels)
    left.invert_yaxis()
    left.set_xlabel("seconds per training step")
    right.set_xlabel("GB on the busiest GPU")
    for ax in (left, right):
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.5 / len(layouts)
                                                                   - 0.12), ncol=3)
    fig.suptitle(title or f"{search.config.name} on {search.gpus:,} GPUs of "
                 f"{search.gpu_memory_gb:g} GB: best micro-batch count per (dp, tp, pp)")
    fig.tight_layout()
    return fig


def placement_figure(placement, max_servers: int = 8, title: str = ""):
    """Servers as rows, GPU positions (rails) as columns; colour = stage, box = tensor group,
    from a :class:`parlab.hybrid.Placement` (:func:`parlab.hybrid.placement`)."""
    from parlab.comm import gpu_name

    dp, tp, pp = placement.dp, placement.tp, placement.pp
    gpus_per_server, gpu_of = placement.gpus_per_server, placement.gpu_of
    width = min(gpus_per_server, dp * tp * pp)
    servers = min(max_servers, -(-len(gpu_of) // gpus_per_server))
    fig, ax = plt.subplots(figsize=(max(1.1 * width + 1.5, 6.0), 0.75 * servers + 1.4))
    cmap = plt.get_cmap("viridis")
    for rank, gpu in enumerate(gpu_of):
        server, position = divmod(gpu, gpus_per_server)
        if server >= servers:
            continue
        c = placement.coordinates[rank]
        shade = c.stage / max(pp - 1, 1)  # viridis: dark purple (first stage) to yellow
        ax.add_patch(patches.Rectangle((position + 0.05, server + 0.08), 0.9, 0.84,
                                       color=cmap(shade), alpha=0.75))
        ax.text(position + 0.5, server + 0.5, f"{gpu_name(gpu, gpus_per_server)}\nr{rank}\n"
                f"d{c.replica} s{c.stage} t{c.tensor}", ha="center", va="center", fontsize=7,
                color="white" if shade < 0.55 else "black")
        if c.tensor == 0 and tp > 1:
            ax.add_patch(patches.Rectangle((position + 0.02, server + 0.04), tp - 0.04, 0.92,
                                           fill=False, lw=2, ec=rank_color(c.replica)))
    ax.set_xlim(0, width)
    ax.set_ylim(servers, 0)
    ax.set_xticks([p + 0.5 for p in range(width)],
                  [f"rail {p + 1}" for p in range(width)], fontsize=8)
    ax.set_yticks([s + 0.5 for s in range(servers)],
                  [f"server {s + 1}" for s in range(servers)], fontsize=8)
    ax.tick_params(length=0)
    shown = "" if servers * gpus_per_server >= len(gpu_of) else f" (first {servers} servers)"
    ax.set_title(title or f"dp {dp} x tp {tp} x pp {pp}{shown}\ncolour = pipeline stage s, "
                 f"frame = tensor group,\nd = replica, t = tensor index, r = rank", fontsize=9)
    for side in ax.spines.values():
        side.set_visible(False)
    fig.tight_layout()
    return fig


def cnn_figure(cnn, max_batch: int = 64):
    """Where the CNN's FLOPs and parameters are; bytes per layer per strategy; one layer's line,
    from a :class:`parlab.hybrid.CnnCommunication` (:func:`parlab.hybrid.cnn_communication`)."""
    from parlab.hybrid import TENSOR_SPLITS

    batch, layer = cnn.batch, cnn.layer
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4))
    shares = cnn.shares
    kinds = list(shares)
    for i, what in enumerate(("flops", "params")):
        values = [100 * shares[k][what] for k in kinds]
        bars = a.bar([x + 0.38 * i for x in range(len(kinds))], values, 0.36,
                     label="compute (FLOPs)" if what == "flops" else "parameters")
        a.bar_label(bars, fmt="%.0f %%", fontsize=8)
    a.set_xticks([x + 0.19 for x in range(len(kinds))],
                 ["convolutions" if k == "conv" else "fully connected" for k in kinds])
    a.set_ylabel("% of the model")
    a.legend(fontsize=8)
    a.set_title("where the work and the weights are")

    rows = cnn.rows
    names = [r["layer"] for r in rows]
    x = range(len(rows))
    b.bar([i - 0.2 for i in x], [r["data_parallel"] for r in rows], 0.4, label="data parallel")
    b.bar([i + 0.2 for i in x], [min(r[k] for k in TENSOR_SPLITS) for r in rows], 0.4,
          label="tensor parallel (cheaper split)")
    b.set_yscale("log")
    b.set_xticks(list(x), names, fontsize=8)
    b.set_ylabel("bytes per step (before the collective's factor)")
    b.legend(fontsize=8)
    b.set_title(f"communication per layer at batch {batch}")

    one = cnn.one
    batches = list(range(1, max_batch + 1))
    c.plot(batches, [one["data_parallel"]] * len(batches), label="data parallel (weights)")
    for k in TENSOR_SPLITS:
        c.plot(batches, [n * one[k] for n in batches], label=k.replace("tp_", "tensor: ")
               .replace("_", " "))
    line = cnn.crossover
    c.axvline(line + 0.5, color="black", ls=":", lw=1)
    c.text(line + 0.5, c.get_ylim()[1] * 0.95, f" up to batch {line}:\n cheaper to split",
           fontsize=8, va="top")
    c.set_xlabel("batch size")
    c.set_ylabel("bytes per step")
    c.legend(fontsize=8, loc="lower right")
    c.set_title(f"{layer}: the line moves with the batch")
    fig.tight_layout()
    return fig


def traffic_3d_figure(run):
    """Bytes the 3D job sent, per group kind, stacked by the link type they would use."""
    table = run.traffic_by_group()
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    kinds = list(table)
    for i, kind in enumerate(kinds):
        start = 0
        for link, nbytes in table[kind].items():
            if nbytes:
                ax.bar(i, nbytes / 1024, bottom=start / 1024, color=_LINK_COLORS[link],
                       label=link if link not in ax.get_legend_handles_labels()[1] else None)
                start += nbytes
        ax.text(i, start / 1024, f"{start / 1024:.0f} KiB", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(kinds)), [f"{k} groups" for k in kinds])
    ax.set_ylabel("KiB sent in one training step")
    ax.legend(title="link", fontsize=8)
    ax.set_title(f"dp {run.dp} x tp {run.tp} x pp {run.pp}: traffic by group and link",
                 fontsize=10)
    fig.tight_layout()
    return fig


def published_figure(rows, tolerance: float, ceiling: float | None = None):
    """Predicted against published TFLOP/s per GPU, one point per row (anything with ``row``,
    ``published_tflops``, ``predicted_tflops`` and ``within``), the diagonal and the band a
    step time within ``tolerance`` allows (TFLOP/s = published / (1 +- tolerance)), and
    ``ceiling``: the most the model's compute speed allows, drawn as a dashed line."""
    rows = list(rows)
    if not rows:
        raise ValueError("no rows to draw")
    fig, ax = plt.subplots(figsize=(6.4, 5.2))
    values = [v for r in rows for v in (r.published_tflops, r.predicted_tflops)]
    values += [] if ceiling is None else [ceiling]
    lo, hi = 0.9 * min(values), 1.05 * max(values)
    ax.plot([lo, hi], [lo, hi], color="#444444", lw=1, label="predicted = published")
    ax.fill_between([lo, hi], [lo / (1 + tolerance), hi / (1 + tolerance)],
                    [lo / (1 - tolerance), hi / (1 - tolerance)], color="#55A868", alpha=0.15,
                    label=f"step time within {tolerance:.0%}")
    if ceiling is not None:
        ax.axhline(ceiling, color="#8172B2", ls="--", lw=1,
                   label=f"compute alone at the model's speed, {ceiling:.0f}")
    for r in rows:
        ax.scatter(r.published_tflops, r.predicted_tflops, s=36, zorder=3,
                   color="#4C72B0" if r.within else "#C44E52")
        ax.annotate(str(r.row), (r.published_tflops, r.predicted_tflops), fontsize=8,
                    xytext=(4, -10), textcoords="offset points")
    ax.scatter([], [], color="#4C72B0", label="within the tolerance")
    ax.scatter([], [], color="#C44E52", label="outside it")
    ax.set(xlim=(lo, hi), ylim=(lo, hi), xlabel="published TFLOP/s per GPU",
           ylabel="predicted TFLOP/s per GPU",
           title="Narayanan et al. (2021), Table 1: predicted against published")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig
