"""Start N real torch.distributed ranks from a notebook cell (or a script) and get their results.

Why this module exists: every chapter runs collectives between real processes, and a
reader presses shift-enter many times. So a launch must be fast (ranks are forked from a
forkserver that already imported torch: about a tenth of a second for 4 ranks after the
first launch), must never hang the notebook (a rank's exception comes back within a second
as :class:`RankError`; a hang ends at ``timeout``), must print each rank's output in rank
order (so stored notebook outputs are deterministic), and must leave no process behind.

Under ``torchrun`` (``RANK`` and ``WORLD_SIZE`` set by the launcher) the same call runs
``fn`` in the job that torchrun already started, so an example scales to many machines with
NCCL without a code change.
"""

from __future__ import annotations

import atexit
import datetime
import importlib
import io
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import cloudpickle
import torch
import torch.distributed as dist

__all__ = [
    "run",
    "RankError",
    "RankTimeoutError",
    "default_backend",
    "rank_device",
    "environment",
    "MAX_WORLD_SIZE",
    "DEFAULT_TIMEOUT",
    "register_collector",
    "last_run",
    "preload",
]

#: More local ranks than this is not a lesson any more but a stress test of the machine.
MAX_WORLD_SIZE = 64
#: Seconds a launch may take, and the process-group timeout of every collective in it.
DEFAULT_TIMEOUT = 60.0

_LOOPBACK = "lo0" if sys.platform == "darwin" else "lo"
_collectors: dict[str, Callable[[], Any]] = {}
_forkserver_ready = False
_preload = ["parlab", "parlab.launch"]


class RankError(RuntimeError):
    """A rank raised, died, or (as :class:`RankTimeoutError`) did not finish in time.

    Attributes: ``rank`` (the first rank that failed, or None for a timeout),
    ``exc_type`` (the name of the exception it raised), ``rank_traceback`` (its traceback as
    text) and ``outputs`` (each rank's captured stdout/stderr).
    """

    def __init__(self, message, rank=None, exc_type=None, rank_traceback="", outputs=None):
        super().__init__(message)
        self.rank = rank
        self.exc_type = exc_type
        self.rank_traceback = rank_traceback
        self.outputs = outputs or []


class RankTimeoutError(RankError, TimeoutError):
    """Some ranks were still running when the launch's ``timeout`` ran out."""

    def __init__(self, message, pending, outputs=None):
        super().__init__(message, outputs=outputs)
        self.pending = pending


@dataclass
class LaunchRecord:
    """What the last :func:`run` in this process did (for notebooks that want more than results)."""

    world_size: int
    backend: str
    seconds: float
    outputs: list[str] = field(default_factory=list)
    extras: list[dict] = field(default_factory=list)


_last_run: LaunchRecord | None = None


def last_run() -> LaunchRecord | None:
    """The record of the most recent :func:`run` call in this process (None before the first)."""
    return _last_run


def register_collector(name: str, collect: Callable[[], Any]) -> None:
    """Have every rank call ``collect()`` after ``fn`` returns and send the value back.

    The toy backend uses this to bring each rank's traffic log home; the values land in
    ``last_run().extras[rank][name]``.
    """
    _collectors[name] = collect


def _under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "PARLAB_RANK" not in os.environ


def default_backend(world_size: int) -> str:
    """``"nccl"`` when CUDA shows at least ``world_size`` GPUs (one per rank), else ``"gloo"``."""
    if torch.cuda.is_available() and dist.is_nccl_available():
        if torch.cuda.device_count() >= world_size:
            return "nccl"
    return "gloo"


def rank_device() -> torch.device:
    """The device this rank should put its tensors on: its own GPU under NCCL, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def environment() -> dict:
    """What this machine offers a reader: torch version, GPUs, and the usable backends."""
    backends = [b for b in ("gloo", "nccl", "mpi", "toy") if _backend_usable(b)]
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "gpus": gpus,
        "gpu_names": [torch.cuda.get_device_name(i) for i in range(gpus)],
        "backends": backends,
        "default_backend_4_ranks": default_backend(4),
        "under_torchrun": _under_torchrun(),
    }


def _backend_usable(name: str) -> bool:
    if name == "gloo":
        return dist.is_gloo_available()
    if name == "nccl":
        return dist.is_nccl_available() and torch.cuda.is_available()
    if name == "mpi":
        return dist.is_mpi_available()
    return name.upper() in dist.Backend.backend_list or name in dist.Backend.backend_list


def _check_arguments(fn, world_size, backend, timeout, check_local_gpus=True) -> str:
    if not callable(fn):
        raise ValueError(f"fn must be a callable (a function run on every rank), got {fn!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise ValueError(f"world_size must be an int from 1 to {MAX_WORLD_SIZE}, got {world_size!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1 (one process per rank), got {world_size}")
    if world_size > MAX_WORLD_SIZE:
        raise ValueError(
            f"world_size={world_size} is more local processes than this companion runs on one "
            f"machine (1 to {MAX_WORLD_SIZE}); for more ranks start the script with torchrun "
            f"across machines (see README)"
        )
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    backend = backend or default_backend(world_size)
    if not isinstance(backend, str):
        raise ValueError(f"backend must be a name such as 'gloo', 'nccl' or 'toy', got {backend!r}")
    backend = backend.lower()
    if not _backend_usable(backend):
        usable = [b for b in ("gloo", "nccl", "mpi", "toy") if _backend_usable(b)]
        raise ValueError(f"backend {backend!r} is not usable here; usable backends: {usable}")
    if backend == "nccl" and check_local_gpus:
        gpus = torch.cuda.device_count()
        if gpus < world_size:
            raise ValueError(
                f"backend 'nccl' needs one GPU per rank: world_size={world_size} but this machine "
                f"has {gpus} GPU(s); use world_size <= {gpus}, or backend='gloo'"
            )
    return backend


def preload(*modules: str) -> bool:
    """Have the rank-starting forkserver import ``modules`` once, before the first launch.

    Ranks are forked from a server that already imported torch and parlab. A chapter whose
    ranks use a heavy module (``torch.distributed.tensor``, ``torch.distributed.pipelining``)
    calls this first, so each launch does not import it again in every rank (seconds per
    launch on a small machine). Returns False when the server is already running: the
    modules are then imported by each rank as usual, which is slower but still correct.
    """
    for name in modules:
        importlib.import_module(name)  # a typo fails here, not inside every rank
    if _forkserver_ready:
        return False
    _preload.extend(m for m in modules if m not in _preload)
    return True


def _context():
    """The forkserver context, preloading torch and parlab once per Python process."""
    global _forkserver_ready
    ctx = mp.get_context("forkserver")
    if not _forkserver_ready:
        ctx.set_forkserver_preload(list(_preload))
        _forkserver_ready = True
    return ctx


# --------------------------------------------------------------------------- the rank side


def _watch_parent(alive_conn) -> None:
    """Exit this rank as soon as the caller closes its end of the liveness pipe (or dies)."""
    try:
        alive_conn.recv_bytes()
    except (EOFError, OSError):
        pass
    os._exit(70)


def _redirect_output(out_path: str) -> None:
    fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = io.TextIOWrapper(open(1, "wb", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(open(2, "wb", closefd=False), line_buffering=True)


def _rank_main(rank, world_size, backend, store_path, timeout_s, threads, payload, result_conn,
               alive_conn, out_path):
    """Entry point of one rank (runs in a process forked by the forkserver)."""
    os.setpgrp()  # our own process group, so the caller can kill anything this rank started
    threading.Thread(target=_watch_parent, args=(alive_conn,), daemon=True).start()
    _redirect_output(out_path)
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size), PARLAB_RANK=str(rank),
    )
    os.environ.setdefault("GLOO_SOCKET_IFNAME", _LOOPBACK)
    torch.set_num_threads(threads)
    try:
        fn, args, kwargs = cloudpickle.loads(payload)
        options = {}
        if backend == "nccl":
            torch.cuda.set_device(rank)
            options["device_id"] = torch.device("cuda", rank)
        store = dist.FileStore(store_path, world_size)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s), **options)
        dist.barrier()
        result = fn(*args, **kwargs)
        result_conn.send_bytes(cloudpickle.dumps(("returned",)))
        extras = {name: collect() for name, collect in _collectors.items()}
        dist.barrier()  # every rank finished fn before anyone tears the group down
        dist.destroy_process_group()
        message = cloudpickle.dumps(("ok", result, extras))
    except BaseException as exc:  # noqa: BLE001 - everything must reach the caller
        frames = exc.__traceback__.tb_next or exc.__traceback__  # drop this wrapper's frame
        tb = "".join(traceback.format_exception(type(exc), exc, frames))
        message = cloudpickle.dumps(("error", type(exc).__name__, str(exc), tb))
        _finish(result_conn, message, stay=True)
    _finish(result_conn, message, stay=False)


def _finish(result_conn, message: bytes, stay: bool) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    result_conn.send_bytes(message)
    if stay:
        # A failed rank waits to be stopped: if it exited now, its peers would fail with
        # "connection closed" and could reach the caller before the real cause.
        time.sleep(3600)
    os._exit(0)


# --------------------------------------------------------------------------- the caller side


def run(fn: Callable, world_size: int, *args, backend: str | None = None,
        timeout: float = DEFAULT_TIMEOUT, threads: int | None = None, **kwargs) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks; return each rank's result, in rank order.

    Inside ``fn``, ``torch.distributed`` is initialised: ``dist.get_rank()``,
    ``dist.all_reduce(...)`` and friends work, and :func:`rank_device` gives the device.

    - ``backend``: None picks ``"nccl"`` with one GPU per rank when there are enough GPUs,
      else ``"gloo"`` on the CPU; any registered backend by name (``"toy"`` logs traffic).
    - ``timeout``: seconds for the whole launch, also the process-group timeout.
    - ``threads``: torch threads per rank (default: the CPU cores shared among the ranks).

    Raises :class:`RankError` (with the rank and its traceback) when a rank raises or dies,
    :class:`RankTimeoutError` when ranks are still running at the timeout, and
    ``ValueError`` for arguments that cannot work. Each rank's printed output is shown as
    ``[rank r] ...`` in rank order after the ranks finish.
    """
    if "PARLAB_RANK" in os.environ:
        raise RuntimeError("parlab.launch.run was called inside a rank; call it from the notebook")
    if _under_torchrun():
        local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
        backend = _check_arguments(fn, world_size, backend or default_backend(local), timeout,
                                   check_local_gpus=False)
        return _run_under_torchrun(fn, world_size, backend, args, kwargs)
    backend = _check_arguments(fn, world_size, backend, timeout)
    if threads is None:
        threads = max(1, (os.cpu_count() or 1) // world_size)
    return _run_local(fn, world_size, backend, float(timeout), threads, args, kwargs)


def _run_local(fn, world_size, backend, timeout, threads, args, kwargs):
    global _last_run
    started = time.monotonic()
    ctx = _context()
    payload = cloudpickle.dumps((fn, args, kwargs))
    workdir = tempfile.mkdtemp(prefix="parlab-")
    alive_recv, alive_send = ctx.Pipe(duplex=False)
    procs, conns = [], []
    outputs: list[str] = []
    try:
        for rank in range(world_size):
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_rank_main, name=f"parlab-rank-{rank}", daemon=True,
                args=(rank, world_size, backend, os.path.join(workdir, "store"), timeout, threads,
                      payload, send, alive_recv, os.path.join(workdir, f"rank{rank}.out")),
            )
            proc.start()
            send.close()
            procs.append(proc)
            conns.append(recv)
        results, extras = _collect(procs, conns, started + timeout, timeout, workdir)
    finally:
        _stop(procs)
        alive_send.close()
        alive_recv.close()
        for conn in conns:
            conn.close()
        outputs = _read_outputs(workdir, world_size)
        shutil.rmtree(workdir, ignore_errors=True)
        _print_outputs(outputs)
    _last_run = LaunchRecord(world_size, backend, time.monotonic() - started, outputs, extras)
    return results


#: After the first failure, how long to listen for others before naming the cause.
_GRACE_S = 0.3
#: Words of an error that a rank gets because *another* rank went away.
_PEER_WORDS = ("connection reset", "connection closed", "remote worker", "broken pipe",
               "peer", "recv error", "read error", "write error")


def _collect(procs, conns, deadline, timeout, workdir):
    world_size = len(procs)
    results: list[Any] = [None] * world_size
    extras: list[dict] = [{} for _ in range(world_size)]
    pending, returned = set(range(world_size)), set()
    failures: list[tuple] = []  # (kind, rank, exc_type, text, traceback), in arrival order
    first_failure = None
    by_conn = {conn: rank for rank, conn in enumerate(conns)}
    by_sentinel = {proc.sentinel: rank for rank, proc in enumerate(procs)}
    while pending:
        if failures and first_failure is None:
            first_failure = time.monotonic()
            deadline = min(deadline, first_failure + _GRACE_S)
        remaining = deadline - time.monotonic()
        waitables = [conns[r] for r in pending] + [procs[r].sentinel for r in pending]
        ready = mpc.wait(waitables, timeout=remaining) if remaining > 0 else []
        if not ready:
            break
        for item in sorted(ready, key=lambda w: w not in by_conn):  # messages before deaths
            rank = by_conn.get(item, by_sentinel.get(item))
            if rank not in pending:
                continue
            if item in by_conn:
                try:
                    message = cloudpickle.loads(item.recv_bytes())
                except (EOFError, OSError):  # the pipe closed with nothing said: it died
                    message = ("died",)
                if message[0] == "returned":
                    returned.add(rank)
                elif message[0] == "ok":
                    results[rank], extras[rank] = message[1], message[2]
                    pending.discard(rank)
                elif message[0] == "error":
                    failures.append(("raised", rank) + tuple(message[1:]))
                    pending.discard(rank)
            if item not in by_conn or message[0] == "died":
                if item not in by_conn and conns[rank].poll():
                    continue  # its last words are waiting in the pipe: read them first
                procs[rank].join(1)
                failures.append(("died", rank, None, procs[rank].exitcode, ""))
                pending.discard(rank)
    if failures:
        _stop(procs)
        _raise_failure(failures, world_size, workdir)
    if pending:
        ranks, done = sorted(pending), sorted(returned)
        raise RankTimeoutError(
            f"rank(s) {ranks} of {world_size} did not finish within {timeout:g} s"
            + (f"; rank(s) {done} had returned from fn and were waiting for the others" if done else "")
            + ". A rank waiting for a collective that another rank never calls hangs: check "
            "that every rank makes the same collective calls in the same order; if the work "
            "is just slow, pass a larger timeout=.",
            pending=ranks, outputs=_read_outputs(workdir, world_size),
        )
    return results, extras


def _raise_failure(failures, world_size, workdir):
    """Name the root cause: a rank that died, else a real error, else a peer's lost connection."""
    def badness(failure):
        kind, _, _, text, _ = failure
        if kind == "died":
            return 0
        return 2 if any(w in str(text).lower() for w in _PEER_WORDS) else 1
    kind, rank, exc_type, text, tb = min(failures, key=badness)  # stable: earliest among equals
    outputs = _read_outputs(workdir, world_size)
    others = sorted({f[1] for f in failures} - {rank})
    also = f"\n(rank(s) {others} failed after it, as a consequence)" if others else ""
    if kind == "died":
        how = (f"was killed by signal {-text}" if text is not None and text < 0
               else f"exited with code {text}" if text is not None else "exited")
        raise RankError(f"rank {rank} {how} before returning a result{also}. Its last output:\n"
                        + _tail(outputs[rank]), rank=rank, outputs=outputs)
    raise RankError(
        f"rank {rank} raised {exc_type}: {text}{also}\n\n--- traceback of rank {rank} ---\n{tb}",
        rank=rank, exc_type=exc_type, rank_traceback=tb, outputs=outputs,
    )


def _stop(procs) -> None:
    """Kill every rank that is still alive (its whole process group), and reap it."""
    for proc in procs:
        if proc.pid is None or proc.exitcode is not None:
            continue
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            try:
                proc.kill()
            except (ProcessLookupError, ValueError, AttributeError):
                pass
    for proc in procs:
        if proc.pid is not None:
            proc.join(5)


def _read_outputs(workdir, world_size) -> list[str]:
    outputs = []
    for rank in range(world_size):
        try:
            with open(os.path.join(workdir, f"rank{rank}.out"), errors="replace") as f:
                outputs.append(f.read())
        except OSError:
            outputs.append("")
    return outputs


def _print_outputs(outputs) -> None:
    for rank, text in enumerate(outputs):
        for line in text.splitlines():
            print(f"[rank {rank}] {line}")


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.splitlines()[-lines:]) or "(nothing)"


def _destroy_group() -> None:
    if dist.is_initialized():
        try:
            dist.barrier()  # nobody leaves while a peer still talks to it
        finally:
            dist.destroy_process_group()


def _run_under_torchrun(fn, world_size, backend, args, kwargs):
    """torchrun started the processes: join its job, run fn here, gather every rank's result."""
    env_world = int(os.environ["WORLD_SIZE"])
    if not dist.is_initialized():
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend)  # env:// rendezvous that torchrun prepared
        # we made the group, so we tear it down: gloo's threads still running at exit
        # can abort the interpreter ("terminate called without an active exception")
        atexit.register(_destroy_group)
    if env_world != world_size and dist.get_rank() == 0:
        warnings.warn(f"run(..., world_size={world_size}) under torchrun: using torchrun's "
                      f"WORLD_SIZE={env_world}", stacklevel=3)
    result = fn(*args, **kwargs)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, result)
    return gathered
