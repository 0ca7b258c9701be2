"""Backend "toy": torch.distributed collectives built from logged point-to-point transfers.

Why: the chapter is about what travels between GPUs. With ``backend="toy"`` the ordinary
``dist.all_reduce(...)``, ``dist.all_gather(...)`` ... run our own algorithms (ring, naive,
tree: see :mod:`parlab.comm.toy.algorithms`) over an inner gloo group (NCCL for CUDA tensors
when every rank has a GPU), and every message is recorded as a :class:`parlab.comm.traffic.Transfer`.
Results equal gloo's (bit for bit on integer data; to rounding on floats, whose sums are
added in another order).

Use::

    dist.init_process_group("toy", ...)          # or parlab.launch.run(fn, 4, backend="toy")
    toy_backend.set_algorithm("naive")           # per process (default "ring")
    toy_backend.set_algorithm("tree", group=g)   # per group
    with toy_backend.algorithm("ring"): ...      # per call
    toy_backend.transfers(); toy_backend.clear_transfers()

``dist.new_group(ranks, backend="toy", pg_options=ToyOptions(label="tensor"))`` (or
``group_desc="tensor"``) names a sub-group; its records carry that label and global ranks.
PyTorch's DeviceMesh and DTensor (``torch.distributed.tensor.parallel``) run on toy groups
too: their functional collectives find a group by name and call its methods, so what
DTensor moves is in the log. (Under torch 2.13 PyTorch's bridge to Python groups forwards
all-reduce, all-to-all and broadcast from there, not the single-tensor all-gather and
reduce-scatter: ``all_gather_into_tensor`` fails with "No backend type associated with
device type cpu". The default ColwiseParallel/RowwiseParallel plans need only all-reduces;
sequence parallelism would need the other two.)
Importing :mod:`parlab` registers the backend; nothing here touches a tensor at import time
(the launcher forks ranks from a process that imported parlab).
"""

from __future__ import annotations

import contextlib
import os

import torch.distributed as dist

from parlab.comm.toy.group import ToyProcessGroup
from parlab.comm.toy.state import STATE, ToyOptions, valid
from parlab.comm.traffic import TrafficLog, Transfer
from parlab.launch import register_collector, run

__all__ = ["set_algorithm", "get_algorithm", "algorithm", "set_label", "transfers",
           "clear_transfers", "register", "sent_log", "run_with_traffic"]


def set_algorithm(name: str, group=None) -> None:
    """Choose the algorithm for this process (``group=None``) or for one toy group."""
    if group is None:
        STATE.default = valid(name)
    else:
        _toy_group(group)._algorithm = valid(name)


def get_algorithm(group=None) -> str:
    """The algorithm the next collective on ``group`` (default: the world) will use."""
    if group is None and isinstance(dist.group.WORLD, ToyProcessGroup):
        group = dist.group.WORLD
    return STATE.algorithm_for(group)


@contextlib.contextmanager
def algorithm(name: str):
    """``with algorithm("naive"): dist.all_reduce(t)``: the algorithm for the calls inside."""
    STATE.stack.append(valid(name))
    try:
        yield
    finally:
        STATE.stack.pop()


def set_label(group, label: str) -> None:
    """Name a toy group in the traffic log (for example "tensor", "pipeline", "data")."""
    _toy_group(group)._label = str(label)


def transfers() -> list[Transfer]:
    """This rank's traffic log: every message it sent or received, in order."""
    return list(STATE.log)


def clear_transfers() -> None:
    """Empty this rank's traffic log; the next collective of each group is logged as call 0.

    (Only the numbers shown restart: the backend keeps its own count, which every rank
    of a group must agree on.)
    """
    STATE.log.clear()
    STATE.run_start = 0
    for group in STATE.groups:
        group._shown_from = group._calls
        group._pairs.clear()


def _toy_group(group) -> ToyProcessGroup:
    group = group if group is not None else dist.group.WORLD
    if not isinstance(group, ToyProcessGroup):
        raise ValueError(f"{group!r} is not a toy process group; create it with backend='toy'")
    return group


def _create(options, pg_options=None) -> ToyProcessGroup:
    """The factory torch.distributed calls (extended API: it passes group name and global ranks)."""
    if pg_options is not None and not isinstance(pg_options, ToyOptions):
        raise ValueError(f"pg_options for backend 'toy' must be parlab.comm.toy.ToyOptions, "
                         f"got {type(pg_options).__name__}")
    return ToyProcessGroup(options.store, options.group_rank, options.group_size, options.timeout,
                           options.global_ranks_in_group, str(options.group_id), pg_options)


def register() -> None:
    """Make ``init_process_group("toy")`` and ``new_group(..., backend="toy")`` work, and have
    :func:`parlab.launch.run` bring every rank's log home: after ``fn``, each rank reports
    what it sent (:func:`sent_log`), and the run's ``.traffic`` merges the reports.
    """
    dist.Backend.register_backend("toy", _create, extended_api=True, devices=["cpu", "cuda"])
    register_collector("traffic", sent_log, start=_mark_run_start)


def _mark_run_start() -> None:
    """Called by the launcher as each rank's group comes up: the run's log begins here."""
    STATE.run_start = len(STATE.log)


def sent_log() -> TrafficLog | None:
    """What this rank sent in the current launch, as a :class:`TrafficLog`; None when it used
    no toy group.

    (Each message is in the log of both ends; keeping the sender's copy counts it once.)
    """
    log = STATE.log[STATE.run_start:]
    if not (log or isinstance(dist.group.WORLD, ToyProcessGroup)):
        return None
    rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))
    return TrafficLog(rec for rec in log if rec.src == rank)


def _traced(fn, algorithm, args, kwargs):
    """Run on each rank: start with an empty log (the launcher's barrier is not the reader's)."""
    clear_transfers()
    if algorithm is not None:
        set_algorithm(algorithm)
    return fn(*args, **kwargs)


def run_with_traffic(fn, world_size: int, *args, algorithm: str | None = None, **kwargs):
    """Run ``fn`` on ``world_size`` ranks with backend "toy"; return (results, TrafficLog).

    ``results`` is the :class:`parlab.launch.Run` (a list of the ranks' results) and the log
    is its ``.traffic``: every message of this run, and of no other.

    ``algorithm`` sets every rank's default ("ring", "naive", "tree"); ``timeout`` and
    ``threads`` go to :func:`parlab.launch.run`, other keyword arguments to ``fn``.
    """
    if algorithm is not None:
        valid(algorithm)
    options = {k: kwargs.pop(k) for k in ("timeout", "threads") if k in kwargs}
    results = run(_traced, world_size, fn, algorithm, args, kwargs, backend="toy", **options)
    return results, results.traffic
