"""The warm forkserver that ranks are forked from, and the process class that starts them.

Why a process class of our own: multiprocessing tells each new child to run the caller's
main module again (``init_main_from_path``), so that functions defined there can be found
by name. A rank does not need that, because ``fn`` travels by value (cloudpickle), and it
breaks three common ways of calling :func:`parlab.launch.run`: a heredoc (``python - <<EOF``,
whose main "file" ``<stdin>`` cannot be read again), ``python -m`` of a module that calls
``run`` at import time, and a script without ``if __name__ == "__main__":`` (every rank
would run the script again and try to start ranks of its own). So ranks start with the
preparation data of multiprocessing minus the main module (loky/joblib do the same).
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import sys
import threading
from multiprocessing import spawn

try:
    from multiprocessing import popen_forkserver
except ImportError:  # no forkserver on this platform (Windows): parlab imports, run() cannot
    popen_forkserver = None

__all__ = ["preload", "context", "RankProcess"]

_forkserver_ready = False
#: What the server imports once, so that no rank imports it again. ``torch._dynamo`` (with
#: ``torch.fx.experimental.symbolic_shapes`` and sympy under it) costs seconds, and ranks hit
#: it lazily: creating any ``torch.optim`` optimizer (``add_param_group`` is wrapped by
#: ``torch._disable_dynamo``), building ``DistributedDataParallel``, and the first
#: ``tensor.backward(gradient)`` (how a pipeline stage starts its backward pass). Preloaded,
#: the server starts that much slower, once per Python process, instead of every launch.
#: ``torch.profiler._cupti_monitor`` is what an optimizer's first ``zero_grad``/``step``
#: imports (their ``record_function`` labels); the server skips a name it cannot import.
_preload = ["parlab", "parlab.launch", "torch.optim", "torch._dynamo",
            "torch.profiler._cupti_monitor"]
_no_main = threading.local()  # set while this thread starts a rank
_MAIN_KEYS = ("init_main_from_path", "init_main_from_name")


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


def _imported_parlab() -> list[str]:
    """The parlab modules this process has imported (the maintainers' tools aside).

    A rank runs functions of the caller's modules (a chapter's experiments, a strategy's
    layers); importing them in every rank of every launch costs seconds (the experiments pull
    in matplotlib and ipywidgets), so the server imports what the caller already uses, once.
    """
    return sorted(m for m in sys.modules
                  if m.startswith("parlab.") and not m.startswith("parlab.tools"))


def context():
    """The forkserver context, preloading torch and parlab once per Python process."""
    global _forkserver_ready
    ctx = mp.get_context("forkserver")
    if not _forkserver_ready:
        ctx.set_forkserver_preload(list(_preload) + [m for m in _imported_parlab()
                                                     if m not in _preload])
        _forkserver_ready = True
        _wrap_preparation_data()
    return ctx


def _wrap_preparation_data() -> None:
    """Let :class:`RankProcess` leave the main module out of what a child prepares.

    The wrapper changes nothing for any other caller: it drops the main module only while
    the current thread is starting a rank (a thread-local flag), so multiprocessing used
    elsewhere in the same process behaves as before.
    """
    original = spawn.get_preparation_data
    if getattr(original, "_parlab", False):
        return

    def get_preparation_data(name):
        data = original(name)
        if getattr(_no_main, "active", False):
            for key in _MAIN_KEYS:
                data.pop(key, None)
        return data

    get_preparation_data._parlab = True
    spawn.get_preparation_data = get_preparation_data


if popen_forkserver is not None:
    class _Popen(popen_forkserver.Popen):
        def _launch(self, process_obj):
            _no_main.active = True
            try:
                super()._launch(process_obj)
            finally:
                _no_main.active = False

    class RankProcess(mp.get_context("forkserver").Process):
        """A forkserver process whose child does not import the caller's ``__main__`` again.

        (A class at module level: the process object itself is pickled to the child.)
        """

        @staticmethod
        def _Popen(process_obj):
            return _Popen(process_obj)
else:
    RankProcess = None
