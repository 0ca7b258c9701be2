"""The Megatron MLP on real ranks two ways, ours and PyTorch's, beside the single-device MLP.

Why this module exists: chapter 04 builds the column-then-row MLP by hand
(:class:`parlab.tensor_parallel.TensorParallelMLP`: the f and g operators of
:mod:`parlab.tensor_parallel.mappings` around two sharded linear layers), and PyTorch
ships the same split as a plan, ``ColwiseParallel`` then ``RowwiseParallel``
(:func:`parlab.tensor_parallel.dtensor_mlp`). :func:`run_mlp` runs either on the same
weights, input and loss, merges each rank's gradient shards back into whole gradients and
compares them with ``parlab.models.MLP`` on one device. With ``backend="toy"`` the traffic
comes back split into forward and backward, for both variants alike; for PyTorch's variant
:class:`parlab.tensor_parallel.debug.CommBytes` (PyTorch's ``CommDebugMode``) also reports which
collectives DTensor issued, from which layer, and how big their tensors were.
"""

from __future__ import annotations

import contextlib

import torch

from parlab.launch import run
from parlab.experiments.ch04_layers import _collect, _forward_backward, _generator
from parlab.models import MLP
from parlab.tensor_parallel import (
    check_degree, dtensor_local_grads, dtensor_mlp, TensorParallelMLP
)
from parlab.checks import check_count

__all__ = ["MLP_VARIANTS", "run_mlp", "mlp_rank"]

#: The two ways chapter 04 splits the feed-forward layer (column-parallel, then row-parallel).
MLP_VARIANTS = {
    "megatron": "ours: ColumnParallelLinear fc1, RowParallelLinear fc2 (parlab.tensor_parallel)",
    "pytorch": "torch.distributed.tensor.parallel: ColwiseParallel fc1, RowwiseParallel fc2",
}


def _mlp_setup(d_model, d_ff, batch, seq, seed):
    torch.manual_seed(seed)
    mlp = MLP(d_model, d_ff)
    g = _generator(seed + 1)
    return mlp, torch.randn(batch, seq, d_model, generator=g), torch.randn(batch, seq, d_model,
                                                                          generator=g)


def mlp_rank(variant, d_model, d_ff, batch, seq, seed) -> dict:
    """One rank of :func:`run_mlp`: build the variant from the full MLP, forward, backward."""
    from parlab.tensor_parallel.debug import CommBytes  # (a second and a half to import)

    mlp, x, weight = _mlp_setup(d_model, d_ff, batch, seq, seed)
    x.requires_grad_()
    if variant == "megatron":
        layer, comm = TensorParallelMLP.from_mlp(mlp), None
    else:
        # PyTorch's view of DTensor's collectives
        layer, comm = dtensor_mlp(mlp), CommBytes()
    with comm if comm is not None else contextlib.nullcontext():
        out, phases = _forward_backward(layer, x, weight)
    if variant == "megatron":
        grads = {"fc1.weight": (layer.fc1.weight.grad, layer.fc1.spec),
                 "fc1.bias": (layer.fc1.bias.grad, layer.fc1.spec.bias()),
                 "fc2.weight": (layer.fc2.weight.grad, layer.fc2.spec),
                 "fc2.bias": (layer.fc2.bias.grad, None)}
    else:
        grads = dtensor_local_grads(layer)
    seen = comm.report() if comm is not None else dict.fromkeys(CommBytes.REPORT)
    return {"output": out.detach(), "x.grad": x.grad, "grads": grads,
            "specs": {name: spec for name, (_, spec) in grads.items()},
            "traffic": phases.result(), "comm": seen}


def run_mlp(d_model: int = 8, d_ff: int = 32, batch: int = 2, seq: int = 4, world_size: int = 2,
            backend: str = "gloo", seed: int = 0, variant: str = "megatron"):
    """The column-then-row MLP on ``world_size`` ranks next to ``parlab.models.MLP`` on one device.

    ``variant`` is one of :data:`MLP_VARIANTS`: ``"megatron"`` (our layers) or ``"pytorch"``
    (``parallelize_module`` with ``ColwiseParallel`` and ``RowwiseParallel``, on a backend
    whose groups have names: gloo, nccl or toy). Returns a
    :class:`parlab.experiments.Comparison`; its ``info`` holds each rank's ``specs`` and,
    for PyTorch's variant, what :class:`parlab.tensor_parallel.debug.CommBytes` saw on rank 0
    (``collectives``, ``comm_counts``, ``comm_table``; None for ours).
    """
    if variant not in MLP_VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose one of {list(MLP_VARIANTS)}")
    for name, value in (("d_model", d_model), ("batch", batch), ("seq", seq)):
        check_count(name, value)
    check_degree(world_size, d_ff, "hidden neurons of the MLP (d_ff)", "world_size")
    results = run(mlp_rank, world_size, variant, d_model, d_ff, batch, seq, seed, backend=backend)
    mlp, x, weight = _mlp_setup(d_model, d_ff, batch, seq, seed)
    x.requires_grad_()
    out = mlp(x)
    (out * weight).sum().backward()
    reference = {"output": out.detach(), "x.grad": x.grad}
    reference.update({f"{n}.grad": p.grad for n, p in mlp.named_parameters()})
    info = {"world_size": world_size, "specs": [r["specs"] for r in results],
            **results[0]["comm"]}
    return _collect(results, reference, f"{variant} mlp", info)
