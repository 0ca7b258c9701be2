"""The rank side of a local launch: what each forked process does from start to exit.

A rank joins the process group through a file store, runs ``fn`` (recording its spans),
calls the registered reports (:mod:`parlab.launch.reports`), sends its result, reports and
spans (or its exception and traceback) down a pipe, and exits. It watches a second pipe so
that it dies with its caller, and it leads its own process group: when it ends it takes with it
whatever it started (a ``subprocess.Popen`` left running), and the caller can kill the
whole group of a rank that hangs or dies.
"""

from __future__ import annotations

import datetime
import io
import os
import signal
import sys
import threading
import time
import traceback

import cloudpickle
import torch
import torch.distributed as dist

from parlab.launch.reports import collect_reports, start_reports
from parlab.launch.spans import recording

__all__ = ["rank_main"]

_LOOPBACK = "lo0" if sys.platform == "darwin" else "lo"

#: A launcher's variables that a stale shell may carry into a rank (torchrun's, mostly).
_FOREIGN = ("MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME",
            "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE")


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


def rank_main(rank, world_size, backend, store_path, timeout_s, threads, payload, result_conn,
               alive_conn, out_path, inherited=None, seed=0):
    """Entry point of one rank (forked by the forkserver, or by the caller when ``inherited``
    lists the caller's pipe ends it must close)."""
    if inherited is not None:
        _as_if_fresh(inherited, seed)
    os.setpgrp()  # our own process group, so the caller can kill anything this rank started
    threading.Thread(target=_watch_parent, args=(alive_conn,), daemon=True).start()
    _redirect_output(out_path)
    for name in [n for n in os.environ if n in _FOREIGN or n.startswith("TORCHELASTIC_")]:
        del os.environ[name]
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
        start_reports()
        dist.barrier()
        with recording() as recorder:  # every span fn records goes home as well
            result = fn(*args, **kwargs)
        result_conn.send_bytes(cloudpickle.dumps(("returned",)))
        extras = collect_reports()
        dist.barrier()  # every rank finished fn before anyone tears the group down
        dist.destroy_process_group()
        message = cloudpickle.dumps(("ok", result, extras, recorder.spans))
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
    _end_group(0)

