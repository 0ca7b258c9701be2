"""The rank grid of a hybrid job, as a PyTorch ``DeviceMesh`` with named dimensions.

Every hybrid run in the companion (pipeline + data, tensor + pipeline, the 3D job, the CNN's
data + tensor step) lays its ranks out the same way, so one class describes it:

    rank = ((replica x pp + stage) x cp + context) x tp + tensor

Tensor-parallel neighbours are consecutive ranks (they sit in one server and talk over
NVLink), then the context-parallel ranks of one stage, then the pipeline stages of one
replica, then the replicas. This is Megatron-LM's order, and the one torchtitan's
``ParallelDims`` builds with ``init_device_mesh(..., ("pp", "dp", "cp", "tp"))`` up to the
place of ``pp``; unlike picotron's process-group manager, a :class:`Mesh` is a plain value
that a function receives, not a global that a process holds.

:func:`default_mesh` is the one-dimensional case: every rank of the world on one dimension,
what DTensor's tensor-parallel plans and FSDP2 take when a chapter splits over all ranks.

A :class:`Mesh` is only arithmetic (no process group), so the planner and the figures use
it without ranks. Inside a job, :meth:`Mesh.build` makes the PyTorch
:class:`~torch.distributed.device_mesh.DeviceMesh` (dimensions ``dp``, ``pp``, ``cp``,
``tp``), the object DTensor, FSDP2 and ``parallelize_module`` take; each dimension's
sub-mesh holds that dimension's process group. On the toy backend each dimension's
groups carry a label in the traffic log (``data``, ``pipeline``, ``context``, ``tensor``),
given as per-dimension backend options (``backend_override``).

Expert parallelism is not a factor of the world size: as in Megatron and torchtitan, its
``ep`` group is carved out of ``dp`` x ``cp`` (the ranks that hold the same dense layers)
when a chapter needs it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch.distributed as dist

from parlab.checks import check_count
from parlab.launch import rank_device

__all__ = ["Mesh", "Coordinates", "GROUP_KINDS", "MESH_DIMS", "default_mesh"]

#: The mesh dimensions, outermost first, and the kind of group each one's sub-meshes hold.
MESH_DIMS = {"dp": "data", "pp": "pipeline", "cp": "context", "tp": "tensor"}
#: The kinds of process group of a 3D layout (the ``cp`` dimension is 1 unless asked for).
GROUP_KINDS = ("tensor", "pipeline", "data")
_KIND_DIM = {kind: dim for dim, kind in MESH_DIMS.items()}


class Coordinates(NamedTuple):
    """A rank's place in the layout: its replica, its pipeline stage, its tensor index."""

    replica: int
    stage: int
    tensor: int


@functools.lru_cache(maxsize=256)
def _lines(shape: tuple, axis: int) -> tuple:
    """The ranks along ``axis`` of a row-major grid of ``shape``, one tuple per line (cached:
    the planner asks for the same few grids thousands of times)."""
    others = [i for i in range(len(shape)) if i != axis]
    lines = []
    for flat in range(math.prod(shape) // shape[axis]):
        index, rest = {}, flat
        for i in reversed(others):
            rest, index[i] = divmod(rest, shape[i])
        line = []
        for k in range(shape[axis]):
            index[axis] = k
            rank = 0
            for i, n in enumerate(shape):
                rank = rank * n + index[i]
            line.append(rank)
        lines.append(tuple(line))
    return tuple(lines)


@dataclass(frozen=True)
class Mesh:
    """A dp x pp x cp x tp grid of ranks, tensor index fastest (see the module docstring)."""

    dp: int = 1
    pp: int = 1
    tp: int = 1
    cp: int = 1

    def __post_init__(self):
        for name in MESH_DIMS:
            check_count(name, getattr(self, name))

    @property
    def size(self) -> int:
        """How many ranks the grid holds: dp x pp x cp x tp."""
        return self.dp * self.pp * self.cp * self.tp

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """The degrees in :data:`MESH_DIMS` order: (dp, pp, cp, tp)."""
        return tuple(getattr(self, name) for name in MESH_DIMS)

    def _describe(self) -> str:
        return " x ".join(f"{name}={getattr(self, name)}" for name in MESH_DIMS
                          if name != "cp" or self.cp > 1)

    def coordinates(self, rank: int) -> Coordinates:
        """(replica, stage, tensor index) of ``rank`` (its context index: :meth:`context_of`)."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.size:
            raise ValueError(f"rank must be in 0..{self.size - 1} for {self._describe()}, "
                             f"got {rank!r}")
        rest, tensor = divmod(rank, self.tp)
        replica, stage = divmod(rest // self.cp, self.pp)
        return Coordinates(replica, stage, tensor)

    def context_of(self, rank: int) -> int:
        """The context-parallel index of ``rank`` (0 when cp = 1)."""
        self.coordinates(rank)
        return rank // self.tp % self.cp

    def rank_at(self, replica: int, stage: int, tensor: int = 0, context: int = 0) -> int:
        """The rank at (replica, stage, tensor index, context index): the inverse of
        :meth:`coordinates` and :meth:`context_of`."""
        for name, value, limit in (("replica", replica, self.dp), ("stage", stage, self.pp),
                                   ("tensor", tensor, self.tp), ("context", context, self.cp)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
                raise ValueError(f"{name} must be in 0..{limit - 1}, got {value!r}")
        return ((replica * self.pp + stage) * self.cp + context) * self.tp + tensor

    def group_ranks(self, kind: str) -> list[list[int]]:
        """Every process group of one kind, as lists of ranks (each rank is in one of each):
        the lines of the grid along that kind's dimension, in the order DeviceMesh makes them."""
        if kind not in _KIND_DIM:
            raise ValueError(f"unknown group kind {kind!r}; choose one of {list(_KIND_DIM)}")
        return [list(line) for line in _lines(self.shape, list(MESH_DIMS).index(_KIND_DIM[kind]))]

    def build(self, device_type: str | None = None,
              label: Callable[[str, Coordinates], str] | None = None):
        """This job's :class:`~torch.distributed.device_mesh.DeviceMesh`, dimensions
        ``("dp", "pp", "cp", "tp")``; ``device_mesh["tp"].get_group()`` is this rank's
        tensor group, and so on.

        Call it on every rank of a world of :attr:`size` ranks (creating groups is
        collective). ``device_type`` defaults to ``"cuda"`` when the world runs on NCCL, else
        ``"cpu"``. On the toy backend each dimension's groups are labelled with its kind
        (:data:`MESH_DIMS`) in the traffic log; ``label(kind, first)`` names each group
        instead (``first``: the coordinates of its first rank).
        """
        from torch.distributed.device_mesh import init_device_mesh
        if dist.get_world_size() != self.size:
            raise ValueError(f"a {self._describe()} mesh needs {self.size} ranks, the world "
                             f"has {dist.get_world_size()}")
        backend = dist.get_backend()
        if device_type is None:
            device_type = rank_device().type
        override = None
        if backend == "toy":
            from parlab.comm.toy import ToyOptions
            override = {dim: ("toy", ToyOptions(label=kind)) for dim, kind in MESH_DIMS.items()}
        mesh = init_device_mesh(device_type, self.shape, mesh_dim_names=tuple(MESH_DIMS),
                                backend_override=override)
        if label is not None and override is not None:
            from parlab.comm.toy import set_label
            for dim, kind in MESH_DIMS.items():
                group = mesh[dim].get_group()
                first = min(dist.get_process_group_ranks(group))
                set_label(group, label(kind, self.coordinates(first)))
        return mesh

    def expert_ranks(self, ep: int) -> dict[str, list[list[int]]]:
        """The expert-parallel groups carved out of the data-parallel ones, as rank lists.

        Along each ``data`` line, consecutive runs of ``ep`` ranks form an ``expert`` group
        (they split the experts among them); the ranks at the same place in every run hold
        the same experts and form an ``expert_data`` group, over which those experts'
        gradients are summed (Megatron's expert-data-parallel group). dp = 4, ep = 2 on
        ranks 0-3: experts {0, 1} and {2, 3}; expert-data {0, 2} and {1, 3}.
        """
        check_count("ep", ep, "expert-parallel ranks")
        if self.dp % ep:
            raise ValueError(f"ep={ep} must divide dp={self.dp}: the expert groups are carved "
                             f"out of the data-parallel ranks")
        expert, expert_data = [], []
        for line in self.group_ranks("data"):
            runs = [list(line[i:i + ep]) for i in range(0, len(line), ep)]
            expert += runs
            expert_data += [list(column) for column in zip(*runs)]
        return {"expert": expert, "expert_data": expert_data}

    def build_expert_groups(self, ep: int) -> dict:
        """This rank's ``expert`` and ``expert_data`` process groups (:meth:`expert_ranks`),
        labelled so on the toy backend. Collective: call it on every rank, in the same order."""
        backend = dist.get_backend()
        mine, rank = {}, dist.get_rank()
        for kind, lines in self.expert_ranks(ep).items():
            options = {}
            if backend == "toy":
                from parlab.comm.toy import ToyOptions
                options = {"backend": "toy", "pg_options": ToyOptions(label=kind)}
            for ranks in lines:
                group = dist.new_group(ranks, **options)
                if rank in ranks:
                    mine[kind] = group
        return mine

    def groups(self, device_mesh) -> dict:
        """This rank's process group of each kind (``"tensor"``, ...), from :meth:`build`'s mesh."""
        return {kind: device_mesh[dim].get_group() for dim, kind in MESH_DIMS.items()}


def default_mesh():
    """A 1-D DeviceMesh over every rank of the default group, on the ranks' own device
    (:func:`parlab.launch.rank_device`), with a clear error on a backend whose groups have no
    name (DeviceMesh needs one)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    try:
        return init_device_mesh(rank_device().type, (dist.get_world_size(),))
    except RuntimeError as err:
        if "name not set" not in str(err):
            raise
        raise RuntimeError(f"PyTorch's DeviceMesh needs the process group's group_name, which "
                           f"backend {dist.get_backend()!r} does not provide under torch "
                           f"{torch.__version__}; run this variant with backend 'gloo', "
                           f"'nccl' or 'toy'") from err
