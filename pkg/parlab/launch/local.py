"""Start N real torch.distributed ranks from a notebook cell (or a script) and get their results.

Why this module exists: every chapter runs collectives between real processes, and a
reader presses shift-enter many times. So a launch must be fast (in a notebook ranks are
forked from a forkserver that already imported torch, in a script from the caller itself:
about a tenth of a second for 4 ranks), must never hang the notebook (a rank's exception
comes back within a second as :class:`RankError`; a hang ends at ``timeout``), must print
each rank's output in rank order (so stored notebook outputs are deterministic), and must
leave no process behind.

Under ``torchrun`` (a worker that torchrun started, not a shell with stale ``RANK`` and
``WORLD_SIZE``: see :mod:`parlab.launch.torchrun`) the same call runs ``fn`` in the job
that torchrun already started, so an example scales to many machines with NCCL without a
code change.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import random
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable

import cloudpickle

from parlab.launch.backends import DEFAULT_TIMEOUT, check_arguments, default_backend
from parlab.launch.errors import RankError, RankTimeoutError
from parlab.launch.rank import in_rank, rank_main
from parlab.launch.result import Run
from parlab.launch.forking import direct_fork_safe
from parlab.launch.kernel import exit_without_collecting
from parlab.launch.server import (ForkedRankProcess, RankProcess,
                                  import_for_ranks, import_while_waiting, is_started, warm,
                                  warm_in_notebook)
from parlab.launch.sources import code_origins, for_the_reader
from parlab.launch.spares import (enable as keep_spares, enabled as keeps_spares, refill,
                                  send_job, take)
from parlab.launch.torchrun import run_under_torchrun, under_torchrun, warn_stale_environment
from parlab.launch.workdir import make_workdir, read_outputs, remove_workdir

__all__ = ["run"]


def run(fn: Callable, world_size: int, *args, backend: str | None = None,
        timeout: float = DEFAULT_TIMEOUT, threads: int | None = None, **kwargs) -> Run:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks; return each rank's result, in rank order.

    The :class:`Run` returned is that list of results, and carries what the run saw:
    ``.outputs``, ``.spans`` (each rank's), ``.traffic`` (with ``backend="toy"``),
    ``.extras``, ``.seconds``.

    Inside ``fn``, ``torch.distributed`` is initialised: ``dist.get_rank()``,
    ``dist.all_reduce(...)`` and friends work, and :func:`rank_device` gives the device.

    - ``backend``: None picks ``"nccl"`` with one GPU per rank when there are enough GPUs
      (its group carries CPU tensors through gloo), else ``"gloo"`` on the CPU; any
      registered backend by name (``"toy"`` logs traffic).
    - ``timeout``: seconds the ranks may take once started, also the process-group timeout
      (more than 0, at most a week). Not counted: the wait for the forkserver to start them.
    - ``threads``: torch threads per rank (default: the CPU cores shared among the ranks).

    Works from a notebook, a script (with or without ``if __name__ == "__main__":``),
    ``python -c`` and ``python - <<EOF``: ``fn`` travels to the ranks by value.

    Raises :class:`RankError` (with the rank and its traceback) when a rank raises or dies,
    :class:`RankTimeoutError` when ranks are still running at the timeout, and
    ``ValueError`` for arguments that cannot work (before any rank starts). Each rank's
    printed output is shown as ``[rank r] ...`` in rank order after the ranks finish.
    """
    __tracebackhide__ = True  # IPython shows the reader's cell, not the launcher's frames
    if in_rank():
        raise RuntimeError("parlab.launch.run was called inside a rank (in fn); call it from the "
                           "notebook or script, or from a process that fn starts")
    if under_torchrun():
        local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
        backend = check_arguments(fn, world_size, backend or default_backend(local), timeout,
                                  threads, check_local_gpus=False)
        try:
            return run_under_torchrun(fn, world_size, backend, float(timeout), args, kwargs)
        except RankError as error:
            raise error.with_traceback(None)  # the rank's traceback is in the message
    backend = check_arguments(fn, world_size, backend, timeout, threads)
    try:
        payload = cloudpickle.dumps((fn, args, kwargs))
    except Exception as exc:  # noqa: BLE001 - any pickling failure means the same thing
        raise ValueError(f"fn and its arguments travel to the ranks by pickling (cloudpickle), "
                         f"and this one cannot be pickled: {type(exc).__name__}: {exc}") from exc
    warn_stale_environment(world_size)
    if threads is None:
        threads = max(1, (os.cpu_count() or 1) // world_size)
    try:
        return _run_local(payload, world_size, backend, float(timeout), threads, code_origins(fn))
    except RankError as error:  # the launcher's own frames would tell a reader nothing
        raise error.with_traceback(None)  # the rank's traceback is in the message


# in a notebook kernel the server warms from this import on, ranks are forked ahead of each
# launch (parlab.launch.spares), and the kernel's exit skips collecting its heap (.kernel)
if warm_in_notebook(launches_here=not (under_torchrun() or in_rank())):
    keep_spares()
    exit_without_collecting()

#: The torch seed of ranks forked from this process (random, like the server's, and shared).
_DIRECT_SEED = random.SystemRandom().getrandbits(63)


def _run_local(payload, world_size, backend, timeout, threads, origins=None):
    __tracebackhide__ = True
    started = time.monotonic()
    # outside a notebook kernel nothing starts the server while launches can fork from here
    direct = not is_started() and direct_fork_safe(backend, threads)
    if direct:
        import_for_ranks()  # from the second launch on: what the server would have preloaded
    else:
        warm()  # the ranks come from the server: start it now, if nothing did yet
    importing = None if direct else import_while_waiting()
    workdir = make_workdir()
    alive_recv, alive_send = mpc.Pipe(duplex=False)
    procs, conns = [], []
    outputs: list[str] = []
    job = {"master_port": _free_port(), "main_path": _main_path(), "origins": origins or {},
           "start_method": mp.get_start_method(allow_none=True) or mp.get_all_start_methods()[0]}
    spares = [] if direct else take(world_size)
    try:
        for rank in range(world_size):
            # rank_main's arguments but its pipes (a spare has its own; a new rank gets them)
            work = {"rank": rank, "world_size": world_size, "backend": backend,
                    "store_path": os.path.join(workdir, "store"), "timeout_s": timeout,
                    "threads": threads, "payload": payload,
                    "out_path": os.path.join(workdir, f"rank{rank}.out"), "job": job}
            spare = spares[rank] if rank < len(spares) else None
            if spare is not None:
                try:  # a rank forked ahead of time: it gets its job down its pipe
                    send_job(spare, work)
                    procs.append(spare.proc)
                    conns.append(spare.results)
                    continue
                except OSError:  # it died while idle: fork this rank as below
                    spare.close()
            recv, send = mpc.Pipe(duplex=False)
            # a rank forked from this process must close the ends that stay here
            inherited = ({"inherited": [alive_send] + conns + [recv], "seed": _DIRECT_SEED}
                         if direct else {})
            # not daemonic: a rank may start processes of its own (a Pool, DataLoader workers),
            # which multiprocessing refuses to a daemon; _stop below still ends every rank
            proc = (ForkedRankProcess if direct else RankProcess)(
                target=rank_main, name=f"parlab-rank-{rank}", daemon=False,
                kwargs={**work, "result_conn": send, "alive_conn": alive_recv, **inherited},
            )
            proc.start()  # from the server: the first start waits for it to import torch
            send.close()
            procs.append(proc)
            conns.append(recv)
        # the clock starts when every rank runs: waiting for the forkserver is not their time
        deadline = time.monotonic() + timeout
        results, extras, spans = _collect(procs, conns, deadline, timeout, workdir)
    finally:
        _stop(procs, reap_later=True)
        alive_send.close()
        alive_recv.close()
        for conn in conns + [spare.jobs for spare in spares]:
            conn.close()
        outputs = read_outputs(workdir, world_size)
        remove_workdir(workdir)
        _print_outputs(outputs)
        if direct and keeps_spares():
            warm()  # the next launches come from the server and the spares it forks
        refill(world_size)  # where spares are kept, their forks begin (in the background)
        if importing is not None:
            importing.join()
    return Run(results, world_size=world_size, backend=backend,
               seconds=time.monotonic() - started, outputs=outputs, extras=extras, spans=spans)


def _free_port() -> int:
    """A loopback port nobody listens on now: the ranks' MASTER_PORT, for a group that fn
    makes itself from the environment (rank 0 then serves it, as under torchrun's default)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _main_path() -> str | None:
    """The caller's script, if it is one (a child that a rank spawns imports it, as under
    torchrun); None in a notebook, ``python -c`` or a heredoc."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    return os.path.abspath(path) if path and os.path.isfile(path) else None


#: After the first failure, how long to listen for others before naming the cause.
_GRACE_S = 0.3
#: Words of an error that a rank gets because *another* rank went away.
_PEER_WORDS = ("connection reset", "connection closed", "remote worker", "broken pipe",
               "peer", "recv error", "read error", "write error")


def _collect(procs, conns, deadline, timeout, workdir):
    __tracebackhide__ = True
    world_size = len(procs)
    results: list[Any] = [None] * world_size
    extras: list[dict] = [{} for _ in range(world_size)]
    spans: list[list] = [[] for _ in range(world_size)]
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
                    results[rank], extras[rank], spans[rank] = message[1:4]
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
            pending=ranks, outputs=read_outputs(workdir, world_size),
        )
    return results, extras, spans


def _raise_failure(failures, world_size, workdir):
    """Name the root cause: a rank that died, else a real error, else a peer's lost connection."""
    __tracebackhide__ = True
    def badness(failure):
        kind, _, _, text, _ = failure
        if kind == "died":
            return 0
        return 2 if any(w in str(text).lower() for w in _PEER_WORDS) else 1
    kind, rank, exc_type, text, tb = min(failures, key=badness)  # stable: earliest among equals
    tb = for_the_reader(tb or "")
    outputs = read_outputs(workdir, world_size)
    others = sorted({f[1] for f in failures} - {rank})
    also = f"\n(rank(s) {others} failed after it, as a consequence)" if others else ""
    if kind == "died":
        raise RankError(f"rank {rank} {_how_it_ended(text)} before returning a result{also}. "
                        f"Its last output (stdout and stderr):\n"
                        + _last_words(outputs[rank], workdir, rank), rank=rank, outputs=outputs)
    raise RankError(
        f"rank {rank} raised {exc_type}: {text}{also}\n\n--- traceback of rank {rank} ---\n{tb}",
        rank=rank, exc_type=exc_type, rank_traceback=tb, outputs=outputs,
    )


def _how_it_ended(code) -> str:
    if code is None:
        return "exited"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown signal"
        return f"was killed by signal {-code} ({name})"
    return f"exited with code {code}"


def _last_words(output: str, workdir: str, rank: int) -> str:
    if output.strip():
        return _tail(output)
    if os.path.exists(os.path.join(workdir, f"rank{rank}.out")):
        return "(no output: it printed nothing before it ended)"
    return ("(no output: it ended while starting, before it could capture its output; whatever "
            "it wrote went to this process's stderr: the terminal, or the Jupyter server's log)")


def _stop(procs, reap_later: bool = False) -> None:
    """Kill every rank's whole process group (whatever it started too), and reap the rank.

    A rank that ends normally kills its own group on the way out; a rank that died
    (``os._exit``, a signal) or is still running is killed here, group and all, so nothing
    it started outlives the launch. (A pid is not reused while a process group of that
    number still has members, so this reaches only the group the rank made.)
    ``reap_later``: collect the killed ranks' exit on a background thread instead of
    waiting for it here (a process as large as a rank takes milliseconds to go: a sixth of a
    warm launch of 2 ranks); after a success nothing needs their exit codes.
    """
    for proc in procs:
        if proc.pid is None:
            continue
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            if proc.exitcode is None:
                try:
                    proc.kill()
                except (ProcessLookupError, ValueError, AttributeError):
                    pass
    started = [proc for proc in procs if proc.pid is not None]
    if reap_later:
        threading.Thread(target=_reap, args=(started,), name="parlab-reap", daemon=True).start()
    else:
        _reap(started)


def _reap(procs) -> None:
    for proc in procs:
        proc.join(5)


def _print_outputs(outputs) -> None:
    for rank, text in enumerate(outputs):
        for line in text.splitlines():
            print(f"[rank {rank}] {line}")


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.splitlines()[-lines:])

