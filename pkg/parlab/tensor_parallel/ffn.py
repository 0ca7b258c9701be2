"""Figure 8-19: a feed-forward network on 6 GPUs, tensor parallel in each stage, pipelined across.

Why this module exists: the figure combines both kinds of model parallelism. Each layer is
a pipeline stage on its own server, and inside the stage the layer's neurons are split
between the server's two GPUs (tensor parallelism over NVLink). With the book's sizes:

    stage H1 (server 1): neurons 1-3 on A1, 4-6 on B1
    stage H2 (server 2): neurons 1-2 on A2, 3-4 on B2
    stage Out (server 3): neuron 1 on A3, 2 on B3

Forward, per micro-batch (the book's context vectors C1, C2 ...): each GPU computes its
neurons from the stage's whole input, the two halves are all-gathered inside the server
(NVLink), and each GPU sends the assembled output to the GPU of the next stage on its own
rail (A1 -> A2 -> A3 on rail 1, B1 -> B2 -> B3 on rail 2), so no packet crosses the spine.

Backward: the error E = dLoss/dz of a GPU's neurons gives its weight gradients locally.
The error for the previous stage's outputs is a sum over *all* this stage's neurons, half
of them on the partner GPU, so the partners all-reduce their contributions (NVLink) and
each sends the sum back along its rail. That all-reduce is the synchronization this
network needs: its weight gradients need none, since every weight lives on exactly one
GPU (the chapter all-reduces them, a slip). With data-parallel replicas (chapter 03) the
replicas' gradients of the same weights would be summed.

Ranks are numbered server by server (rank = 2 x stage + position), which makes
:func:`parlab.comm.topology.gpu_name` give exactly the figure's names.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from parlab.models import ACTIVATIONS, BookMLP
from parlab.tensor_parallel.sharding import ShardSpec, shard_spec
from parlab.comm import Mesh, gpu_name, link_type
from parlab.tensor_parallel.mappings import all_gather_cat
from parlab.checks import check_count

__all__ = ["FIGURE_8_19_SIZES", "Placement", "layout", "ffn_rank", "ffn_data", "link_of",
           "reference_ffn", "check_ffn_run"]

#: Input width (the context vector, our choice), then H1, H2 and the output layer as drawn.
FIGURE_8_19_SIZES = (4, 6, 4, 2)
_LAYER_NAMES = ("H1", "H2", "Out")


@dataclass(frozen=True)
class Placement:
    """Where one rank sits in the figure: its GPU, stage, layer and the neurons it owns."""

    rank: int
    gpu: str
    stage: int
    position: int
    layer: str
    spec: ShardSpec

    @property
    def neurons(self) -> tuple[int, int]:
        """First and last neuron, counted from 1 as in the book."""
        return self.spec.start + 1, self.spec.stop

    def __str__(self) -> str:
        first, last = self.neurons
        which = f"neuron {first}" if first == last else f"neurons {first}-{last}"
        return f"{self.gpu} (rank {self.rank}): {self.layer} {which} of {self.spec.shape[0]}"


def _layer_name(stage: int, stages: int) -> str:
    if stage == stages - 1:
        return "Out"
    return _LAYER_NAMES[stage] if stage < 2 else f"H{stage + 1}"


def layout(sizes=FIGURE_8_19_SIZES, tensor: int = 2) -> list[Placement]:
    """Every rank's :class:`Placement`: one stage per layer, ``tensor`` GPUs per stage.

    Raises ValueError when a layer cannot be split ``tensor`` ways (more ranks than
    neurons, or a degree that does not divide the layer).
    """
    sizes = tuple(sizes)
    if len(sizes) < 2 or any(isinstance(n, bool) or not isinstance(n, int) or n < 1
                             for n in sizes):
        raise ValueError(f"sizes must be positive ints, input width first, got {sizes}")
    check_count("tensor", tensor)  # GPUs per stage: checked here, not as each layer's "parts"
    stages = len(sizes) - 1
    places = []
    for stage, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
        name = _layer_name(stage, stages)
        try:
            specs = shard_spec(f"W {name}", (n_out, n_in), "neurons", tensor)
        except ValueError as err:
            raise ValueError(f"layer {name} ({n_out} neurons): {err}") from None
        for position, spec in enumerate(specs):
            rank = stage * tensor + position
            gpu = gpu_name(rank, tensor)
            places.append(Placement(rank, gpu, stage, position, name, replace(spec, owner=gpu)))
    return places


def link_of(src: int, dst: int, tensor: int = 2) -> str:
    """The link a transfer between two ranks of the layout uses: nvlink, rail or spine."""
    return link_type(src, dst, tensor)


def check_ffn_run(batch: int, micro_batches: int, activation: str) -> None:
    """Raise ValueError unless ``batch`` samples split into ``micro_batches`` and ``activation``
    is known: checked by :func:`ffn_rank` and, before any rank starts, by ``run_ffn``."""
    check_count("batch", batch)
    check_count("micro_batches", micro_batches)
    if batch % micro_batches:
        raise ValueError(f"batch={batch} does not split into micro_batches={micro_batches} "
                         f"equal micro-batches; use a divisor of {batch}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; choose one of {list(ACTIVATIONS)}")


def ffn_data(sizes=FIGURE_8_19_SIZES, batch: int = 4, seed: int = 0):
    """The experiment's input context vectors and targets (the same on every rank)."""
    check_count("batch", batch)
    g = torch.Generator().manual_seed(seed + 7)
    return torch.randn(batch, sizes[0], generator=g), torch.randn(batch, sizes[-1], generator=g)


def ffn_rank(sizes=FIGURE_8_19_SIZES, tensor: int = 2, batch: int = 4, micro_batches: int = 2,
             activation: str = "relu", seed: int = 0, marks=None) -> dict:
    """One rank's forward and backward through Figure 8-19's network (GPipe order).

    ``marks`` (optional) is called with no argument once the process groups exist and again
    between forward and backward, so a caller can split a traffic log there. Returns the
    rank's placement, its weight and bias
    gradients, and, on the last stage, the output; on the first, dLoss/dx.
    """
    places = layout(sizes, tensor)
    stages = len(sizes) - 1
    if dist.get_world_size() != len(places):
        raise ValueError(f"Figure 8-19's layout of {sizes} with {tensor} GPUs per stage needs "
                         f"{len(places)} ranks, got {dist.get_world_size()}")
    check_ffn_run(batch, micro_batches, activation)
    me = places[dist.get_rank()]
    # every stage's tensor group (its NVLink domain), then the pipeline of each GPU position
    mesh = Mesh(pp=stages, tp=tensor)
    groups = mesh.groups(mesh.build(
        label=lambda kind, first: (f"{_layer_name(first.stage, stages)} tensor" if kind == "tensor"
                                   else f"pipeline {gpu_name(first.tensor, tensor)[0]}")))
    if marks:
        marks()
    group, rail = groups["tensor"], groups["pipeline"]
    prev_rank, next_rank = me.rank - tensor, me.rank + tensor
    first, last = me.stage == 0, me.stage == stages - 1

    mlp = BookMLP(sizes, activation, seed=seed)
    full = mlp.layers[me.stage]
    W, b = me.spec.take(full.W), full.b[me.spec.start:me.spec.stop].clone()
    f, f_prime = ACTIVATIONS["identity" if last else activation]
    x, target = ffn_data(sizes, batch, seed)
    xs, targets = x.chunk(micro_batches), target.chunk(micro_batches)

    saved, outputs = [], []
    for mb in range(micro_batches):  # forward: C1, then C2, ... through the pipeline
        y_in = xs[mb] if first else torch.empty(xs[mb].shape[0], sizes[me.stage])
        if not first:
            dist.recv(y_in, src=prev_rank, group=rail)
        z = y_in @ W.T + b
        y_local = f(z)
        y = all_gather_cat(y_local, -1, group)  # the stage's whole output (NVLink)
        if not last:
            dist.send(y, dst=next_rank, group=rail)  # to the next stage on my rail
        else:
            outputs.append(y)
        saved.append((y_in, z, y_local, y))
    if marks:
        marks()

    grad_W, grad_b, dx = torch.zeros_like(W), torch.zeros_like(b), []
    for mb in range(micro_batches):  # backward: errors flow back, stage by stage
        y_in, z, y_local, y = saved[mb]
        if last:
            dloss_dy = 2 * (y - targets[mb]) / target.numel()  # MSE over the whole batch
        else:
            dloss_dy = torch.empty(y.shape)
            dist.recv(dloss_dy, src=next_rank, group=rail)
        E = dloss_dy[:, me.spec.start:me.spec.stop] * f_prime(z, y_local)  # my neurons' errors
        grad_W += E.T @ y_in
        grad_b += E.sum(0)
        dloss_dy_in = E @ W  # my neurons' share of the error of the stage's input
        dist.all_reduce(dloss_dy_in, group=group)  # plus the partner's share (NVLink)
        if first:
            dx.append(dloss_dy_in)
        else:
            dist.send(dloss_dy_in, dst=prev_rank, group=rail)
    return {"placement": me, "grad_W": grad_W, "grad_b": grad_b,
            "output": torch.cat(outputs) if last else None,
            "x.grad": torch.cat(dx) if first else None}


def reference_ffn(sizes=FIGURE_8_19_SIZES, batch: int = 4, activation: str = "relu",
                  seed: int = 0) -> dict:
    """The single-device network (:class:`parlab.models.BookMLP`) on the same data."""
    mlp = BookMLP(sizes, activation, seed=seed)
    x, target = ffn_data(sizes, batch, seed)
    out = mlp.forward(x)
    mlp.backward(target)
    net = mlp.to_torch()
    x_leaf = x.clone().requires_grad_()
    ((net(x_leaf) - target) ** 2).mean().backward()
    result = {"output": out, "x.grad": x_leaf.grad}
    for i, layer in enumerate(mlp.layers):
        result[f"layer{i + 1}.W.grad"] = layer.local_grad_W
        result[f"layer{i + 1}.b.grad"] = layer.local_grad_b
    return result
