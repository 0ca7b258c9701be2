"""The slides' CNN recipe run for real: data parallel convolutions, tensor parallel FC layers.

Composed from the two strategies, on the same ranks in two roles:

- **data parallel** convolutions: each rank keeps a full copy of the (small) convolution
  weights and runs them on its own slice of the batch; the ranks then *sum* the convolution
  gradients with chapter 02's :func:`parlab.data_parallel.all_reduce_buckets` (no division:
  the loss is already the mean over the whole batch, and each rank's share covers its own
  samples);
- **tensor parallel** FC layers: ``fc1`` becomes a
  :class:`~parlab.tensor_parallel.ColumnParallelLinear` (output neurons split) and ``fc2`` a
  :class:`~parlab.tensor_parallel.RowParallelLinear` (input neurons split), Megatron's MLP.
  ``fc1`` takes its input *split by samples* (``sequence_parallel=True``): it all-gathers
  the batch's conv features in forward (keeping only its own samples' for the backward
  pass, which gathers them again for the weight gradient), and its backward reduce-scatters
  their gradient, so each rank receives the full gradient for its own samples' features,
  summed over the ranks' FC slices. The FC slices get exactly their part of the full gradient.

Each role has its own ``DeviceMesh`` over the same ranks (:meth:`parlab.comm.Mesh.build`),
so on the toy backend the log tells the tensor-parallel bytes ("tensor") from the
data-parallel ones ("data"). :func:`hybrid_step` runs on each rank; :func:`reference_step`
is the single-process step it must equal.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from parlab.comm import Mesh
from parlab.data_parallel import all_reduce_buckets
from parlab.models import SmallCNN
from parlab.tensor_parallel import ColumnParallelLinear, RowParallelLinear

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
    tp_mesh, dp_mesh = Mesh(tp=world), Mesh(dp=world)  # the same ranks, two roles
    tensor_group = tp_mesh.groups(tp_mesh.build())["tensor"]
    data_group = dp_mesh.groups(dp_mesh.build())["data"]
    model = _model(seed, width, hidden)  # same seed: every rank starts from the same weights
    fc1 = ColumnParallelLinear.from_linear(model.fc1, gather_output=False, group=tensor_group,
                                           name="fc1", sequence_parallel=True)
    fc2 = RowParallelLinear.from_linear(model.fc2, input_is_parallel=True, group=tensor_group,
                                        name="fc2")

    x, y = make_batch(batch, seed)
    mine = slice(rank * batch // world, (rank + 1) * batch // world)
    logits = fc2(torch.relu(fc1(model.features(x[mine]))))  # every rank: the whole batch's
    F.cross_entropy(logits, y).backward()

    convs = [p for name in CONV_LAYERS for p in getattr(model, name).parameters()]
    all_reduce_buckets([p.grad for p in convs], average=False, group=data_group)
    with torch.no_grad():
        for p in convs + list(fc1.parameters()) + list(fc2.parameters()):
            p -= lr * p.grad
    result = {name: p.detach().clone() for name, p in model.named_parameters()
              if name.split(".")[0] in CONV_LAYERS}
    result.update({"fc1.weight": fc1.weight.detach(), "fc1.bias": fc1.bias.detach(),
                   "fc2.weight": fc2.weight.detach(), "fc2.bias": fc2.bias.detach()})
    return result
