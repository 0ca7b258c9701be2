"""The rank grid of a hybrid job: which rank is which replica, stage and tensor shard, and its groups.

Every hybrid run in the companion (pipeline + data, tensor + pipeline, the 3D job, the CNN's
data + tensor step) lays its ranks out the same way, so one class does it, for all of them:

    rank = (replica x pp + stage) x tp + tensor

Tensor-parallel neighbours are consecutive ranks (they sit in one server and talk over
NVLink), then come the pipeline stages of one replica, then the replicas. This is
Megatron-LM's order, and the one picotron's process-group manager builds; unlike theirs,
a :class:`Mesh` is a plain value that a function receives, not a global that a process
holds.

``Mesh.new_groups()`` creates the process groups on every rank, in the same order on every
rank (``dist.new_group`` is collective), and returns this rank's group of each kind. The
kinds are:

- ``tensor``: the tp ranks of one stage of one replica (they share a layer's shards);
- ``pipeline``: the pp stages of one replica and tensor index (they pass activations on);
- ``data``: the dp copies of one (stage, tensor index) (they average its gradients).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch.distributed as dist

__all__ = ["Mesh", "Coordinates", "GROUP_KINDS"]

#: The kinds of process group of a 3D layout, in the order :meth:`Mesh.new_groups` makes them.
GROUP_KINDS = ("tensor", "pipeline", "data")


class Coordinates(NamedTuple):
    """A rank's place in the layout: its replica, its pipeline stage, its tensor index."""

    replica: int
    stage: int
    tensor: int


@dataclass(frozen=True)
class Mesh:
    """A dp x pp x tp grid of ranks, tensor index fastest (see the module docstring)."""

    dp: int = 1
    pp: int = 1
    tp: int = 1

    def __post_init__(self):
        for name in ("dp", "pp", "tp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    @property
    def size(self) -> int:
        """How many ranks the grid holds: dp x pp x tp."""
        return self.dp * self.pp * self.tp

    def coordinates(self, rank: int) -> Coordinates:
        """(replica, stage, tensor index) of ``rank``."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.size:
            raise ValueError(f"rank must be in 0..{self.size - 1} for dp={self.dp} x "
                             f"tp={self.tp} x pp={self.pp}, got {rank!r}")
        rest, tensor = divmod(rank, self.tp)
        replica, stage = divmod(rest, self.pp)
        return Coordinates(replica, stage, tensor)

    def rank_at(self, replica: int, stage: int, tensor: int = 0) -> int:
        """The rank at (replica, stage, tensor index): the inverse of :meth:`coordinates`."""
        for name, value, limit in (("replica", replica, self.dp), ("stage", stage, self.pp),
                                   ("tensor", tensor, self.tp)):
            if not 0 <= value < limit:
                raise ValueError(f"{name} must be in 0..{limit - 1}, got {value!r}")
        return (replica * self.pp + stage) * self.tp + tensor

    def group_ranks(self, kind: str) -> list[list[int]]:
        """Every process group of one kind, as lists of ranks (each rank is in one of each)."""
        at = self.rank_at
        if kind == "tensor":
            return [[at(d, k, t) for t in range(self.tp)] for d in range(self.dp)
                    for k in range(self.pp)]
        if kind == "pipeline":
            return [[at(d, k, t) for k in range(self.pp)] for d in range(self.dp)
                    for t in range(self.tp)]
        if kind == "data":
            return [[at(d, k, t) for d in range(self.dp)] for k in range(self.pp)
                    for t in range(self.tp)]
        raise ValueError(f"unknown group kind {kind!r}; choose one of {list(GROUP_KINDS)}")

    def new_groups(self, kinds=GROUP_KINDS,
                   label: Callable[[str, Coordinates], str] | None = None) -> dict:
        """Create the groups of ``kinds`` on every rank; return this rank's, by kind.

        Call it on every rank of a world of :attr:`size` ranks. ``label(kind, first)`` names
        a group in the toy backend's traffic log (``first``: the coordinates of its first
        rank); the default label is the kind.
        """
        if dist.get_world_size() != self.size:
            raise ValueError(f"a dp={self.dp} x pp={self.pp} x tp={self.tp} mesh needs "
                             f"{self.size} ranks, the world has {dist.get_world_size()}")
        me, mine = dist.get_rank(), {}
        for kind in kinds:
            for members in self.group_ranks(kind):
                name = label(kind, self.coordinates(members[0])) if label else kind
                group = dist.new_group(members, group_desc=name)
                if me in members:
                    mine[kind] = group
        return mine
