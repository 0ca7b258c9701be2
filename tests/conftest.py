"""Shared fixtures, which chapters nbval runs, and the torch threads of a test process."""
import gc
import os

import pytest

from chromium import missing as browser_missing


def _cores() -> int:
    """The cores this process may run on (a container's CPU set, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def pytest_configure(config):
    """Share the cores among pytest-xdist's workers: ``cores // workers`` torch threads each.

    Every worker (and the kernels, JupyterLab and scripts it starts, through
    ``OMP_NUM_THREADS``) would otherwise use a thread per core, so two workers on two cores
    run four busy threads. The models here are small: an OpenMP region whose second thread
    is waiting for a core holds up the first, and a tiny matrix product that takes
    microseconds alone took 12 ms (chapter 07's load-balancing figure: 10 to 30 s against
    0.3 s). Ranks set their own threads (``run(..., threads=)``), so this changes no rank.
    """
    from parlab.launch import preload
    # the rank server of this process (started at its second launch) imports the chapters'
    # experiments once; else every rank of every launch that runs one imports them (1.2 s)
    preload("parlab.experiments")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        threads = max(1, _cores() // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        import torch
        torch.set_num_threads(threads)


def pytest_xdist_auto_num_workers(config):
    """What ``-n auto`` (the README's command) starts: one worker more than the cores.

    Much of a test's time is waiting, not computing: a fresh interpreter or kernel starting, a
    timeout that a test must see expire, a browser waiting for its kernel. With one worker a
    core, 2 workers on 2 cores left 74 of 677 core-seconds of the whole suite idle; a third
    worker runs its tests in those gaps.
    """
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist's own setting wins: it reads that variable
    return _cores() + 1


def pytest_collection_modifyitems(config, items):
    """Leave out nbval's run of a chapter that a browser test runs.

    tests/browser/test_jupyterlab*.py run every chapter in JupyterLab and compare what it
    saved with the committed outputs by nbval's rules (tests/nbval_outputs.py), so nbval's own
    run would execute the chapter a second time for the same check. Where the browser tests
    cannot run (no Chromium or Playwright: they skip) or were not selected (``pytest
    chapters/02_data_parallelism.ipynb``), nbval runs the chapter as usual.
    """
    browsed = {item.callspec.params["name"] for item in items
               if getattr(item, "originalname", "") == "test_chapter_runs_in_jupyterlab"}
    if not browsed or browser_missing():
        return
    covered = [item for item in items if item.path.suffix == ".ipynb" and item.path.name in browsed]
    if covered:
        config.hook.pytest_deselected(items=covered)
        dropped = set(map(id, covered))
        items[:] = [item for item in items if id(item) not in dropped]


def pytest_collection_finish(session):
    """Ship the test modules' functions to ranks by value, as a notebook's functions travel.

    cloudpickle sends a function of an importable module by name, so every rank of a launch
    would import the test module that defined it, and with it pytest (0.3 s a rank, 0.7 s a
    launch of 4 ranks on 2 cores: three quarters of a warm launch). By value, a rank imports
    only what the function uses, as it does for a reader's cell.
    """
    import sys

    import cloudpickle
    names = {item.module.__name__ for item in session.items
             if getattr(item, "module", None) is not None}
    for name in names:
        if name in sys.modules:
            cloudpickle.register_pickle_by_value(sys.modules[name])


@pytest.fixture
def pid_dir(tmp_path):
    """A folder where ranks record their process ids."""
    return str(tmp_path)


@pytest.fixture(scope="session")
def book_site(tmp_path_factory):
    """The HTML edition of the committed chapters, built once per test run: under
    pytest-xdist the workers share one build (the first to ask builds it, under a lock)."""
    import os
    from pathlib import Path

    from filelock import FileLock

    from parlab.tools import book

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # this run's folder, shared by its workers
    out = root / "book-site" / "html"
    with FileLock(str(root / "book-site.lock")):
        if not (out / "index.html").is_file():
            book.to_html(out, Path(__file__).resolve().parents[1] / "chapters")
    return out


def pytest_unconfigure(config):
    """Freeze the heap before this process (the main one, or a pytest-xdist worker) exits.

    A worker ends holding torch, ``torch._dynamo``, matplotlib and every test module's objects,
    and its interpreter's exit walks them all again (``gc`` passes while it clears the
    modules): measured with 6 test files on 3 workers, 2.4 s from the last worker's end to
    the main process's, and 0.9 s more for the main process itself. The notebook kernels do
    the same (:mod:`parlab.launch.kernel`)."""
    gc.freeze()
