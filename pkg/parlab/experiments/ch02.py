"""Chapter 02's experiments: Figure 8-2 run for real, A1 and A2 each with the whole model and
half of the batch, and the chapter's figures and step explorer.

:func:`run_figure_8_2` trains :class:`parlab.models.BookMLP` that way on real ranks and keeps,
per rank, what the figure names: its micro-batches, its local gradients, the gradients that
came from the peer, the average, and the weights after the update, next to one process
trained on the whole batch (:class:`BookRun`). :func:`two_gpu_links` puts the same
two-GPU exchange on each link of a rail-optimized cluster. :func:`parlab.viz.plots.figure_8_2` draws it. The figure recipes run (or model) here and
hand the results to :mod:`parlab.viz.plots`, which only draws.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from parlab.checks import check_choice, check_count, check_positive_number
from parlab.comm import allreduce_bytes_per_rank, allreduce_time, rail_optimized
from parlab.data_parallel import (
    GradientExchange, gradient_bytes, make_batch, replica_names, split_batch, sync_scaling,
    traffic_table, TrainSpec
)
from parlab.hardware import NIC_GBPS
from parlab.launch import run
from parlab.models import BookMLP, GPT3_175B, count_parameters
from parlab.viz import Explorer, explore, figure
from parlab.viz.plots import figure_8_2, scaling_figure, traffic_figure

__all__ = ["FIGURE_8_2", "BookRun", "run_figure_8_2", "format_tensor", "draw_book_step",
           "book_step_explorer", "two_gpu_links"]


#: The run of Figure 8-2: 8 micro-batches of 2 samples, split 4 + 4 over A1 and A2.
FIGURE_8_2 = TrainSpec(sizes=(4, 6, 6, 2), samples=16, micro_batches=8, lr=0.1, steps=1)


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
        return replica_names(len(self.ranks))

    def max_difference(self) -> float:
        """Largest ``|weight of any replica - weight of the single process|``."""
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
    GradientExchange(how)  # its checks of how and split_batch's, before any rank starts
    split_batch(spec.samples, spec.micro_batches, world_size)

    ranks = run(_book_rank, world_size, spec, how, backend=backend)
    net = BookMLP(spec.sizes, spec.activation, lr=spec.lr, seed=spec.seed)
    for i in range(spec.steps):
        loss = net.step(*make_batch(spec, i))
    return BookRun(spec, how, ranks, [t for layer in net.layers for t in (layer.W, layer.b)],
                   net.local_grads(), loss)


def format_tensor(t, digits: int = 4) -> str:
    """A tensor as a short, deterministic list of rounded numbers (no -0)."""
    return "[" + ", ".join(f"{round(float(v), digits) + 0.0:g}" for v in t.flatten().tolist()) + "]"


# --------------------------------------------------------------------------- explorer and figures


def draw_book_step(ranks: int, how: str, steps: int):
    """Run Figure 8-2's step on ``ranks`` real ranks (gloo), print the table, draw the figure."""
    result = run_figure_8_2(FIGURE_8_2.replace(steps=steps), world_size=ranks, how=how)
    print(result.table())
    print(f"replicas equal one process (to 1e-6): {result.max_difference() < 1e-6}; "
          f"replicas bit-for-bit identical: {result.replicas_identical()}")
    return figure_8_2(result)


def book_step_explorer(ranks: int = 2, how: str = "all_gather",
                       steps: int = FIGURE_8_2.steps, shown_above: bool = False) -> Explorer:
    """Replicas (1, 2, 4), the exchange (all_gather or all_reduce), and training steps.

    The defaults are :func:`run_figure_8_2`'s, so the explorer opens on the step the chapter
    draws just above it; ``shown_above`` says the page shows that run already, which is then
    neither run nor drawn again until a control moves (:func:`parlab.viz.explore`).
    """
    import ipywidgets as w

    check_choice("ranks", ranks, (1, 2, 4))
    GradientExchange(how)  # checks how
    if not (check_count("steps", steps) <= 10):
        raise ValueError(f"steps must be at most 10 (the slider's range), got {steps!r}")
    controls = {
        "ranks": w.Dropdown(options=[1, 2, 4], value=ranks, description="replicas"),
        "how": w.Dropdown(options=["all_gather", "all_reduce"], value=how,
                          description="exchange"),
        "steps": w.IntSlider(value=steps, min=1, max=10, description="steps"),
    }
    return explore(draw_book_step, controls, "Figure 8-2 on real ranks (replicas, exchange, steps)",
                   shown_above=shown_above)


def two_gpu_links(nbytes: float, nic_gbps: float = NIC_GBPS,
                  gpus_per_server: int = 8):
    """Figure 8-2's exchange, a ring all-reduce of ``nbytes`` between two GPUs, on each path of
    a rail-optimized cluster (two servers of ``gpus_per_server`` GPUs, NVLink inside, one NIC
    per GPU).

    One ``pandas.DataFrame`` row per pair: the link the topology gives it, its speed each
    way, the bytes each GPU's NIC sends (and receives), the modelled time
    (:func:`parlab.comm.allreduce_time`), and the share of that time each GPU's port is busy
    sending, while it receives as much.
    """
    check_positive_number("nbytes", nbytes, "the gradient's size in bytes")
    cluster = rail_optimized(servers=2, gpus_per_server=gpus_per_server, nic_gbps=nic_gbps)
    sent = allreduce_bytes_per_rank(nbytes, 2)[0]
    rows = []
    for a, b, where in (("A1", "B1", "one server"), ("A1", "A2", "two servers, one rail"),
                        ("A1", "B2", "two servers, two rails")):
        link = cluster.link(a, b)
        seconds = allreduce_time(nbytes, 2, "ring", link)
        rows.append({"pair": f"{a}-{b}", "where": where, "link": cluster.link_type(a, b),
                     "GB/s each way": link.bandwidth / 1e9,
                     "bytes through each NIC": 0 if link.name == "nvlink" else round(sent),
                     "all-reduce (ms)": round(seconds * 1e3, 2),
                     "port busy (%)": round(100 * sent / link.bandwidth / seconds, 1)})
    import pandas as pd  # (0.4 s to import: only where a table is made)

    return pd.DataFrame(rows)


@figure("fig-8-02-data-parallel", "Figure 8-2 for real: A1 and A2, 4 + 4 micro-batches, gloo")
def _figure_8_2_default():
    return figure_8_2(run_figure_8_2())


@figure("fig-02-traffic-per-rank", "Bytes per GPU per step: ring vs naive all-reduce (toy backend)")
def _traffic_default():
    spec = FIGURE_8_2.replace(bucket_cap_bytes=10**6)
    return traffic_figure(traffic_table(spec), gradient_bytes(spec))


@figure("fig-02-traffic-scaling", "Data-parallel traffic and time per step from 2 to 16384 GPUs")
def _scaling_default():
    scaling = sync_scaling(count_parameters(GPT3_175B)["total"], 1024, 400, "ring")
    return scaling_figure(scaling, label="GPT-3 175B")
