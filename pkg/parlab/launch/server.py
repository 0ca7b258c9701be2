"""The warm forkserver that ranks are forked from, and the process class that starts them.

Why a process class of our own: multiprocessing tells each new child to run the caller's
main module again (``init_main_from_path``), so that functions defined there can be found
by name. A rank does not need that, because ``fn`` travels by value (cloudpickle), and it
breaks three common ways of calling :func:`parlab.launch.run`: a heredoc (``python - <<EOF``,
whose main "file" ``<stdin>`` cannot be read again), ``python -m`` of a module that calls
``run`` at import time, and a script without ``if __name__ == "__main__":`` (every rank
would run the script again and try to start ranks of its own). So ranks start with the
preparation data of multiprocessing minus the main module (loky/joblib do the same).

Who forks the ranks: the server is a new Python process that imports torch (and
``torch._dynamo``, parlab, ...) before it can fork anything, which takes longer than the
caller's own ``import torch``. In a notebook kernel it warms in the background as soon as
:mod:`parlab.launch` is imported, while the rest of that cell runs and the reader reads, and
forks every launch's ranks (and the spares of :mod:`parlab.launch.spares`). Elsewhere (a script,
``python -c``, a test process) nothing starts it while the caller can fork its ranks itself
(:func:`parlab.launch.forking.direct_fork_safe` says when that is as safe as the server:
Linux, no GPU, one thread per rank, autograd that survives a fork): no launch waits for a
server, and from the second launch on the caller first imports what the server would have
preloaded (:func:`import_for_ranks`), so its ranks inherit it. A launch that cannot fork
from the caller (NCCL, several threads per rank, a GPU) starts the server and uses it from
then on. ``rank_main`` resets what a rank could inherit from the caller (the random seed,
the default dtype, grad mode), so both ways start a rank alike.
"""

from __future__ import annotations

import atexit
import importlib
import multiprocessing as mp
import os
import signal
import sys
import threading
from multiprocessing import spawn

from parlab.launch.apart import start_server_apart
from parlab.launch.kernel import in_notebook_kernel
from parlab.launch.modules import imported_parlab, module_exists

try:
    from multiprocessing import popen_forkserver
except ImportError:  # no forkserver on this platform (Windows): parlab imports, run() cannot
    popen_forkserver = None

__all__ = ["preload", "context", "RankProcess", "ForkedRankProcess", "warm", "is_warm", "is_started",
           "warm_in_notebook", "import_while_waiting", "import_for_ranks"]

_forkserver_ready = False
_warm = threading.Event()  # set once the server has forked a process: it is fully preloaded
_warming: list[threading.Thread] = []
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
    launch on a small machine). A notebook's server starts while ``parlab.launch`` is
    imported (:func:`warm_in_notebook`); called before it is warm, this starts it again with
    the modules added (nothing was forked from it yet). Returns False when the server already
    forks ranks: the modules are then imported by each rank as usual, slower but correct.
    """
    for name in modules:  # a typo fails here, not inside every rank
        if not module_exists(name):
            raise ModuleNotFoundError(f"preload: no module named {name!r}", name=name)
    if all(m in _preload for m in modules):
        return True
    restart = _forkserver_ready and _warming and not _warm.is_set()
    if _forkserver_ready and not restart:
        return False
    if restart:  # a notebook's server, started at the import and still importing: again
        _discard_cold_server()
    _preload.extend(m for m in modules if m not in _preload)
    if restart:
        warm()
    return True


def context():
    """The forkserver context, preloading torch and parlab once per Python process."""
    global _forkserver_ready
    ctx = mp.get_context("forkserver")
    if not _forkserver_ready:
        ctx.set_forkserver_preload(list(_preload) + [m for m in imported_parlab()
                                                     if m not in _preload])
        _forkserver_ready = True
        _wrap_preparation_data()
        start_server_apart(_no_main)
    return ctx


#: What the caller itself imports: while its first launch waits for the server, or before it
#: forks ranks itself (see below); in a notebook kernel also what its first figure imports
#: (about 0.4 s: the chapters draw with matplotlib, most of them first after a launch).
_CALLER_IMPORTS = ("torch._dynamo",)
_KERNEL_IMPORTS = ("matplotlib.pyplot",)


def import_while_waiting() -> threading.Thread | None:
    """While a launch waits for a server still importing torch, import in this process, on a
    background thread, what the caller will soon import anyway; the launch joins the thread
    before it returns. None when there is nothing to wait for or nothing left to import.

    Why: a notebook's first launch waits seconds for the server while the kernel sits idle
    and a core is free, and most chapters then build an optimizer in the kernel itself (a
    reference run, a measurement), whose first construction imports ``torch._dynamo`` (about
    3 s on a small machine: ``add_param_group`` is wrapped by ``torch._disable_dynamo``).
    Imported here, that time overlaps the wait; in a kernel so does ``matplotlib.pyplot``
    (0.4 s), which the chapters' first figures import. The thread runs only while the
    caller's own thread is inside the launch, which forks nothing of the caller, so no import
    runs beside the reader's code and no fork copies a half-done import.
    """
    if is_warm() or not _caller_imports():
        return None
    thread = threading.Thread(target=_import_caller_modules, name="parlab-import-while-waiting",
                              daemon=True)
    thread.start()
    return thread


def import_for_ranks() -> None:
    """Before a launch that forks its ranks from this process, import here what the server
    preloads for its ranks (``torch._dynamo``), so the ranks inherit it; but not before this
    process's first launch, which stays as quick as the import of torch.

    Why: outside a notebook kernel every launch forks from the caller while it may (see the
    module), so nothing waits for a server to import torch (a script's second launch waited
    about 3 s) and no process spends that CPU. A rank that builds an optimizer needs
    ``torch._dynamo`` (seconds, in every rank); imported here once, the caller pays ~1 s.
    """
    global _launched_here
    if not _launched_here:
        _launched_here = True
        return
    _import_caller_modules()


_launched_here = False  # set by the first launch that forked from this process


def _caller_imports() -> list[str]:
    """What :func:`_import_caller_modules` would import: names not imported yet."""
    names = _CALLER_IMPORTS + (_KERNEL_IMPORTS if in_notebook_kernel() else ())
    return [name for name in names if name not in sys.modules]


def _import_caller_modules() -> None:
    for name in _caller_imports():
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - whoever needs it imports it then
            return


def _noop() -> None:
    """What the warming process runs: nothing (its start proves the server is ready)."""


def warm() -> None:
    """Start the forkserver in a background thread, if it is not started yet; return at once.

    The thread starts one process that does nothing: the server accepts it only after its
    preload, so when that process has started the server is warm (:func:`is_warm`).
    """
    if _warming or RankProcess is None:
        return
    context()  # the preload list and the preparation-data wrapper, set before any start

    def start_one():
        try:
            process = RankProcess(target=_noop, name="parlab-warm", daemon=True)
            process.start()
            process.join()
        except Exception:  # noqa: BLE001 - the server was stopped (at exit, or by preload
            return         # while its start was under way): stay cold
        _warm.set()

    thread = threading.Thread(target=start_one, name="parlab-forkserver-warm", daemon=True)
    _warming.append(thread)
    thread.start()
    atexit.unregister(_stop_cold_server)  # once, also when preload() started it again
    atexit.register(_stop_cold_server)


def _stop_cold_server() -> None:
    """At exit, kill a server still importing torch: it would finish its preload (seconds of
    CPU) before noticing that its caller is gone."""
    from multiprocessing import forkserver

    if not _warm.is_set():
        _kill_server(forkserver._forkserver)


def is_warm() -> bool:
    """True once the forkserver has preloaded torch and parlab and forks ranks in milliseconds."""
    return _warm.is_set()


def is_started() -> bool:
    """True once :func:`warm` has started the server (warm or still importing)."""
    return bool(_warming)


#: What a notebook's server imports besides :data:`_preload` and the caller's parlab modules.
#: The server starts while :mod:`parlab.launch` is imported, before the chapter imports its
#: experiments; their ranks then imported ``parlab.experiments`` (matplotlib and every
#: chapter's module with it) in every rank of every launch: 1.2 s a launch of 2 ranks on 2
#: cores, chapter 04's sixteen launches 1.0-1.9 s each instead of 0.2.
_NOTEBOOK_PRELOAD = ("parlab.experiments",)


def warm_in_notebook(launches_here: bool = True) -> bool:
    """In a notebook kernel, start warming the server now, while the cell that imported
    :mod:`parlab.launch` goes on.

    Only there: a reader imports parlab in the first cell and launches ranks soon after, so
    the server imports torch while the kernel runs the rest of that cell (a chapter's first
    cell imports more, builds a model, counts FLOPs: seconds that the server's own imports,
    on another core, now overlap) and while the reader reads. Not in a plain script, a
    maintainers' tool or a test process, where an import does not mean a launch will follow;
    not where ``launches_here`` is False (under torchrun, whose workers need no server, or
    inside a rank: :mod:`parlab.launch.local` says). Returns whether it started warming.
    """
    if not in_notebook_kernel() or RankProcess is None or not launches_here:
        return False
    preload(*_NOTEBOOK_PRELOAD)
    warm()
    return True


def _discard_cold_server() -> None:
    """Kill the server while it still imports (no rank was forked from it) and forget it, so
    that the next :func:`warm` starts one with the current preload list.

    Its warming thread may not have reached the server yet, and multiprocessing starts a
    server (with the old list) for whoever finds none: so kill until that thread has ended
    (its start fails once the server it waits for is gone), then once more.
    """
    global _forkserver_ready
    from multiprocessing import forkserver

    for _ in range(100):  # 10 s at most
        _kill_server(forkserver._forkserver)
        for thread in _warming:
            thread.join(0.1)
        if not any(thread.is_alive() for thread in _warming):
            break
    _kill_server(forkserver._forkserver)
    _warming.clear()
    _warm.clear()
    _forkserver_ready = False


def _kill_server(server) -> None:
    with server._lock:  # no start of a process in between
        if server._forkserver_pid:
            try:
                os.kill(server._forkserver_pid, signal.SIGKILL)
                server._stop_unlocked()  # closes its "alive" pipe, reaps it
            except OSError:
                server._forkserver_pid = server._forkserver_address = None


def reset_after_fork() -> None:
    """In a rank forked from the caller: forget the caller's server (it is not this process's)
    and its launches."""
    global _forkserver_ready, _launched_here
    from multiprocessing import forkserver

    _forkserver_ready = _launched_here = False
    _warming.clear()
    _warm.clear()
    forkserver._forkserver = forkserver.ForkServer()
    for name in ("ensure_running", "get_inherited_fds", "connect_to_new_process",
                 "set_forkserver_preload"):
        setattr(forkserver, name, getattr(forkserver._forkserver, name))


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

if hasattr(os, "fork"):
    class ForkedRankProcess(mp.get_context("fork").Process):
        """A rank forked straight from the caller, while the server warms (see the module)."""

        @staticmethod
        def _Popen(process_obj):
            import warnings

            from multiprocessing import popen_fork

            with warnings.catch_warnings():  # Python 3.12+ warns on fork in a threaded process
                warnings.simplefilter("ignore", DeprecationWarning)
                return popen_fork.Popen(process_obj)
else:
    ForkedRankProcess = None

