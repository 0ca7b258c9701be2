"""Chapter 02 pictures: Figure 8-2 run for real, the traffic of data parallelism, and its scaling.

The runs are chapter 02's experiments (:func:`parlab.experiments.run_figure_8_2`,
:func:`parlab.data_parallel.traffic_table`, :func:`parlab.data_parallel.sync_scaling`); this
module only draws them.
"""

from __future__ import annotations

from parlab.data_parallel import replica_names
from parlab.viz.lazy import plt
from parlab.viz.style import GPU_COLORS, rank_color

__all__ = ["figure_8_2", "loss_curves", "traffic_figure", "scaling_figure", "ALGORITHM_LABELS"]

#: How the scaling figure names each all-reduce model: the tree is :mod:`parlab.comm.cost`'s
#: binomial tree, which sends the whole gradient in every message (NCCL pipelines its trees).
ALGORITHM_LABELS = {"tree": "tree (binomial, not pipelined)"}


def figure_8_2(result: "BookRun", item: int = 0, tolerance: float = 1e-6):
    """Figure 8-2 for real: per GPU its micro-batches, local, remote, averaged ∇, new weights.

    A last column shows one process trained on the whole batch: its gradient (labelled as
    such under its panel) is the average the replicas computed together, and its weights
    are theirs. Every gradient panel shares one colour scale (a colour bar beside them), and
    the weights another, so a colour means the same number in every panel of its kind. The
    title states the match as a bound, ``tolerance``, not as the measured difference, which
    depends on the CPU's floating-point kernels.
    """
    rows = [("local", "local ∇W1\n(own micro-batches)"), ("remote", "remote ∇W1\n(from peers)"),
            ("averaged", "averaged ∇W1\n(local + remote) / N"),
            ("weights", "W1 after the update")]
    whole_batch = {"averaged": "∇W1 of the whole batch"}  # the one-process column's own label
    n = len(result.ranks)
    everything = list(range(1, sum(len(r["micro"]) for r in result.ranks) + 1))
    columns = result.ranks + [{"micro": everything, "averaged": result.reference_grads,
                               "weights": result.reference}]
    titles = [f"{name}: full replica" for name in result.names] + ["one process, whole batch"]
    scales = {"gradient": _shared_scale(columns, ("local", "remote", "averaged"), item),
              "weights": _shared_scale(columns, ("weights",), item)}
    cmaps = {"gradient": "RdBu_r", "weights": "PuOr_r"}
    fig, axes = plt.subplots(len(rows) + 1, n + 1, figsize=(2.6 * (n + 1) + 2.2, 8.6),
                             squeeze=False, gridspec_kw={"height_ratios": [0.5] + [1] * len(rows)})
    images = {}
    for c, (title, run) in enumerate(zip(titles, columns)):
        color = GPU_COLORS.get(title.split(":")[0], "#555555")
        ax = axes[0][c]
        width = max(len(col["micro"]) for col in columns[:n])
        for k, j in enumerate(run["micro"]):
            x0 = k * width / len(run["micro"])
            ax.add_patch(plt.Rectangle((x0, 0), 0.9 * width / len(run["micro"]), 0.8,
                                       color=color, alpha=0.35, lw=0))
            ax.text(x0 + 0.45 * width / len(run["micro"]), 0.4, f"x{j}", ha="center",
                    va="center", fontsize=8)
        ax.set_xlim(-0.1, width)
        ax.set_ylim(0, 1.2)
        ax.axis("off")
        ax.set_title(title, color=color, fontsize=10, weight="bold")
        for r, (key, label) in enumerate(rows, start=1):
            ax = axes[r][c]
            ax.set_xticks([])
            ax.set_yticks([])
            if c == 0:
                ax.set_ylabel(label, fontsize=9)
            if key not in run:
                ax.axis("off")
                continue
            kind = "weights" if key == "weights" else "gradient"
            images[kind] = ax.imshow(run[key][item].numpy(), cmap=cmaps[kind],
                                     vmin=-scales[kind], vmax=scales[kind])
            if c == n and key in whole_batch:
                ax.set_xlabel(whole_batch[key], fontsize=8)
    if n == 2:
        axes[2][0].annotate("", xy=(1.05, 0.5), xycoords="axes fraction", xytext=(-0.05, 0.5),
                            textcoords=axes[2][1].transAxes,
                            arrowprops={"arrowstyle": "<->", "color": "#555555"})
        axes[2][0].text(1.8, 0.58, result.how, transform=axes[2][0].transAxes, ha="center",
                        fontsize=8, color="#555555")
    bound = f"{tolerance:.0e}".replace("e-0", "e-")
    match = (f"equal one process's to within {bound}" if result.max_difference() < tolerance
             else f"differ from one process's by more than {bound}")
    fig.suptitle(f"Figure 8-2 for real ({result.how}): {n} replicas; their weights {match}",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 1 - 1.0 / fig.get_figwidth(), 1))
    for ax in axes[1:].ravel():
        ax.apply_aspect()  # the image's own box, so the colour bars line up with it
    for kind, first, last, label in (
            ("gradient", 1, len(rows) - 1, "∇W1 entry (every ∇ panel)"),
            ("weights", len(rows), len(rows), "W1 entry")):
        top, bottom = axes[first][0].get_position(), axes[last][-1].get_position()
        bar = fig.add_axes((bottom.x1 + 0.25 / fig.get_figwidth(), bottom.y0,
                            0.12 / fig.get_figwidth(), top.y1 - bottom.y0))
        fig.colorbar(images[kind], cax=bar, label=label)
    return fig


def _shared_scale(columns, keys, item: int) -> float:
    """The largest |entry| of tensor ``item`` over every panel of ``keys``: the colour limit."""
    return max(float(col[key][item].abs().max()) for col in columns for key in keys
               if key in col) or 1.0


def loss_curves(runs: dict, reference_losses):
    """Loss per step for each world size (mean over ranks) against the single process."""
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    ax.plot(range(1, len(reference_losses) + 1), reference_losses, color="black", lw=3,
            alpha=0.25, label="one process, whole batch")
    for k, (world, ranks) in enumerate(runs.items()):
        mean = [sum(r.losses[i] for r in ranks) / len(ranks) for i in range(len(ranks[0].losses))]
        ax.plot(range(1, len(mean) + 1), mean, "os^D"[k % 4] + "--", ms=7 - 2 * (k % 3),
                fillstyle="none", lw=0.8, color=rank_color(k),
                label=f"{world} rank(s), mean of replicas")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (MSE)")
    ax.legend(fontsize=8)
    ax.set_title("Data parallel on N ranks = one process on the whole batch")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- traffic (toy backend)


def traffic_figure(table, gradient: int):
    """Bars: bytes each GPU sent per step, ring against naive, with 2(N-1)/N x gradient bytes."""
    sizes = sorted(table["ranks"].unique())
    fig, axes = plt.subplots(1, len(sizes), figsize=(3.6 * len(sizes) + 0.8, 3.4), squeeze=False,
                             sharey=True)
    for ax, n in zip(axes[0], sizes):
        part = table[table["ranks"] == n]
        algorithms = list(dict.fromkeys(part["algorithm"]))
        width = 0.8 / len(algorithms)
        for k, algorithm in enumerate(algorithms):
            rows = part[part["algorithm"] == algorithm]
            xs = [i + (k - (len(algorithms) - 1) / 2) * width for i in range(len(rows))]
            ax.bar(xs, rows["sent per step (B)"], width, label=algorithm, color=rank_color(k))
        ax.axhline(2 * (n - 1) / n * gradient, color="black", ls="--", lw=1,
                   label="2(N-1)/N x gradient")
        ax.set_xticks(range(n), replica_names(n))
        ax.set_title(f"N = {n}")
    axes[0][0].set_ylabel("bytes sent per training step")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(f"Gradient all-reduce traffic per GPU (gradient = {gradient} bytes)", fontsize=10)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- at cluster scale


def scaling_figure(scaling, label: str = ""):
    """Bytes per NIC per step and time per step as the cluster grows from 2 to 16384 GPUs,
    from a :class:`parlab.data_parallel.SyncScaling` (what
    :func:`parlab.data_parallel.sync_scaling` computes)."""
    params, gpus, gbps = scaling.params, scaling.gpus, scaling.gbps
    algorithm, dtype_bytes = scaling.algorithm, scaling.dtype_bytes
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    size = params * dtype_bytes
    for k, (alg, costs) in enumerate(scaling.curves.items()):
        style = {"lw": 2.5 if alg == algorithm else 1, "alpha": 1 if alg == algorithm else 0.5,
                 "color": rank_color(k)}
        name = ALGORITHM_LABELS.get(alg, alg)
        left.plot(scaling.scales, [c[0] / 1e9 for c in costs], label=name, **style)
        right.plot(scaling.scales, [c[1] for c in costs], label=f"communication, {name}",
                   **style)
    compute = scaling.compute_seconds
    right.axhline(compute, color="black", ls="--", lw=1, label="compute (forward + backward)")
    left.axhline(2 * size / 1e9, color="gray", ls=":", lw=1, label="2 x gradient")
    busiest, seconds = scaling.busiest, scaling.seconds
    left.plot([gpus], [busiest / 1e9], "ko")
    right.plot([gpus], [seconds], "ko")
    for ax, title in ((left, "bytes through the busiest NIC per step (GB)"),
                      (right, f"seconds per step at {gbps:g} Gb/s per NIC")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("GPUs (data-parallel replicas)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
    fig.suptitle(f"{label or f'{params / 1e9:.3g} B parameters'}, gradients of {dtype_bytes} "
                 f"bytes: {algorithm} at {gpus} GPUs sends {busiest / 1e9:.3g} GB per NIC in "
                 f"{seconds:.3g} s (compute {compute:.3g} s)", fontsize=10)
    fig.tight_layout()
    return fig

