"""Ranks forked ahead of time: a launch hands its jobs to idle ranks instead of forking them.

Why: the server forks one rank at a time, and each fork of a process that holds torch and
parlab copies hundreds of megabytes of page tables (5 to 7 ms on 2 cores); the ranks then join
their group one by one as they come up. Of a warm launch of 4 ranks that does nothing (about
60 ms), some 18 ms went to forking and as much to the first ranks waiting for the last.
A spare is a rank process already forked, blocked on a pipe: a launch sends it its job
(:func:`parlab.launch.rank.rank_main`'s arguments) and it becomes that rank, so every rank
starts at once. After each launch a background thread forks new spares, as many as the
largest launch so far (at most :data:`MAX_SPARES`), while the reader reads the output or the
next cell runs.

Only where :func:`enable` was called: in a notebook kernel (:mod:`parlab.launch.local` calls
it where the server warms at its import), where a reader waits on many small
launches. A spare waits for its job on the same pipe that tells a rank its caller is gone:
the caller closes it after the launch, or by exiting, and an unused spare exits on that.
The job carries the caller's working directory and ``sys.path`` at launch time, which a
spare forked earlier would not have.
"""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.connection as mpc
import os
import sys
import threading

import cloudpickle

from parlab.launch.rank import rank_main
from parlab.launch.server import RankProcess

__all__ = ["enable", "enabled", "take", "refill", "send_job", "MAX_SPARES"]

#: The most spares kept ready (a larger launch forks the rest as before).
MAX_SPARES = 8

_lock = threading.Lock()
_pool: list["Spare"] = []
_state = {"enabled": False, "want": 0, "owner": None, "refilling": None}


class Spare:
    """An idle rank process: ``jobs`` (this side's end) sends its job, ``results`` is the end
    the rank reports on, as a freshly started rank's result pipe."""

    __slots__ = ("proc", "jobs", "results")

    def __init__(self, proc, jobs, results):
        self.proc, self.jobs, self.results = proc, jobs, results

    def ready(self) -> bool:
        return self.proc.exitcode is None

    def close(self) -> None:
        for conn in (self.jobs, self.results):
            conn.close()


def enable() -> None:
    """Keep spares in this process from now on (see the module)."""
    _state["enabled"] = True
    atexit.register(_close_all)


def enabled() -> bool:
    return _state["enabled"] and RankProcess is not None


def _mine() -> list[Spare]:
    """The pool, emptied first in a process that inherited it by fork (its spares are the
    parent's, and report to the parent)."""
    if _state["owner"] != os.getpid():
        _pool.clear()
        _state["owner"], _state["refilling"] = os.getpid(), None
    return _pool


def take(count: int) -> list[Spare]:
    """Up to ``count`` spares, ready to receive a job, out of the pool."""
    if not enabled():
        return []
    with _lock:
        pool = _mine()
        taken = []
        while pool and len(taken) < count:
            spare = pool.pop()
            if spare.ready():
                taken.append(spare)
            else:
                spare.close()
        return taken


def send_job(spare: Spare, work: dict) -> None:
    """Hand ``spare`` the keyword arguments of :func:`~parlab.launch.rank.rank_main` that a
    fresh rank gets (all but its pipes, which the spare already has)."""
    spare.jobs.send_bytes(cloudpickle.dumps((work, os.getcwd(), list(sys.path))))


def refill(world_size: int) -> None:
    """Fork spares in the background until the pool holds as many as the largest launch."""
    if not enabled():
        return
    with _lock:
        _mine()
        _state["want"] = min(MAX_SPARES, max(_state["want"], world_size))
        if _state["refilling"] is not None or len(_pool) >= _state["want"]:
            return
        thread = _state["refilling"] = threading.Thread(target=_fork_spares,
                                                        name="parlab-spares", daemon=True)
    thread.start()


def _fork_spares() -> None:
    try:
        while True:
            with _lock:
                if not enabled() or len(_pool) >= _state["want"]:
                    return
            spare = _start_one()
            if spare is None:
                return
            with _lock:
                if enabled():
                    _pool.append(spare)
                else:  # the caller is exiting (_close_all): this one goes at once
                    spare.close()
                    return
    finally:
        _state["refilling"] = None


def _start_one() -> Spare | None:
    jobs_recv, jobs_send = mpc.Pipe(duplex=False)
    results_recv, results_send = mpc.Pipe(duplex=False)
    # not daemonic, as a rank started for a launch (it may start processes of its own)
    proc = RankProcess(target=_spare_main, name="parlab-spare", daemon=False,
                       args=(jobs_recv, results_send))
    try:
        proc.start()
    except (OSError, EOFError, ValueError):  # the server is gone (this process is exiting)
        for conn in (jobs_recv, jobs_send, results_recv, results_send):
            conn.close()
        return None
    jobs_recv.close()
    results_send.close()
    return Spare(proc, jobs_send, results_recv)


def _close_all() -> None:
    """At exit (before multiprocessing joins its children): stop forking spares, close every
    spare's job pipe, and so let every spare exit."""
    with _lock:
        _state["enabled"] = False
        thread = _state["refilling"] if _state["owner"] == os.getpid() else None
    if thread is not None:  # a start half done would leave its child waiting on a dead caller
        thread.join(5)
    with _lock:
        for spare in _mine():
            spare.close()
        _pool.clear()


def _spare_main(jobs, results) -> None:
    """A spare's life: wait for a job, then be that rank; exit if the caller closes the pipe."""
    try:
        work, cwd, path = cloudpickle.loads(jobs.recv_bytes())
    except (EOFError, OSError):
        os._exit(0)
    try:
        os.chdir(cwd)
    except OSError:
        pass
    sys.path[:] = path
    multiprocessing.current_process().name = f"parlab-rank-{work['rank']}"  # as a new rank's
    rank_main(**work, result_conn=results, alive_conn=jobs)
