"""The rank side of a local launch: what each forked process does from start to exit.

A rank joins the process group through a file store, runs ``fn`` (recording its spans),
calls the registered reports (:mod:`parlab.launch.reports`), sends its result, reports and
spans (or its exception and traceback) down a pipe, and exits. It watches a second pipe so
that it dies with its caller, and it leads its own process group: when it ends it takes with it
whatever it started (a ``subprocess.Popen`` left running), and the caller can kill the
whole group of a rank that hangs or dies.

A rank behaves as a worker that ``torchrun`` started (tests/test_launch_workers.py runs the
same habits both ways): it is not daemonic (so it may start processes of its own: a
``multiprocessing.Pool``, a ``DataLoader`` with workers), it has torchrun's variables
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, and a
``MASTER_ADDR``/``MASTER_PORT`` of its own launch, so ``dist.init_process_group()`` from the
environment works after ``fn`` destroyed the group), ``fn``'s first ``init_process_group``
joins the group the launch made instead of failing, ``sys.exit(0)`` is a success, and its
non-daemon threads and ``atexit`` handlers run when it ends, as at a normal interpreter exit.
"""

from __future__ import annotations

import atexit
import datetime
import functools
import io
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback

import cloudpickle
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from parlab.launch.reports import collect_reports, start_reports
from parlab.launch.sources import restore_origins
from parlab.launch.spans import recording

__all__ = ["rank_main", "in_rank", "process_group_backend", "is_launch_backend"]

_LOOPBACK = "lo0" if sys.platform == "darwin" else "lo"

#: A launcher's variables that a stale shell may carry into a rank (torchrun's, mostly).
_FOREIGN = ("MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME",
            "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE")

#: This process's rank, in a rank (None elsewhere: the caller, and whatever a rank starts).
_this_rank: int | None = None


def in_rank() -> bool:
    """True in a rank process itself (not in the processes it starts, which may launch)."""
    return _this_rank is not None


def _end_group(code: int) -> None:
    """Exit, killing everything this rank started (its process group, itself included)."""
    try:
        os.killpg(os.getpgrp(), signal.SIGKILL)
    finally:
        os._exit(code)


def _watch_parent(alive_conn) -> None:
    """Exit this rank as soon as the caller closes its end of the liveness pipe (or dies)."""
    try:
        alive_conn.recv_bytes()
    except (EOFError, OSError):
        pass
    _end_group(70)


def _redirect_output(out_path: str) -> None:
    fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = io.TextIOWrapper(open(1, "wb", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(open(2, "wb", closefd=False), line_buffering=True)


def _as_if_fresh(inherited, seed: int) -> None:
    """Start a rank forked from the caller the way one forked from the server starts.

    It closes the caller's ends of the pipes it inherited (or a dead caller would go
    unnoticed) and resets what the caller may have changed: torch's seed (a server's ranks
    share the server's random seed; these share ``seed``, random once per caller), default
    dtype and grad mode, and the caller's forkserver (the caller's, not this rank's).
    """
    from parlab.launch.server import reset_after_fork

    for conn in inherited:
        conn.close()
    torch.manual_seed(seed)
    torch.set_default_dtype(torch.float32)
    torch.set_grad_enabled(True)
    reset_after_fork()


def process_group_backend(backend: str) -> str:
    """What a launch asks ``init_process_group`` for: NCCL for CUDA tensors and gloo for CPU
    ones in the same group (PyTorch's ``"cpu:gloo,cuda:nccl"``, its own default on a GPU
    machine), so a rank function written for the CPU runs unchanged where each rank has a
    GPU; every other backend as it is."""
    return "cpu:gloo,cuda:nccl" if backend == "nccl" else backend


def is_launch_backend(name, backend: str) -> bool:
    """Whether a process group asked for (or made) with backend ``name`` is the one a launch
    on ``backend`` makes: that name, or :func:`process_group_backend`'s."""
    return str(name).lower() in (backend, process_group_backend(backend))


def rank_main(rank, world_size, backend, store_path, timeout_s, threads, payload, result_conn,
               alive_conn, out_path, job=None, inherited=None, seed=0):
    """Entry point of one rank (forked by the forkserver, or by the caller when ``inherited``
    lists the caller's pipe ends it must close).

    ``job``: ``master_port`` (a free port the caller picked, for ``init_process_group`` from
    the environment), ``main_path`` (the caller's script, if it has one) and
    ``start_method`` (the caller's default way to start a process).
    """
    global _this_rank
    _this_rank = rank
    job = job or {}
    if inherited is not None:
        _as_if_fresh(inherited, seed)
    os.setpgrp()  # our own process group, so the caller can kill anything this rank started
    threading.Thread(target=_watch_parent, args=(alive_conn,), daemon=True).start()
    _redirect_output(out_path)
    atexit._clear()  # what the forkserver registered is not this rank's to run
    # the caller's start method (the platform's default), not the forkserver that made us
    multiprocessing.set_start_method(job.get("start_method"), force=True)
    for name in [n for n in os.environ if n in _FOREIGN or n.startswith("TORCHELASTIC_")]:
        del os.environ[name]
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size), GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(job.get("master_port", 29500)),
    )
    os.environ.setdefault("GLOO_SOCKET_IFNAME", _LOOPBACK)
    torch.set_num_threads(threads)
    try:
        fn, args, kwargs = cloudpickle.loads(payload)
        restore_origins(job.get("origins", {}), fn)  # tracebacks name the reader's cell
        _adopt_main(fn, job.get("main_path"))
        options = {}
        if backend == "nccl":
            torch.cuda.set_device(rank)
            options["device_id"] = torch.device("cuda", rank)
        store = dist.FileStore(store_path, world_size)
        store.set_timeout(datetime.timedelta(seconds=timeout_s))
        dist.init_process_group(process_group_backend(backend), store=store, rank=rank,
                                world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s), **options)
        _join_instead_of_init(dist.group.WORLD, backend, rank, world_size)
        start_reports()
        dist.barrier()
        with recording() as recorder:  # every span fn records goes home as well
            result = _call(fn, args, kwargs)
        result_conn.send_bytes(cloudpickle.dumps(("returned",)))
        extras = collect_reports()
        # every rank finished fn before anyone tears the group down (through the store:
        # fn may have destroyed the launch's group, or made one of its own)
        _store_barrier(store, world_size)
        if dist.is_initialized():
            dist.destroy_process_group()
        _exit_like_python()
        message = cloudpickle.dumps(("ok", result, extras, recorder.spans))
    except BaseException as exc:  # noqa: BLE001 - everything must reach the caller
        tb = "".join(traceback.format_exception(type(exc), exc, _without_launcher(exc.__traceback__)))
        text = str(exc)
        if isinstance(exc, SystemExit):
            text = f"{exc.code!r} (fn called sys.exit({exc.code!r}): a worker that exits non-zero failed)"
        message = cloudpickle.dumps(("error", type(exc).__name__, text, tb))
        _finish(result_conn, message, stay=True)
    _finish(result_conn, message, stay=False)


def _without_launcher(tb):
    """The traceback from the first frame that is not this module's (rank_main, _call)."""
    first = tb
    while first is not None and first.tb_frame.f_code.co_filename == __file__:
        first = first.tb_next
    return first or tb


def _call(fn, args, kwargs):
    """``fn(*args, **kwargs)``; ``sys.exit(0)`` (or ``sys.exit()``) in it is a success, as for a script."""
    try:
        return fn(*args, **kwargs)
    except SystemExit as exc:
        if exc.code is None or exc.code == 0:
            return None
        raise


def _adopt_main(fn, main_path) -> None:
    """Make the caller's ``__main__`` names findable here, as they are in a torchrun worker.

    ``fn`` came by value (cloudpickle), with the globals it uses. Pickle finds a function by
    module and name: so that ``fn`` can hand a function of the caller's notebook or script to
    a ``multiprocessing.Pool`` (forked from this rank), those globals go into this process's
    ``__main__``. With ``main_path`` (the caller is a script), a child this rank *spawns*
    imports that script as ``__mp_main__``, as a spawned child of a torchrun worker does.
    """
    main = sys.modules["__main__"]
    if main_path and os.path.isfile(main_path):
        main.__file__ = main_path
    if getattr(fn, "__module__", None) != "__main__":
        return
    for name, value in getattr(fn, "__globals__", {}).items():
        if name.isidentifier() and not name.startswith("__"):
            setattr(main, name, value)
    name = getattr(fn, "__qualname__", "")
    if name.isidentifier():
        setattr(main, name, fn)


def _join_instead_of_init(launch_group, backend, rank, world_size) -> None:
    """Let ``fn`` call ``dist.init_process_group`` first, as a torchrun script does.

    While the launch's own group is the default one, such a call joins it (nothing to do)
    when it asks for the same backend, rank and world size, and fails saying what to change
    when it asks for another. Once ``fn`` destroyed the group, the call is PyTorch's own
    (from the environment: ``MASTER_ADDR``/``MASTER_PORT`` are set).
    """
    original = distributed_c10d.init_process_group

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        if not (dist.is_initialized() and dist.group.WORLD is launch_group):
            return original(*args, **kwargs)
        asked = dict(zip(("backend", "init_method", "timeout", "world_size", "rank"), args))
        asked.update(kwargs)
        wanted = asked.get("backend")
        if wanted is not None and not is_launch_backend(wanted, backend):
            raise ValueError(
                f"init_process_group({wanted!r}) inside parlab.launch.run: the launch already "
                f"made the process group with backend {backend!r}. Ask run() for it: "
                f"run(fn, {world_size}, backend={str(wanted).lower()!r}); or destroy the "
                f"group first (dist.destroy_process_group()), then init_process_group works "
                f"from the environment")
        for key, have in (("world_size", world_size), ("rank", rank)):
            value = asked.get(key, -1)
            if value not in (-1, None) and value != have:
                raise ValueError(
                    f"init_process_group({key}={value!r}) inside parlab.launch.run, but this "
                    f"rank is {key}={have} of the launch's group (os.environ['"
                    f"{key.upper()}'] says so too): leave {key} out, or pass {key}={have}")
        return None

    dist.init_process_group = init_process_group
    distributed_c10d.init_process_group = init_process_group


def _store_barrier(store, world_size: int) -> None:
    if store.add("parlab/finished", 1) == world_size:
        store.set("parlab/all_finished", b"1")
    store.wait(["parlab/all_finished"])


def _exit_like_python() -> None:
    """What a normal interpreter exit does and ``os._exit`` skips: wait for the non-daemon
    threads ``fn`` left running, then run the ``atexit`` handlers it registered."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()


def _finish(result_conn, message: bytes, stay: bool) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    result_conn.send_bytes(message)
    if stay:
        # fn's atexit handlers, at best (the caller stops this rank within a second)
        try:
            atexit._run_exitfuncs()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        # A failed rank waits to be stopped: if it exited now, its peers would fail with
        # "connection closed" and could reach the caller before the real cause.
        time.sleep(3600)
    _end_group(0)
