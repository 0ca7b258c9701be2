"""``python -m parlab.tools.figures`` regenerates every figure the chapters draw, as PNG.

A maintainers' tool: readers never import it. Each chapter's experiment module registers
the recipes of its figures under the book's numbering (``fig-8-07-pipeline-step-5``) with
:func:`parlab.viz.figure`; this command imports every plot and experiment module and draws
them.

    python -m parlab.tools.figures [--list] [--out FOLDER] [PATTERN ...]

The output folder defaults to ``./figures`` under the current directory.

The PNGs are the same bytes on every run on one machine (Agg, a fixed dpi, and no
``Software`` text chunk, so a new matplotlib version alone does not change a file);
``tests/test_figures_current.py`` compares the committed ones with a fresh rendering.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib
import pkgutil
import sys
from pathlib import Path
from typing import Callable

from parlab import experiments
from parlab.viz import plots, png, registered

__all__ = ["registry", "render", "main", "DPI", "METADATA"]

#: Dots per inch of every PNG.
DPI = 110
#: PNG text chunks: none, so the bytes carry no matplotlib version (and no date: PNGs have none).
METADATA = {"Software": None}


def registry() -> dict[str, tuple[str, Callable]]:
    """Every figure of every chapter: (title, make) by name, sorted."""
    for package in (plots, experiments):
        for info in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package.__name__}.{info.name}")
    return registered()

def render(names=None, directory: Path | None = None, progress: bool = True) -> list[Path]:
    """Draw the figures named (all by default) and save them as PNG; return the paths."""
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from tqdm.auto import tqdm

    directory = Path(directory or "figures")
    directory.mkdir(parents=True, exist_ok=True)
    figures = registry()
    names = list(figures) if names is None else list(names)
    unknown = [n for n in names if n not in figures]
    if unknown:
        raise ValueError(f"unknown figure(s) {unknown}; known: {list(figures)}")
    written = []
    for name in tqdm(names, desc="figures", unit="fig", disable=not progress):
        fig = figures[name][1]()
        path = directory / f"{name}.png"
        path.write_bytes(png(fig, dpi=DPI, metadata=METADATA))
        plt.close(fig)
        written.append(path)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m parlab.tools.figures", description=__doc__)
    parser.add_argument("patterns", nargs="*", help="only figures matching these globs")
    parser.add_argument("--out", type=Path, default=None, help="folder (default: ./figures)")
    parser.add_argument("--list", action="store_true", help="list the figures and exit")
    args = parser.parse_args(argv)
    figures = registry()
    names = [n for n in figures if not args.patterns
             or any(fnmatch.fnmatch(n, p) for p in args.patterns)]
    if args.list:
        for name in names:
            print(f"{name}  {figures[name][0]}")
        return 0
    if not names:
        print(f"no figure matches {args.patterns}", file=sys.stderr)
        return 2
    paths = render(names, args.out)
    print(f"wrote {len(paths)} figure(s) to {paths[0].parent}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
