"""Under ``torchrun``: join the job it started instead of forking ranks, and gather the results.

How a real torchrun job is told from a stale shell: torchrun (torch.distributed.elastic)
gives each worker ``TORCHELASTIC_RUN_ID``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``GROUP_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` (checked against torch 2.13's
``LocalElasticAgent``). A worker *receives* them; a shell that exported them, or a notebook
server started from inside a torchrun job, passes them down to its children unchanged. So
the job is joined only when all of them are set and (where ``/proc`` tells) the parent
process does not carry the same identity. Otherwise :func:`parlab.launch.run` launches
locally and warns once, naming the variables it ignores.

Under torchrun, ``run`` calls ``fn`` once in this process (recording its spans),
all-gathers every rank's result or exception, reports and spans (so ``run_with_traffic``
works), and returns the same :class:`parlab.launch.Run` as a local launch. The process
group is made on the first call and made again when a later call asks for another backend
or timeout.
"""

from __future__ import annotations

import atexit
import datetime
import os
import time
import traceback
import warnings

import cloudpickle
import torch
import torch.distributed as dist

from parlab.launch.errors import RankError
from parlab.launch.rank import in_rank, is_launch_backend, process_group_backend
from parlab.launch.reports import collect_reports, start_reports
from parlab.launch.result import Run
from parlab.launch.spans import recording

__all__ = ["run_under_torchrun", "under_torchrun", "warn_stale_environment", "TORCHRUN_VARIABLES"]

#: Every one of these is set in a torchrun worker.
TORCHRUN_VARIABLES = ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK",
                      "MASTER_ADDR", "MASTER_PORT")
#: What identifies one worker: the same values in the parent mean they were inherited.
_IDENTITY = ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "MASTER_PORT")
#: Variables that make other tools believe they are in a distributed job.
_LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                       "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")

_warned: set = set()
_group: dict = {"store": None, "pg": None, "key": None, "generation": 0}


def under_torchrun() -> bool:
    """True in a process that torchrun started (not in a shell that merely has its variables)."""
    if in_rank():
        return False
    if any(not os.environ.get(name) for name in TORCHRUN_VARIABLES):
        return False
    return not _inherited_from_parent()


def _inherited_from_parent() -> bool:
    try:
        with open(f"/proc/{os.getppid()}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return False  # no /proc (macOS) or not allowed: trust the variables
    parent = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return all(parent.get(name.encode()) == os.fsencode(os.environ[name]) for name in _IDENTITY)


def warn_stale_environment(world_size: int) -> None:
    """Warn (once per set of names) that launcher variables are set but ignored."""
    names = tuple(n for n in _LAUNCHER_VARIABLES if n in os.environ)
    if not names or in_rank() or names in _warned:
        return
    _warned.add(names)
    why = ("they were inherited from the parent process"
           if all(n in os.environ for n in TORCHRUN_VARIABLES)
           else "they are not the full set that torchrun gives its workers")
    warnings.warn(
        f"parlab.launch.run: {', '.join(names)} set, but this process was not started by "
        f"torchrun ({why}); starting {world_size} local rank(s) and ignoring them. Unset "
        f"them to silence this warning: unset {' '.join(names)}",
        RuntimeWarning, stacklevel=3)


def run_under_torchrun(fn, world_size, backend, timeout, args, kwargs):
    """torchrun started the processes: join its job, run fn here, gather every rank's result."""
    __tracebackhide__ = True
    env_world = int(os.environ["WORLD_SIZE"])
    if world_size != env_world:
        raise ValueError(
            f"run(fn, {world_size}) under torchrun, but torchrun started WORLD_SIZE={env_world} "
            f"processes: pass world_size={env_world} (int(os.environ['WORLD_SIZE'])), or start "
            f"torchrun with --nproc-per-node/--nnodes making {world_size} processes")
    started = time.monotonic()
    _join(backend, float(timeout))
    try:
        start_reports()
        with recording() as recorder:
            result = fn(*args, **kwargs)
        message = cloudpickle.dumps(("ok", result, collect_reports(), recorder.spans))
    except Exception as exc:  # noqa: BLE001 - every rank must learn which rank failed
        tb = traceback.format_exc()
        message = cloudpickle.dumps(("error", type(exc).__name__, str(exc), tb))
    gathered: list = [None] * env_world
    dist.all_gather_object(gathered, message)  # bounded by the group's timeout
    messages = [cloudpickle.loads(m) for m in gathered]
    failed = [rank for rank, m in enumerate(messages) if m[0] == "error"]
    if failed:
        rank = failed[0]
        _, exc_type, text, tb = messages[rank]
        others = f"\n(rank(s) {failed[1:]} failed too)" if failed[1:] else ""
        raise RankError(f"rank {rank} raised {exc_type}: {text}{others}\n\n"
                        f"--- traceback of rank {rank} ---\n{tb}",
                        rank=rank, exc_type=exc_type, rank_traceback=tb)
    return Run([m[1] for m in messages], world_size=env_world, backend=backend,
               seconds=time.monotonic() - started, outputs=[""] * env_world,
               extras=[m[2] for m in messages], spans=[m[3] for m in messages])


def _join(backend: str, timeout: float) -> None:
    """Make (or make again) the default process group for ``backend`` and ``timeout``."""
    ours = _group["pg"] is not None and dist.is_initialized() and dist.group.WORLD is _group["pg"]
    if dist.is_initialized() and not ours:
        current = str(dist.get_backend()).lower()
        if not is_launch_backend(current, backend):
            raise ValueError(
                f"run(..., backend={backend!r}) under torchrun, but this script already made "
                f"the process group with backend {current!r}; pass backend={current!r}, or let "
                f"run() make the group (do not call init_process_group yourself)")
        return
    key = (backend, timeout)
    if ours and _group["key"] == key:
        return
    delta = datetime.timedelta(seconds=timeout)
    if ours:
        dist.destroy_process_group()  # every rank is here: the last call ended in a gather
        _group["pg"] = None
    if _group["store"] is None:
        store, _, _ = next(dist.rendezvous("env://", timeout=delta))  # torchrun's own store
        _group["store"] = store
        # we made the group, so we tear it down: gloo's threads still running at exit
        # can abort the interpreter ("terminate called without an active exception")
        atexit.register(_destroy_group)
    _group["store"].set_timeout(delta)
    _group["generation"] += 1  # every rank makes the same calls, so they agree on it
    options = {}
    if backend == "nccl":
        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        options["device_id"] = torch.device("cuda", local)
    store = dist.PrefixStore(f"parlab_pg/{_group['generation']}", _group["store"])
    dist.init_process_group(process_group_backend(backend), store=store,
                            rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]), timeout=delta, **options)
    _group["pg"], _group["key"] = dist.group.WORLD, key


def _destroy_group() -> None:
    """At exit: end the group we made, and drop our references to it and to the store, so
    that their C++ objects (and gloo's threads) go now, not while the interpreter is being
    torn down (seen once under load: rank 0 aborted at exit, "terminate called without an
    active exception")."""
    try:
        if _group["pg"] is not None and dist.is_initialized() and dist.group.WORLD is _group["pg"]:
            try:
                dist.barrier()  # nobody leaves while a peer still talks to it
            finally:
                dist.destroy_process_group()
    finally:
        _group["pg"] = _group["store"] = None
