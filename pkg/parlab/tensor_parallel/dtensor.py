"""PyTorch's own tensor-parallel API (``torch.distributed.tensor.parallel``) on chapter 04's layers.

Why this module exists: parlab writes the Megatron split out by hand (column- and
row-parallel layers in :mod:`parlab.tensor_parallel.layers`), and PyTorch ships the same
split as a *plan* applied to an ordinary module: ``parallelize_module(module, mesh,
{"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})`` replaces the named layers' weights
by DTensors (a local shard plus its placement on a DeviceMesh) and inserts the collectives
at the layers' edges. Putting both side by side on the same weights shows that they are one
idea: the same slices, the same collectives, the same bytes.

- :func:`dtensor_mlp`: a copy of an MLP with ``ColwiseParallel`` on its first linear layer
  and ``RowwiseParallel`` on its second (:func:`parlab.tensor_parallel.dtensor_attention`
  does the same for self-attention).
- :func:`dtensor_local_grads`: each rank's gradient shards, with the ShardSpec a test
  needs to glue them back into the single-device gradients.
- :func:`collective_wire_bytes`: what the collectives that :class:`~parlab.tensor_parallel.debug.CommBytes` saw put on
  the wire (:mod:`parlab.tensor_parallel.comm_bytes`).
"""

from __future__ import annotations

import copy

from torch import nn

from parlab.comm import default_mesh
from parlab.tensor_parallel.sharding import check_degree, shard_spec

__all__ = ["dtensor_mlp", "dtensor_local_grads", "collective_wire_bytes"]


def _linear(module: nn.Module, name: str, role: str) -> nn.Linear:
    child = dict(module.named_modules()).get(name)
    if not isinstance(child, nn.Linear):
        linears = [n for n, m in module.named_modules() if isinstance(m, nn.Linear)]
        raise ValueError(f"{role}={name!r} is not an nn.Linear of the module; its linear "
                         f"layers are {linears}")
    return child


def dtensor_mlp(mlp: nn.Module, mesh=None, column: str = "fc1", row: str = "fc2") -> nn.Module:
    """A copy of ``mlp`` parallelized by PyTorch's API: ``column`` colwise, ``row`` rowwise.

    ``ColwiseParallel`` shards the first layer's weight by output features (``Shard(0)`` of
    ``nn.Linear.weight``, Megatron's column-parallel A) and its bias alike; the activation
    between the layers stays a local shard. ``RowwiseParallel`` shards the second layer's
    weight by input features (``Shard(1)``) and all-reduces its partial outputs (Megatron's
    ``g``); its bias is replicated and added once. In the backward pass the first layer's
    replicated input receives partial gradients, which are all-reduced (Megatron's ``f``).
    ``column`` and ``row`` name the two layers (``"0"`` and ``"2"`` in an ``nn.Sequential``);
    ``mesh`` defaults to :func:`parlab.comm.default_mesh`. Every rank passes the same full ``mlp``.
    """
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    hidden = _linear(mlp, column, "column").out_features
    if _linear(mlp, row, "row").in_features != hidden:
        raise ValueError(f"{column!r} gives {hidden} features but {row!r} takes "
                         f"{_linear(mlp, row, 'row').in_features}: they are not one MLP")
    mesh = default_mesh() if mesh is None else mesh
    check_degree(mesh.size(), hidden, "hidden neurons of the MLP (d_ff)")
    return parallelize_module(copy.deepcopy(mlp), mesh,
                              {column: ColwiseParallel(), row: RowwiseParallel()})


def dtensor_local_grads(module: nn.Module) -> dict:
    """``{name: (local gradient, ShardSpec or None)}`` from a DTensor-parallel module's gradients.

    Reads each gradient's local shard and placement (no collective, so nothing is added to
    a traffic log): ``Shard(d)`` becomes a ShardSpec along dim d, ``Replicate`` None.
    """
    from torch.distributed.tensor import Replicate, Shard
    out = {}
    for name, param in module.named_parameters():
        grad = param.grad
        placement = grad.placements[0]
        if isinstance(placement, Replicate):
            out[name] = (grad.to_local(), None)
        elif isinstance(placement, Shard):
            kind = "rows" if placement.dim == 0 else "columns"
            spec = shard_spec(name, tuple(grad.shape), kind, grad.device_mesh.size(),
                              dim=placement.dim)[grad.device_mesh.get_local_rank()]
            out[name] = (grad.to_local(), spec)
        else:
            raise ValueError(f"{name}: unexpected gradient placement {placement}")
    return out


def collective_wire_bytes(collectives: dict, n: int) -> dict:
    """``{phase: bytes}`` on the wire for ``{phase: [(op, payload bytes)]}`` (ring algorithms)."""
    from parlab.comm import ring_wire_bytes
    return {phase: sum(ring_wire_bytes(op, payload, n) for op, payload in records)
            for phase, records in collectives.items()}
