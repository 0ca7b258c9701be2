"""Start N real torch.distributed ranks from a notebook cell (or a script) and get their results.

``run(fn, 4)`` forks four ranks from a warm forkserver, runs ``fn`` on each with
``torch.distributed`` initialised, and returns their results in rank order; under
``torchrun`` the same call joins the job torchrun started. Modules: ``local`` (the caller
side), ``rank`` (what each rank does), ``server`` (the forkserver and the rank process),
``workdir`` (each launch's folder), ``torchrun``, ``backends`` (backend and device choice,
argument checks), ``record`` (the last launch and per-rank collectors), ``errors``.
This subpackage imports nothing else of parlab.
"""

from parlab.launch.backends import (DEFAULT_TIMEOUT, MAX_WORLD_SIZE, default_backend,
                                    environment, rank_device)
from parlab.launch.errors import RankError, RankTimeoutError
from parlab.launch.local import run
from parlab.launch.record import LaunchRecord, last_run, register_collector
from parlab.launch.server import preload

__all__ = ["run", "RankError", "RankTimeoutError", "default_backend", "rank_device",
           "environment", "MAX_WORLD_SIZE", "DEFAULT_TIMEOUT", "register_collector", "last_run",
           "LaunchRecord", "preload"]
