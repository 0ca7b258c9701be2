"""What a collective costs, in closed form: bytes per rank, bytes on the wire, steps and seconds.

Why one module: the chapters quote these numbers in several places (chapter 00's ring, chapter
02's data-parallel traffic, chapter 04's per-layer bytes, chapter 05's planner), and the
tests hold every one of them against the toy backend's traffic log. One formula per
quantity lives here, and everything else calls it.

For ``n`` ranks and a payload of S bytes (the whole tensor: the result of an all-gather, the
input of a reduce-scatter or an all-reduce), the textbook algorithms move:

=================  ==========================  =========================================
ring collective    wire bytes, all ranks       why
=================  ==========================  =========================================
all-reduce         2 (n-1) S                   reduce-scatter, then all-gather
all-gather         (n-1) S                     each rank's 1/n travels to n-1 ranks
reduce-scatter     (n-1) S                     the mirror image of all-gather
broadcast          (n-1) S                     a chain: each hop carries everything
reduce             (n-1) S + (n-1) S / n       reduce-scatter, then n-1 slices to the root
send               S                           one message
all-to-all         (n-1) S                     each rank's S splits n ways; 1/n stays home
                                               (S = one rank's buffer, evenly split)
=================  ==========================  =========================================

Time is the alpha-beta model: a step costs alpha + bytes / bandwidth on its link, and
steps run one after another (see :meth:`parlab.comm.traffic.TrafficLog.time` for the same
model over a measured log).
"""

from __future__ import annotations

import math

from parlab.hardware import NIC_GBPS
from parlab.comm.topology import LinkSpec, nic
from parlab.checks import check_count, check_positive_number

__all__ = ["ALGORITHMS", "ring_wire_bytes", "allreduce_bytes_per_rank", "allreduce_steps",
           "allreduce_time", "bus_bandwidth"]

#: The collective algorithms a reader can choose (the toy backend runs each of them).
ALGORITHMS = ("ring", "naive", "tree")

_RING_FACTORS = {"all_reduce": lambda n: 2 * (n - 1), "all_gather": lambda n: n - 1,
                 "reduce_scatter": lambda n: n - 1, "broadcast": lambda n: n - 1,
                 "reduce": lambda n: (n - 1) + (n - 1) / n, "send": lambda n: 1,
                 "all_to_all": lambda n: n - 1}


def ring_wire_bytes(op: str, payload: float, n: int) -> float:
    """Bytes on the wire, all ranks together, for one ring collective of ``payload`` bytes."""
    if op not in _RING_FACTORS:
        raise ValueError(f"no formula for {op!r}; known: {list(_RING_FACTORS)}")
    _check_ranks(n)
    return _RING_FACTORS[op](n) * payload if n > 1 else 0


def _check_ranks(n):
    check_count("n", n, "the number of ranks")


def _check(n, algorithm):
    _check_ranks(n)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {list(ALGORITHMS)}")


def _tree_children(v: int, n: int) -> int:
    """Children of (root-relative) rank v in a binomial tree over n ranks."""
    depth = math.ceil(math.log2(n)) if n > 1 else 0
    return sum(1 for k in range(depth) if v % (2 << k) == 0 and v + (1 << k) < n)


def allreduce_bytes_per_rank(nbytes: float, n: int, algorithm: str = "ring") -> list[float]:
    """Bytes each rank sends in one all-reduce of ``nbytes`` over ``n`` ranks (root = rank 0).

    ring: 2(n-1)/n x nbytes for every rank (the wire total shared evenly; exact when n
    divides the tensor); naive: the root sends (n-1) x nbytes (and receives as much), every
    other rank nbytes; tree (a binomial tree, not pipelined): nbytes up to the parent, plus
    nbytes to each child on the way down. NCCL's trees pipeline chunks instead, which brings
    a rank's bytes down to about twice the tensor, close to the ring.
    """
    _check(n, algorithm)
    if algorithm == "ring":
        return [ring_wire_bytes("all_reduce", nbytes, n) / n] * n
    if algorithm == "naive":
        return [(n - 1) * nbytes] + [nbytes] * (n - 1)
    return [nbytes * ((v != 0) + _tree_children(v, n)) for v in range(n)]


def allreduce_steps(n: int, algorithm: str = "ring") -> int:
    """Steps of an all-reduce: 2(n-1) for ring, 2 for naive, 2 ceil(log2 n) for tree."""
    _check(n, algorithm)
    if n == 1:
        return 0
    return {"ring": 2 * (n - 1), "naive": 2, "tree": 2 * math.ceil(math.log2(n))}[algorithm]


def allreduce_time(nbytes: float, n: int, algorithm: str = "ring",
                   link: LinkSpec | None = None) -> float:
    """Alpha-beta seconds of one all-reduce when every pair of ranks is joined by ``link``.

    ring: 2(n-1) steps of alpha + (nbytes/n)/beta, each rank sending and receiving at once;
    naive: 2 steps in which the root's port carries (n-1) x nbytes; tree (binomial, not
    pipelined): 2 ceil(log2 n) steps of alpha + nbytes/beta. Naive and tree count the receive
    phase (the reduce towards the root) and then the send phase (the results going back),
    one after the other, so their time is about twice the busiest rank's sent bytes over the
    bandwidth. The default link is a 400 Gb/s NIC.
    """
    link = nic(NIC_GBPS) if link is None else link
    if not isinstance(link, LinkSpec):
        raise TypeError(f"link must be a LinkSpec (e.g. parlab.comm.NVLINK or nic(400)), "
                        f"got {link!r}")
    steps = allreduce_steps(n, algorithm)
    per_step = {"ring": nbytes / n, "naive": (n - 1) * nbytes, "tree": nbytes}[algorithm]
    return steps * (link.alpha + per_step / link.bandwidth)


def _bus_factor(op: str, n: int) -> float:
    """nccl-tests' factor: a ring rank's share of the wire bytes (broadcast: 1 by convention)."""
    if op == "broadcast":
        return 1.0
    return ring_wire_bytes(op, 1.0, n) / n


def bus_bandwidth(op: str, nbytes: float, seconds: float, n: int) -> float:
    """Bus bandwidth in bytes/s as nccl-tests defines it: (nbytes / seconds) x factor(op, n).

    The factor is 2(n-1)/n for all-reduce, (n-1)/n for all-gather, reduce-scatter and
    all-to-all (each rank keeps 1/n of its buffer), and 1 for broadcast, so that bus
    bandwidth is comparable across rank counts.
    """
    if op not in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"):
        raise ValueError(f"no bus-bandwidth factor for {op!r}; known: "
                         f"['all_reduce', 'all_gather', 'reduce_scatter', 'broadcast', "
                         f"'all_to_all']")
    check_positive_number("seconds", seconds, "the collective's measured time")
    return nbytes / seconds * _bus_factor(op, n)
