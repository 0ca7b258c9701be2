"""The slides' CNN recipe run for real: data parallel convolutions, tensor parallel FC layers.

Each rank keeps a full copy of the (small) convolution weights and runs the convolutions on
its own slice of the batch, as in data parallelism. The (large) fully connected layers are
split instead: ``fc1`` by output neurons (column parallel), ``fc2`` by input neurons (row
parallel), as in Megatron's MLP. Between the two halves the ranks all-gather the batch's
conv features, so every rank can feed the whole batch to its slice of ``fc1``.

Gradients, and why they come out right:

- every rank computes the same loss (the mean over the whole batch) from the same logits;
- the all-gather of features has a reduce-scatter as its backward, so each rank receives
  the full gradient for *its own* samples' features, summed over the ranks' FC slices;
- the convolution gradients of a rank then cover its samples only, so the ranks *sum* them
  (all-reduce) - no division, because the loss is already the mean over the whole batch;
- ``fc1`` and ``fc2`` slices get exactly their part of the full gradient, with no exchange.

:func:`hybrid_step` runs on each rank; :func:`reference_step` is the single-process step
it must equal.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from parlab.comm import Mesh
from parlab.models import SmallCNN
from parlab.tensor_parallel import gather_for_use, reduce_from_region

__all__ = ["make_batch", "reference_step", "hybrid_step", "CONV_LAYERS"]

CONV_LAYERS = ("conv1", "conv2", "conv3", "conv4", "conv5")


def make_batch(batch: int, seed: int = 0, classes: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """A deterministic batch of 3x32x32 images and class labels."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, 32, 32, generator=g), torch.randint(0, classes, (batch,), generator=g)


def _model(seed: int, width: int, hidden: int) -> SmallCNN:
    torch.manual_seed(seed)
    return SmallCNN(width=width, hidden=hidden)


def reference_step(batch: int = 8, lr: float = 0.1, seed: int = 0, width: int = 8,
                   hidden: int = 64) -> dict[str, torch.Tensor]:
    """One SGD step of the whole model on one process; returns every parameter after it."""
    model = _model(seed, width, hidden)
    x, y = make_batch(batch, seed)
    F.cross_entropy(model(x), y).backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def hybrid_step(batch: int = 8, lr: float = 0.1, seed: int = 0, width: int = 8,
                hidden: int = 64) -> dict[str, torch.Tensor]:
    """One SGD step on this rank of the hybrid; returns this rank's parameters after it.

    Convolution weights come back whole (every rank holds the same copy); ``fc1.weight``
    and ``fc1.bias`` as this rank's rows, ``fc2.weight`` as its columns, ``fc2.bias`` whole.
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    if batch % world:
        raise ValueError(f"batch={batch} does not split over {world} ranks; use a multiple of {world}")
    if hidden % world:
        raise ValueError(f"hidden={hidden} neurons do not split over {world} ranks; "
                         f"use a multiple of {world}")
    # the same ranks play both roles: a tensor mesh for the FC layers and a data mesh for
    # the convolutions, each with its own labelled group, so a traffic log (toy backend)
    # tells the tensor-parallel bytes from the data-parallel ones
    tensor_group = Mesh(tp=world).new_groups(kinds=("tensor",))["tensor"]
    data_group = Mesh(dp=world).new_groups(kinds=("data",))["data"]
    model = _model(seed, width, hidden)  # same seed: every rank starts from the same weights
    rows = slice(rank * hidden // world, (rank + 1) * hidden // world)
    w1 = model.fc1.weight.detach()[rows].clone().requires_grad_()
    b1 = model.fc1.bias.detach()[rows].clone().requires_grad_()
    w2 = model.fc2.weight.detach()[:, rows].clone().requires_grad_()
    b2 = model.fc2.bias.detach().clone().requires_grad_()

    x, y = make_batch(batch, seed)
    mine = slice(rank * batch // world, (rank + 1) * batch // world)
    features = gather_for_use(model.features(x[mine]), dim=0, group=tensor_group)  # whole batch
    hidden_slice = torch.relu(features @ w1.T + b1)                       # column parallel fc1
    logits = reduce_from_region(hidden_slice @ w2.T, group=tensor_group) + b2  # row parallel fc2
    F.cross_entropy(logits, y).backward()

    convs = [p for name in CONV_LAYERS for p in getattr(model, name).parameters()]
    for p in convs:
        dist.all_reduce(p.grad, group=data_group)  # each rank's share covers its samples: sum
    with torch.no_grad():
        for p in convs + [w1, b1, w2, b2]:
            p -= lr * p.grad
    result = {name: p.detach().clone() for name, p in model.named_parameters()
              if name.split(".")[0] in CONV_LAYERS}
    result.update({"fc1.weight": w1.detach(), "fc1.bias": b1.detach(),
                   "fc2.weight": w2.detach(), "fc2.bias": b2.detach()})
    return result
