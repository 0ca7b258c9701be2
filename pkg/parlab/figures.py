"""``python -m parlab.figures`` regenerates every figure the chapters draw, as PNG in figures/.

Why a registry: each chapter's drawing code lives beside its plots (``parlab.plots.*``) and
registers its figures under the book's numbering (``fig-8-07-pipeline-step-5``), so this
command, the HTML edition and the tests all see the same list without a hand-kept index.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib
import pkgutil
import sys
from pathlib import Path
from typing import Callable

__all__ = ["figure", "register", "registry", "render", "main", "default_directory"]

_REGISTRY: dict[str, tuple[str, Callable]] = {}


def register(name: str, make: Callable, title: str = "") -> None:
    """Register ``make() -> matplotlib.figure.Figure`` under the file name ``name`` (no suffix)."""
    if name in _REGISTRY:
        raise ValueError(f"figure {name!r} is registered twice")
    _REGISTRY[name] = (title, make)


def figure(name: str, title: str = ""):
    """Decorator form of :func:`register`."""
    def wrap(make):
        register(name, make, title)
        return make
    return wrap


def registry() -> dict[str, tuple[str, Callable]]:
    """All registered figures (importing every ``parlab.plots`` module), sorted by name."""
    from . import plots
    for info in pkgutil.iter_modules(plots.__path__):
        importlib.import_module(f"{plots.__name__}.{info.name}")
    return dict(sorted(_REGISTRY.items()))


def default_directory() -> Path:
    """The repository's figures/ folder when run from a checkout, else ./figures."""
    repo = Path(__file__).resolve().parents[2]
    return repo / "figures" if (repo / "pyproject.toml").exists() else Path("figures")


def render(names=None, directory: Path | None = None, progress: bool = True) -> list[Path]:
    """Draw the figures named (all by default) and save them as PNG; return the paths."""
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from tqdm.auto import tqdm

    directory = Path(directory or default_directory())
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
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m parlab.figures", description=__doc__)
    parser.add_argument("patterns", nargs="*", help="only figures matching these globs")
    parser.add_argument("--out", type=Path, default=None, help="folder (default: figures/)")
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
    # run the imported module's main: the plots register into parlab.figures, not __main__
    from parlab.figures import main as _main
    raise SystemExit(_main())
