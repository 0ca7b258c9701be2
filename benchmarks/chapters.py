"""How long each chapter's Run All takes, beside an empty notebook's.

    python benchmarks/chapters.py                    # every chapter, 3 rounds
    python benchmarks/chapters.py 02 05 --rounds 5   # some chapters
    python benchmarks/chapters.py 02 --cells 8       # and each chapter's 8 slowest cells
    python benchmarks/chapters.py --quick            # the empty notebook only: a smoke run

The empty notebook imports parlab and runs one launch (4 ranks, one all-reduce): what any
chapter pays before it teaches anything (a kernel start, torch's import, the first launch).
Each round executes the empty notebook and then every chapter, each in a fresh kernel (as
JupyterLab's "Restart Kernel and Run All" does, with nbclient), so a busy moment of the
machine slows a round's empty notebook and its chapters alike. The table shows per chapter
the median of its rounds, the empty notebook's median, the difference ("own s": the seconds of
the chapter's own work, beyond what any notebook pays) and their ratio; the project's budget
is a ratio of at most 1.5. A measurement, never a test assertion. ``--cells N`` lists, under
the table, each chapter's N slowest cells (the median of their rounds, with the cell's first
line of code): where a chapter's own seconds go, for whoever must make it fit.

parlab's bytecode is compiled first, as a reader's machine has it after its first import:
where ``PYTHONDONTWRITEBYTECODE`` is set (some containers and CI images), every kernel and
rank server would otherwise compile parlab's modules again (about 0.5 s a process).
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import nbformat

from parlab.tools.book import kernel_client

CHAPTERS = Path(__file__).resolve().parents[1] / "chapters"
EMPTY = ["import torch, torch.distributed as dist\nimport parlab\nfrom parlab.launch import run",
         "def one_all_reduce():\n    t = torch.ones(4)\n    dist.all_reduce(t)\n"
         "    return t.sum().item()\n\n\nrun(one_all_reduce, 4)"]


def empty_notebook():
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in EMPTY]
    return notebook


def execute(notebook, cwd: Path) -> tuple[float, dict[int, float]]:
    """Seconds to start a kernel and run every cell of ``notebook`` in it, and the seconds of
    each code cell (by its index in the notebook)."""
    started: dict[int, float] = {}
    cells: dict[int, float] = {}

    def cell_started(cell, cell_index):
        started[cell_index] = time.perf_counter()

    def cell_done(cell, cell_index, execute_reply):
        cells[cell_index] = time.perf_counter() - started[cell_index]

    start = time.perf_counter()
    kernel_client(notebook, cwd, on_cell_start=cell_started, on_cell_executed=cell_done).execute()
    return time.perf_counter() - start, cells


def compile_parlab() -> None:
    """Write parlab's bytecode (where its folder is writable), without importing it."""
    for folder in importlib.util.find_spec("parlab").submodule_search_locations:
        compileall.compile_dir(folder, quiet=2)


def measure(chapters: list[Path], rounds: int
            ) -> tuple[dict[str, list[float]], dict[str, dict[int, list[float]]]]:
    """Run All seconds per notebook, one per round, and per chapter each cell's seconds."""
    compile_parlab()
    times: dict[str, list[float]] = {"(empty)": []}
    cells: dict[str, dict[int, list[float]]] = {}
    for _ in range(rounds):
        times["(empty)"].append(execute(empty_notebook(), CHAPTERS)[0])
        for path in chapters:
            total, per_cell = execute(nbformat.read(path, as_version=4), CHAPTERS)
            times.setdefault(path.stem, []).append(total)
            for index, seconds in per_cell.items():
                cells.setdefault(path.stem, {}).setdefault(index, []).append(seconds)
    return times, cells


def slowest_cells(cells: dict[str, dict[int, list[float]]], count: int) -> str:
    """Each chapter's ``count`` slowest cells: median seconds, index, first line of code."""
    lines = []
    for stem, per_cell in cells.items():
        notebook = nbformat.read(CHAPTERS / f"{stem}.ipynb", as_version=4)
        medians = sorted(((statistics.median(s), i) for i, s in per_cell.items()), reverse=True)
        lines.append(f"{stem}: its {count} slowest cells (s)")
        for seconds, index in medians[:count]:
            code = [line for line in notebook.cells[index].source.splitlines()
                    if line.strip() and not line.lstrip().startswith("#")]
            lines.append(f"  {seconds:5.2f}  cell {index:<3} {(code or [''])[0][:60]}")
    return "\n".join(lines)


def table(times: dict[str, list[float]]) -> str:
    empty = statistics.median(times["(empty)"])
    head = f"{'notebook':<34} {'Run All s':>10} {'empty s':>8} {'own s':>6} {'ratio':>6}"
    lines = [head, "-" * len(head)]
    for name, samples in times.items():
        median = statistics.median(samples)
        lines.append(f"{name:<34} {median:>10.1f} {empty:>8.1f} {median - empty:>6.1f} "
                     f"{median / empty:>6.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("chapters", nargs="*", help="chapter numbers (default: all)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cells", type=int, default=0, metavar="N",
                        help="also list each chapter's N slowest cells")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: the empty notebook once, no chapter "
                             "(tests/test_benchmarks.py); its numbers mean nothing")
    args = parser.parse_args(argv)
    every = sorted(CHAPTERS.glob("[0-9][0-9]_*.ipynb"))
    chosen = [p for p in every if not args.chapters or p.name[:2] in args.chapters]
    unknown = sorted(set(args.chapters) - {p.name[:2] for p in every})
    if unknown:
        parser.error(f"no chapter {', '.join(unknown)}; the chapters are "
                     f"{', '.join(p.name[:2] for p in every)}")
    if args.rounds < 1 or args.cells < 0:
        parser.error(f"--rounds must be at least 1 and --cells at least 0, got "
                     f"{args.rounds} and {args.cells}")
    if args.quick:
        chosen, args.rounds = [], 1
    times, cells = measure(chosen, args.rounds)
    print(table(times))
    if args.cells > 0:
        print("\n" + slowest_cells(cells, args.cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
