"""Every script in benchmarks/ still runs: each once, in its ``--quick`` mode, as a subprocess.

The benchmarks are measurements, never assertions, so nothing here checks a time. What it
catches is a script that no longer starts (an import that moved, a renamed function): the
scripts are found by glob, so a new one is covered as soon as it exists, and it must offer
``--quick`` (2 ranks, the smallest size, one repeat) and say in ``OUTPUT`` which line of its
output shows that it measured something.
"""
import subprocess
import sys
from pathlib import Path

import pytest

from procs import env_with_parlab

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((REPO / "benchmarks").glob("*.py"))

#: What each script prints once it has measured: a table's header, or its one result line.
OUTPUT = {
    "chapters.py": "notebook                            Run All s  empty s  own s  ratio",
    "collectives.py": "ranks    MiB   gloo ms    toy ms  toy/gloo   p2p/gloo  toy busbw GB/s",
    "launch.py": "2-rank launch (gloo, one all_reduce): first ",
}


def test_the_benchmarks_are_found():
    assert SCRIPTS, f"no benchmarks/*.py under {REPO}"


@pytest.fixture(scope="module")
def quick_runs():
    """{script name: finished process} of every script's --quick run, all started at once
    (each mostly waits for its subprocesses and kernels: together they take the time of one)."""
    env = env_with_parlab()  # the same parlab as the tests', before PYTHONPATH's entries
    started = {s.name: subprocess.Popen([sys.executable, str(s), "--quick"], cwd=REPO, env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True)
               for s in SCRIPTS if '"--quick"' in s.read_text()}
    finished = {}
    try:
        for name, proc in started.items():
            stdout, stderr = proc.communicate(timeout=170)
            finished[name] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout,
                                                         stderr)
    finally:
        for proc in started.values():
            proc.kill()
    return finished


@pytest.mark.timeout(180)
@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_benchmark_runs_quickly(script, quick_runs):
    if '"--quick"' not in script.read_text():
        pytest.fail(f"benchmarks/{script.name} has no --quick mode: add one (2 ranks, the "
                    f"smallest size, one repeat) so that this test runs it in seconds")
    if script.name not in OUTPUT:
        pytest.fail(f"benchmarks/{script.name}: add the line its --quick run prints (a table's "
                    f"header) to OUTPUT in {Path(__file__).name}")
    out = quick_runs[script.name]
    assert out.returncode == 0, (f"benchmarks/{script.name} --quick exited with "
                                 f"{out.returncode}:\n{out.stdout}\n{out.stderr}")
    assert OUTPUT[script.name] in out.stdout, (
        f"benchmarks/{script.name} --quick did not print {OUTPUT[script.name]!r}; "
        f"it printed:\n{out.stdout}")


def test_the_chapter_benchmark_prints_no_kernel_log(quick_runs):
    """Its kernels log errors only: ipykernel's warning at every start (an unencrypted local
    connection) came once per notebook, 31 lines above the table of a full run."""
    out = quick_runs["chapters.py"]
    assert "WARNING" not in out.stderr, out.stderr


def test_slowest_cells_names_each_cell_by_its_first_line_of_code(tmp_path, monkeypatch):
    import importlib.util

    import nbformat

    spec = importlib.util.spec_from_file_location("chapters_benchmark",
                                                  REPO / "benchmarks" / "chapters.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell("# 99 · A chapter"),
                      nbformat.v4.new_code_cell("# a comment first\n  # then one indented\nresult = slow()"),
                      nbformat.v4.new_code_cell("print('quick')")]
    nbformat.write(notebook, tmp_path / "99_chapter.ipynb")
    monkeypatch.setattr(bench, "CHAPTERS", tmp_path)
    text = bench.slowest_cells({"99_chapter": {2: [0.5, 0.1, 0.2], 1: [3.0, 1.0, 2.0]}}, 1)
    assert text.splitlines() == ["99_chapter: its 1 slowest cells (s)",
                                 "   2.00  cell 1   result = slow()"]
