"""Start N real torch.distributed ranks from a notebook cell (or a script) and get their results.

``run(fn, 4)`` forks four ranks (in a notebook from a warm forkserver, in a script from the
caller), runs ``fn`` on each with ``torch.distributed`` initialised, and returns a
:class:`Run`: their results in rank order, carrying what the run saw (printed output, each
rank's spans, the toy backend's traffic). Under ``torchrun`` the same call joins the job
torchrun started. Modules: ``local`` (the caller side), ``rank`` (what each rank does),
``server`` (the forkserver and the rank process; ``modules``: what it preloads, ``apart``:
how its process starts), ``spares`` (ranks forked ahead of the next launch, in a notebook),
``kernel`` (what the import changes in a notebook kernel), ``workdir`` (each launch's
folder), ``torchrun``, ``backends`` (backend and device choice, argument checks), ``result``
(the :class:`Run`), ``reports`` (values each rank sends home after ``fn``, registered by
layers above), ``spans`` (what a rank was doing and when), ``errors``. This subpackage
imports nothing else of parlab.
"""

from parlab.launch.backends import (DEFAULT_TIMEOUT, MAX_WORLD_SIZE, default_backend,
                                    environment, rank_device)
from parlab.launch.errors import RankError, RankTimeoutError
from parlab.launch.local import run
from parlab.launch.reports import register_collector
from parlab.launch.result import Run
from parlab.launch.server import preload
from parlab.launch.spans import SPAN_CATEGORIES, recording, span, Span, SpanRecorder

__all__ = ["run", "Run", "RankError", "RankTimeoutError", "default_backend", "rank_device",
           "environment", "MAX_WORLD_SIZE", "DEFAULT_TIMEOUT", "register_collector", "preload",
           "SPAN_CATEGORIES", "Span", "SpanRecorder", "span", "recording"]
