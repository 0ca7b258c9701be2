"""Where each rank of a (data, tensor, pipeline) layout runs: the chapter's rail-aligned placement.

Why this module exists: the same three degrees can be cheap or expensive depending on which
GPU each rank lands on. Figure 8-19 shows the placement that large clusters use, and this
module computes it for any layout:

- **tensor parallel innermost**: the ``tp`` ranks of a tensor-parallel group sit side by side
  in one server, so their all-reduces (four per transformer block and micro-batch) ride on
  NVLink, the book's high-speed domain; ``tp`` must therefore divide the GPUs of a server;
- **pipeline stages along a rail**: stage k+1 of a replica sits on the *next server*, at the
  same GPU position, so the activation it receives comes through a single rail switch (A1 ->
  A2 -> A3 in Figure 8-19). When a pipeline is longer than the cluster has servers, it turns
  around inside the last server (a "snake"), so the turn is an NVLink hop, not a spine hop;
- **data parallel outermost**: replicas fill the remaining positions; the copies of one stage
  then sit on the same rail (or in the same server), and the gradient all-reduce of that stage
  stays off the spine.

Ranks are numbered by :class:`parlab.comm.Mesh`, as Megatron-LM numbers them, tensor index
fastest: ``rank = (replica * pp + stage) * tp + t``. GPUs are numbered server-major, as in
:mod:`parlab.comm.topology` (GPU g is position ``g % gpus_per_server`` of server
``g // gpus_per_server``), so ``topology.link_type(gpu_a, gpu_b)`` tells which link a
message between two ranks uses.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from parlab.hardware import NIC_GBPS, gpu as gpu_named
from parlab.comm import GROUP_KINDS, NVLINK, Mesh, Topology, link_type, rail_optimized
from parlab.tensor_parallel import divisors
from parlab.checks import check_count, check_positive_number

__all__ = ["place", "cluster", "group_links", "Placement", "placement"]


def _servers(gpus: int, gpus_per_server: int) -> int:
    """How many servers ``gpus`` GPUs fill: whole servers, or one partly used server."""
    check_count("gpus", gpus)
    check_count("gpus_per_server", gpus_per_server)
    if gpus > gpus_per_server and gpus % gpus_per_server:
        raise ValueError(f"gpus={gpus} does not fill servers of {gpus_per_server} GPUs; use a "
                         f"multiple of {gpus_per_server} (or fewer than one server)")
    return math.ceil(gpus / gpus_per_server)


def cluster(gpus: int, gpus_per_server: int = 8, nic_gbps: float = NIC_GBPS, gpu: str | None = None,
            **links) -> Topology:
    """The rail-optimized cluster that holds ``gpus`` GPUs: full servers, or one partial server.

    ``gpu``: a name in :data:`parlab.hardware.GPUS`, whose NVLink speed (per direction) the
    servers get, unless ``nvlink`` is given; None: the default H100's."""
    servers = _servers(gpus, gpus_per_server)
    if gpu is not None and "nvlink" not in links:
        links["nvlink"] = replace(NVLINK, bandwidth=gpu_named(gpu).nvlink_gb_per_s * 1e9)
    check_positive_number("nic_gbps", nic_gbps, "a NIC's speed in Gb/s")
    return rail_optimized(servers, gpus_per_server, nic_gbps, **links)


def place(dp: int, tp: int, pp: int, gpus_per_server: int = 8) -> list[int]:
    """The GPU (server-major index) of every rank, in rank order (see the module docstring)."""
    return list(_place(dp, tp, pp, gpus_per_server))


@functools.lru_cache(maxsize=1024)
def _place(dp: int, tp: int, pp: int, gpus_per_server: int) -> tuple[int, ...]:
    """:func:`place`, cached: the planner places the same layouts for every option it tries."""
    mesh = Mesh(dp=dp, pp=pp, tp=tp)
    check_count("gpus_per_server", gpus_per_server)
    gpus = mesh.size
    per_server = min(gpus_per_server, gpus)
    if per_server % tp:
        raise ValueError(f"tp={tp} does not divide the {per_server} GPUs of a server: a "
                         f"tensor-parallel group must sit inside one server (NVLink); "
                         f"valid tp: {divisors(per_server)}")
    servers = _servers(gpus, gpus_per_server)
    snake = servers % pp != 0  # a pipeline must turn: make the turn an NVLink hop
    gpu_of = []
    for rank in range(gpus):
        replica, stage, t = mesh.coordinates(rank)
        slot = replica * pp + stage           # tensor-parallel groups, one after another,
        column, server = divmod(slot, servers)  # down the servers at one position, then the next
        if snake and column % 2:
            server = servers - 1 - server
        gpu_of.append(server * gpus_per_server + column * tp + t)
    return tuple(gpu_of)


@dataclass(frozen=True)
class Placement:
    """A layout placed on servers: every rank's GPU and its (replica, stage, tensor) coordinates."""

    dp: int
    tp: int
    pp: int
    gpus_per_server: int
    gpu_of: list           # :func:`place`: the GPU of every rank, in rank order
    coordinates: list      # :meth:`parlab.comm.Mesh.coordinates` of every rank


def placement(dp: int, tp: int, pp: int, gpus_per_server: int = 8) -> Placement:
    """:func:`place` with the mesh coordinates of every rank: what a placement figure draws."""
    gpu_of, mesh = place(dp, tp, pp, gpus_per_server), Mesh(dp=dp, pp=pp, tp=tp)
    return Placement(dp, tp, pp, gpus_per_server, gpu_of,
                     [mesh.coordinates(rank) for rank in range(len(gpu_of))])


def group_links(dp: int, tp: int, pp: int, topology: Topology,
                gpu_of: list[int] | None = None) -> dict[str, str | None]:
    """The slowest link type each kind of group uses on ``topology`` (None: a group of one).

    A ring all-reduce (tensor, data) is as slow as its slowest neighbour pair, a pipeline as
    its slowest stage boundary; slowest means lowest bandwidth (spine < rail < NVLink at equal
    NIC speed, since the spine adds latency).
    """
    per_server = topology.gpus_per_server
    gpu_of = tuple(gpu_of) if gpu_of is not None else _place(dp, tp, pp, per_server)
    for gpu in (min(gpu_of), max(gpu_of)):
        topology.gpu_name(gpu)  # a GPU outside the topology is an error that names it
    order = {name: (spec.bandwidth, -spec.alpha) for name, spec in topology.links.items()}
    return {kind: min(used, key=order.__getitem__) if used else None
            for kind, used in _links_used(dp, tp, pp, per_server, gpu_of).items()}


@functools.lru_cache(maxsize=1024)
def _links_used(dp: int, tp: int, pp: int, gpus_per_server: int, gpu_of: tuple) -> dict:
    """Per kind of group, the set of link types between neighbours in its groups (cached)."""
    used = {}
    mesh = Mesh(dp=dp, pp=pp, tp=tp)
    for kind in GROUP_KINDS:
        pairs = set()
        for members in mesh.group_ranks(kind):
            ring = members if kind != "pipeline" else members[:-1]
            for i, rank in enumerate(ring):
                nxt = members[(i + 1) % len(members)]
                if nxt != rank:
                    pairs.add(link_type(gpu_of[rank], gpu_of[nxt], gpus_per_server))
        used[kind] = frozenset(pairs)
    return used
