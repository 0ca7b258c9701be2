"""Chapter 02 pictures: Figure 8-2 run for real, and the traffic of data parallelism.

Figure 8-2 shows two GPUs, A1 and A2, each with the whole model and half of the batch.
:func:`run_figure_8_2` trains :class:`parlab.layers.BookMLP` that way on real ranks and keeps,
per rank, what the figure names: its micro-batches, its local gradients, the gradients that
came from the peer, the average, and the weights after the update, next to one process
trained on the whole batch. :func:`figure_8_2` draws it.

matplotlib is imported inside the drawing functions: the ranks import this module to run
:func:`_book_rank`, and need not pay for a plotting library.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..data_parallel import GradientExchange, TrainSpec, make_batch, split_batch
from ..figures import figure
from ..layers import BookMLP
from ..topology import gpu_name
from . import GPU_COLORS, rank_color

__all__ = ["BookRun", "run_figure_8_2", "gpu_names", "figure_8_2", "format_tensor",
           "loss_curves"]

#: The run of Figure 8-2: 8 micro-batches of 2 samples, split 4 + 4 over A1 and A2.
FIGURE_8_2 = TrainSpec(sizes=(4, 6, 6, 2), samples=16, micro_batches=8, lr=0.1, steps=1)


def gpu_names(world_size: int) -> list[str]:
    """Figure 8-2's names: one GPU per server on one rail, so A1, A2, A3, ... (see topology)."""
    return [gpu_name(r, gpus_per_server=1) for r in range(world_size)]


def _book_rank(spec: TrainSpec, how: str) -> dict:
    """On each rank: BookMLP on this rank's micro-batches, gradients exchanged with ``how``."""
    if spec.momentum:
        raise ValueError("BookMLP applies plain SGD (Δw = -lr·G); use momentum=0")
    rank, world = dist.get_rank(), dist.get_world_size()
    everyone = split_batch(spec.samples, spec.micro_batches, world)
    shares = everyone[rank]
    labels = [sum(map(len, everyone[:rank])) + j + 1 for j in range(len(shares))]
    lo, hi = shares[0][0], shares[-1][1]
    net = BookMLP(spec.sizes, spec.activation, lr=spec.lr, seed=spec.seed)
    exchange = GradientExchange(how) if world > 1 else None
    for i in range(spec.steps):
        x, target = make_batch(spec, i)
        loss = net.step(x[lo:hi], target[lo:hi], exchange, world)
    local = net.local_grads()
    remote = ([g for layer in net.layers for g in (layer.remote_grad_W, layer.remote_grad_b)]
              if world > 1 else [torch.zeros_like(g) for g in local])
    return {"micro": labels, "rows": (lo, hi), "loss": loss, "local": local, "remote": remote,
            "averaged": [(a + b) / world for a, b in zip(local, remote)],
            "received": exchange.received if exchange else {},
            "calls": exchange.stats.calls if exchange else 0,
            "weights": [t for layer in net.layers for t in (layer.W, layer.b)]}


@dataclass
class BookRun:
    """Figure 8-2 on real ranks: one dict per rank (see :func:`run_figure_8_2`) and a reference."""

    spec: TrainSpec
    how: str
    ranks: list[dict]
    reference: list[torch.Tensor]
    reference_grads: list[torch.Tensor]
    reference_loss: float

    @property
    def names(self) -> list[str]:
        return gpu_names(len(self.ranks))

    def max_difference(self) -> float:
        """Largest |weight of any replica - weight of the single process|."""
        return max(float((w - r).abs().max()) for run in self.ranks
                   for w, r in zip(run["weights"], self.reference))

    def replicas_identical(self) -> bool:
        """True when every replica holds bit-for-bit the same weights as rank 0."""
        return all(torch.equal(w, w0) for run in self.ranks[1:]
                   for w, w0 in zip(run["weights"], self.ranks[0]["weights"]))

    def table(self, item: int = 0, row: int = 0) -> str:
        """Per rank: micro-batches, loss, and one row of gradient ``item`` (0 is ∇W1)."""
        lines = []
        for name, run in zip(self.names, self.ranks):
            mb = ", ".join(f"x{j}" for j in run["micro"])
            first, stop = run["rows"]
            lines.append(f"{name}: micro-batches {mb} (samples {first}-{stop - 1}), "
                         f"local loss {run['loss']:.4f}")
            for key, label in (("local", "local ∇"), ("remote", "remote ∇"),
                               ("averaged", "averaged ∇"), ("weights", "W after")):
                lines.append(f"    {label:<11} {format_tensor(run[key][item][row])}")
        lines.append(f"one process, whole batch: loss {self.reference_loss:.4f}, "
                     f"W after {format_tensor(self.reference[item][row])}")
        return "\n".join(lines)


def run_figure_8_2(spec: TrainSpec = FIGURE_8_2, world_size: int = 2, how: str = "all_gather",
                   backend: str = "gloo") -> BookRun:
    """Run the book's data-parallel step on ``world_size`` ranks and one process; keep both."""
    from ..launch import run

    ranks = run(_book_rank, world_size, spec, how, backend=backend)
    net = BookMLP(spec.sizes, spec.activation, lr=spec.lr, seed=spec.seed)
    for i in range(spec.steps):
        loss = net.step(*make_batch(spec, i))
    return BookRun(spec, how, ranks, [t for layer in net.layers for t in (layer.W, layer.b)],
                   net.local_grads(), loss)


def format_tensor(t, digits: int = 4) -> str:
    """A tensor as a short, deterministic list of rounded numbers (no -0)."""
    return "[" + ", ".join(f"{round(float(v), digits) + 0.0:g}" for v in t.flatten().tolist()) + "]"


def figure_8_2(result: BookRun, item: int = 0):
    """Figure 8-2 for real: per GPU its micro-batches, local, remote, averaged ∇, new weights.

    A last column shows one process trained on the whole batch: its gradient is the
    average the replicas computed together, and its weights are theirs.
    """
    import matplotlib.pyplot as plt

    rows = [("local", "local ∇W1\n(own micro-batches)"), ("remote", "remote ∇W1\n(from peers)"),
            ("averaged", "(local + remote) / N"), ("weights", "W1 after the update")]
    n = len(result.ranks)
    everything = list(range(1, sum(len(r["micro"]) for r in result.ranks) + 1))
    columns = result.ranks + [{"micro": everything, "averaged": result.reference_grads,
                               "weights": result.reference}]
    titles = [f"{name}: full replica" for name in result.names] + ["one process, whole batch"]
    fig, axes = plt.subplots(len(rows) + 1, n + 1, figsize=(2.6 * (n + 1) + 1.2, 8.6),
                             squeeze=False, gridspec_kw={"height_ratios": [0.5] + [1] * len(rows)})
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
            bound = max(float(col[key][item].abs().max()) for col in columns if key in col) or 1.0
            ax.imshow(run[key][item].numpy(), cmap="RdBu_r", vmin=-bound, vmax=bound)
    if n == 2:
        axes[2][0].annotate("", xy=(1.05, 0.5), xycoords="axes fraction", xytext=(-0.05, 0.5),
                            textcoords=axes[2][1].transAxes,
                            arrowprops={"arrowstyle": "<->", "color": "#555555"})
        axes[2][0].text(1.8, 0.58, result.how, transform=axes[2][0].transAxes, ha="center",
                        fontsize=8, color="#555555")
    fig.suptitle(f"Figure 8-2 for real ({result.how}): {n} replicas; their weights equal one "
                 f"process's to {result.max_difference():.1e}", fontsize=10)
    fig.tight_layout()
    return fig


def loss_curves(runs: dict, reference_losses):
    """Loss per step for each world size (mean over ranks) against the single process."""
    import matplotlib.pyplot as plt

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


@figure("fig-8-02-data-parallel", "Figure 8-2 for real: A1 and A2, 4 + 4 micro-batches, gloo")
def _figure_8_2_default():
    return figure_8_2(run_figure_8_2())


# --------------------------------------------------------------------------- traffic (toy backend)


def gradient_bytes(spec: TrainSpec) -> int:
    """Bytes of one full set of gradients of the spec's model (= bytes of its weights)."""
    from ..data_parallel import make_model
    return sum(p.numel() * p.element_size() for p in make_model(spec).parameters())


def measure_traffic(spec: TrainSpec, world_size: int, algorithm: str):
    """Train ``spec`` on the toy backend; return (runs, bytes each rank sent per step).

    Only the gradient all-reduces count: the broadcast of rank 0's weights at the start
    happens once per run, not once per step.
    """
    from ..data_parallel import train_rank
    from ..traffic import run_with_traffic

    runs, log = run_with_traffic(train_rank, world_size, spec, algorithm=algorithm)
    sent = log.filter(op="all_reduce").per_rank()["sent"]
    return runs, [int(sent.get(r, 0)) // spec.steps for r in range(world_size)]


def traffic_table(spec: TrainSpec, world_sizes=(2, 4), algorithms=("ring", "naive")):
    """Measured bytes per rank per step against the closed form, for each N and algorithm."""
    import pandas as pd

    from ..data_parallel import max_difference, reference
    from ..traffic import allreduce_bytes_per_rank

    size, ref = gradient_bytes(spec), reference(spec)
    rows = []
    for n in world_sizes:
        for algorithm in algorithms:
            runs, sent = measure_traffic(spec, n, algorithm)
            formula = allreduce_bytes_per_rank(size, n, algorithm)
            error = max(max_difference(r.state, ref.state) for r in runs)
            for rank, name in enumerate(gpu_names(n)):
                rows.append({"ranks": n, "algorithm": algorithm, "GPU": name,
                             "sent per step (B)": sent[rank],
                             "closed form (B)": round(formula[rank], 1),
                             "weights = one process": error < 1e-6})
    return pd.DataFrame(rows)


def traffic_figure(table, gradient: int):
    """Bars: bytes each GPU sent per step, ring against naive, with 2(N-1)/N x gradient bytes."""
    import matplotlib.pyplot as plt

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
        ax.set_xticks(range(n), gpu_names(n))
        ax.set_title(f"N = {n}")
    axes[0][0].set_ylabel("bytes sent per training step")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(f"Gradient all-reduce traffic per GPU (gradient = {gradient} bytes)", fontsize=10)
    fig.tight_layout()
    return fig


def layer_traffic(spec: TrainSpec, batches=(8, 64)):
    """Per parameter tensor, bytes each of 2 ranks sends per step, for several batch sizes.

    With one all-reduce per tensor and a ring of 2, a rank sends exactly its tensor's bytes:
    C_out x C_in x 4 for a weight matrix, whatever the batch.
    """
    import pandas as pd

    from ..data_parallel import make_buckets, make_model, train_rank
    from ..traffic import run_with_traffic

    params = list(make_model(spec).named_parameters())
    order = [i for bucket in make_buckets([p for _, p in params]) for i in bucket]
    sent = {}
    for batch in batches:
        one = spec.replace(samples=batch, micro_batches=2, steps=1, bucket_cap_bytes=None)
        _, log = run_with_traffic(train_rank, 2, one, algorithm="ring")
        calls = log.filter(op="all_reduce", src=0)
        by_call = {}
        for rec in calls.records:
            by_call[rec.call] = by_call.get(rec.call, 0) + rec.nbytes
        sent[batch] = dict(zip(order, [by_call[c] for c in sorted(by_call)]))
    rows = []
    for i, (name, p) in enumerate(params):
        c_out, c_in = (tuple(p.shape) + (1,))[:2]
        row = {"tensor": name, "C_in": c_in if p.ndim == 2 else "-", "C_out": c_out,
               "C_in x C_out x 4 B": c_in * c_out * 4 if p.ndim == 2 else "-"}
        row.update({f"sent, batch {b} (B)": sent[b][i] for b in batches})
        rows.append(row)
    return pd.DataFrame(rows)


@figure("fig-02-traffic-per-rank", "Bytes per GPU per step: ring vs naive all-reduce (toy backend)")
def _traffic_default():
    spec = FIGURE_8_2.replace(bucket_cap_bytes=10**6)
    return traffic_figure(traffic_table(spec), gradient_bytes(spec))


# --------------------------------------------------------------------------- at cluster scale

#: Assumptions for the compute side of a step (the network side is :mod:`parlab.traffic`'s
#: alpha-beta model): an H100 SXM's dense BF16 peak, 40 % of it achieved (model FLOPs
#: utilization), and 8 sequences of 2048 tokens per GPU per step.
GPU_PEAK_FLOPS = 989e12
MFU = 0.4
TOKENS_PER_GPU = 8 * 2048
SCALES = [2 ** k for k in range(1, 15)]  # 2 ... 16384 GPUs


def compute_seconds(params: float, tokens: int = TOKENS_PER_GPU, peak: float = GPU_PEAK_FLOPS,
                    mfu: float = MFU) -> float:
    """Seconds of forward + backward per GPU: 6 FLOPs per parameter per token (2 + 4)."""
    return 6 * params * tokens / (peak * mfu)


def sync_cost(params: float, gpus: int, gbps: float, algorithm: str, dtype_bytes: int = 2):
    """(bytes through the busiest NIC, seconds) of one gradient all-reduce per step."""
    from ..topology import nic
    from ..traffic import allreduce_bytes_per_rank, allreduce_time

    size = params * dtype_bytes
    busiest = max(allreduce_bytes_per_rank(size, gpus, algorithm))
    return busiest, allreduce_time(size, gpus, algorithm, nic(gbps))


def scaling_figure(params: float, gpus: int, gbps: float, algorithm: str, dtype_bytes: int = 2,
                   label: str = ""):
    """Bytes per NIC per step and time per step as the cluster grows from 2 to 16384 GPUs."""
    import matplotlib.pyplot as plt

    from ..toy_backend import ALGORITHMS

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    size = params * dtype_bytes
    for k, alg in enumerate(ALGORITHMS):
        costs = [sync_cost(params, n, gbps, alg, dtype_bytes) for n in SCALES]
        style = {"lw": 2.5 if alg == algorithm else 1, "alpha": 1 if alg == algorithm else 0.5,
                 "color": rank_color(k)}
        left.plot(SCALES, [c[0] / 1e9 for c in costs], label=alg, **style)
        right.plot(SCALES, [c[1] for c in costs], label=f"communication, {alg}", **style)
    compute = compute_seconds(params)
    right.axhline(compute, color="black", ls="--", lw=1, label="compute (forward + backward)")
    left.axhline(2 * size / 1e9, color="gray", ls=":", lw=1, label="2 x gradient")
    busiest, seconds = sync_cost(params, gpus, gbps, algorithm, dtype_bytes)
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


def bucketing_table(params, gpus: int = 64, gbps: float = 400,
                    caps=(None, 2**20, 25 * 2**20, 2**40)):
    """All-reduce calls and modelled seconds per step for bucket caps (ring, NIC links).

    ``params`` are the model's parameter tensors (meta tensors are fine: only sizes count).
    """
    import pandas as pd

    from ..data_parallel import make_buckets
    from ..topology import nic
    from ..traffic import allreduce_steps, allreduce_time

    link, rows = nic(gbps), []
    for cap in caps:
        buckets = make_buckets(params, cap)
        sizes = [sum(params[i].numel() * params[i].element_size() for i in b) for b in buckets]
        seconds = sum(allreduce_time(s, gpus, "ring", link) for s in sizes)
        latency = len(buckets) * allreduce_steps(gpus, "ring") * link.alpha
        rows.append({"bucket cap": "one per tensor" if cap is None else
                     ("everything" if cap >= sum(sizes) else f"{cap / 2**20:.3g} MiB"),
                     "all-reduce calls": len(buckets), "modelled ms": round(seconds * 1e3, 3),
                     "of which latency ms": round(latency * 1e3, 3)})
    return pd.DataFrame(rows)


@figure("fig-02-traffic-scaling", "Data-parallel traffic and time per step from 2 to 16384 GPUs")
def _scaling_default():
    from ..models import GPT3_175B, count_parameters
    return scaling_figure(count_parameters(GPT3_175B)["total"], 1024, 400, "ring",
                          label="GPT-3 175B")
