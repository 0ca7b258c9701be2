"""PyTorch's own tensor-parallel API (``torch.distributed.tensor.parallel``) on chapter 04's layers.

Why this module exists: parlab writes the Megatron split out by hand (column- and
row-parallel layers in :mod:`parlab.tensor_parallel.layers`), and PyTorch ships the same
split as a *plan* applied to an ordinary module: ``parallelize_module(module, mesh,
{"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})`` replaces the named layers' weights
by DTensors (a local shard plus its placement on a DeviceMesh) and inserts the collectives
at the layers' edges. Putting both side by side on the same weights shows that they are one
idea: the same slices, the same collectives, the same bytes.

- :func:`default_mesh`: a 1-D DeviceMesh over every rank, with a clear error on a backend
  whose groups have no name (DeviceMesh needs one).
- :func:`dtensor_mlp`: a copy of an MLP with ``ColwiseParallel`` on its first linear layer
  and ``RowwiseParallel`` on its second (:func:`parlab.tensor_parallel.dtensor_attention`
  does the same for self-attention).
- :func:`dtensor_local_grads`: each rank's gradient shards, with the ShardSpec a test
  needs to glue them back into the single-device gradients.
- :class:`CommBytes`: PyTorch's ``CommDebugMode``, which also keeps each collective's bytes,
  and :func:`collective_wire_bytes`, what those collectives put on the wire.
"""

from __future__ import annotations

import copy
import re

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor.debug import CommDebugMode
from torch.utils._pytree import tree_leaves

from parlab.tensor_parallel.sharding import check_degree, shard_spec
from parlab.checks import check_choice

__all__ = ["default_mesh", "dtensor_mlp", "dtensor_local_grads", "CommBytes",
           "collective_wire_bytes"]


def default_mesh():
    """A 1-D DeviceMesh over every rank of the default group (CUDA under NCCL, else CPU)."""
    from torch.distributed.device_mesh import init_device_mesh
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    try:
        return init_device_mesh(device, (dist.get_world_size(),))
    except RuntimeError as err:
        if "name not set" not in str(err):
            raise
        raise RuntimeError(f"PyTorch's DeviceMesh needs the process group's group_name, which "
                           f"backend {dist.get_backend()!r} does not provide under torch "
                           f"{torch.__version__}; run this variant with backend 'gloo', "
                           f"'nccl' or 'toy'") from err


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
    ``mesh`` defaults to :func:`default_mesh`. Every rank passes the same full ``mlp``.
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


# --------------------------------------------------------------------------- collectives seen

_ANSI = re.compile(r"\x1B\[[0-?]*[ -/]*[@-~]")  # the colour codes in CommDebugMode's table
_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
        "gather", "scatter")  # "allreduce" before "reduce": the first name a call contains wins


class CommBytes(CommDebugMode):
    """PyTorch's ``CommDebugMode``, which also keeps each collective's payload bytes.

    ``with CommBytes() as comm: ...`` counts the collectives run inside it exactly as
    ``torch.distributed.tensor.debug.CommDebugMode`` does (``get_comm_counts()``, per module
    and pass in ``comm_module_counts``, :meth:`table`), and also keeps ``records``:
    ``(op, payload bytes)`` per collective in call order, ``op`` named as
    :func:`parlab.comm.ring_wire_bytes` names it and the payload being the whole tensor (what
    an all-reduce sums, what an all-gather assembles, what a reduce-scatter is handed).
    ``phases[i]`` says whether ``records[i]`` ran in the forward or the backward pass, as
    CommDebugMode's module tracker saw it. DTensor issues its collectives through the
    dispatcher (``_c10d_functional``), where this mode reads them, on any backend.
    """

    #: The keys of :meth:`report`, what a run hands back from the ranks.
    REPORT = ("collectives", "comm_counts", "comm_table")

    def __init__(self):
        super().__init__()
        self.records: list[tuple[str, int]] = []
        self.phases: list[str] = []

    def __enter__(self):
        self.records.clear()  # CommDebugMode clears its counts on entering
        self.phases.clear()
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        counted = self.get_total_counts()
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if self.get_total_counts() > counted:  # CommDebugMode counted it: a collective
            squashed = func._overloadpacket.__name__.replace("_", "")
            op = next((o for o in _OPS if o.replace("_", "") in squashed), squashed)
            sizes = [sum(t.nbytes for t in tree_leaves(x) if isinstance(t, torch.Tensor))
                     for x in (args[0], out)]
            self.records.append((op, max(sizes)))
            self.phases.append("backward" if self.advanced_module_tracker.is_bw else "forward")
        return out

    def by_phase(self) -> dict:
        """``{"forward": [(op, bytes)], "backward": [...]}``, each in call order."""
        return {phase: [r for r, p in zip(self.records, self.phases) if p == phase]
                for phase in ("forward", "backward")}

    def phase_counts(self) -> dict:
        """CommDebugMode's own counts per pass: ``{phase: {op name: count}}`` (all modules)."""
        every = self.comm_module_counts["Global"]
        return {phase: {str(op): n for op, n in every[phase].items()}
                for phase in ("forward", "backward")}

    def report(self) -> dict:
        """Plain data for a run's ``info``: :meth:`by_phase`, :meth:`phase_counts`, :meth:`table`."""
        return dict(zip(self.REPORT, (self.by_phase(), self.phase_counts(), self.table(0))))

    def table(self, noise_level: int = 0) -> str:
        """CommDebugMode's tracing table, module by module, as plain text (no colour codes).

        ``noise_level`` 0 lists the collectives each module ran forward and backward;
        1 adds every DTensor operation with its shapes and placements, 2 and 3 more.
        """
        check_choice("noise_level", noise_level, (0, 1, 2, 3))
        return _ANSI.sub("", self.generate_comm_debug_tracing_table(noise_level)).rstrip()


def collective_wire_bytes(collectives: dict, n: int) -> dict:
    """``{phase: bytes}`` on the wire for ``{phase: [(op, payload bytes)]}`` (ring algorithms)."""
    from parlab.comm import ring_wire_bytes
    return {phase: sum(ring_wire_bytes(op, payload, n) for op, payload in records)
            for phase, records in collectives.items()}
