"""Maintainers' tool for the chapters: build (execute) notebooks, check their pairs, make HTML.

    python -m parlab.tools.book build [chapters/03_*.py ...]   .py -> executed .ipynb -> .py again
    python -m parlab.tools.book check [--chapters DIR]         fail if a notebook and its .py differ
    python -m parlab.tools.book html [--chapters DIR] [--out build/html]   the book site (Sphinx)

A maintainers' tool: readers never import it. It works from any directory: the chapters
folder defaults to ``./chapters`` and the HTML edition to ``./build/html``.

Why: the reviewed source of a chapter is its jupytext ``.py``; readers and nbval use the
``.ipynb`` with stored outputs. ``build`` keeps the two in step and re-executes so stored
outputs always come from the current code.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

__all__ = ["chapters", "paired_text", "unpaired", "kernel_client", "build", "to_html", "main"]

PAIR_FORMAT = "py:percent"


#: Where the chapters are when no folder is given: ``chapters/`` under the current directory.
DEFAULT_CHAPTERS = Path("chapters")


def kernel_client(notebook, folder: Path, timeout: float = 600, **options):
    """An nbclient client that runs ``notebook`` in a fresh Python kernel started in ``folder``
    (as JupyterLab starts a notebook's kernel in the notebook's folder); ``options`` go to
    ``nbclient.NotebookClient``. The kernel logs errors only: ipykernel warns at every start
    that its local connection is not encrypted, a warning per chapter that buried what the
    maintainers' tools print themselves. A cell's own warnings are outputs, shown as ever."""
    from nbclient import NotebookClient

    return NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                          extra_arguments=["--IPKernelApp.log_level=ERROR"],
                          resources={"metadata": {"path": str(folder)}}, **options)


def chapters(folder: Path | None = None) -> list[Path]:
    """The chapter notebooks in ``folder`` (default ``./chapters``), in order."""
    folder = Path(folder or DEFAULT_CHAPTERS)
    if not folder.is_dir():
        raise FileNotFoundError(f"no chapters folder at {folder.resolve()}: run from the "
                                f"repository's root or pass the folder (--chapters DIR)")
    return sorted(folder.glob("[0-9][0-9]_*.ipynb"))


def paired_text(notebook: Path) -> str:
    """The jupytext percent text that the notebook's ``.py`` pair must hold.

    The pairing itself is declared once, in pyproject.toml (``[tool.jupytext]``), not in
    each notebook's metadata, so this text equals what ``jupytext --to py:percent -o -``
    prints for the notebook.
    """
    import jupytext
    nb = jupytext.read(notebook)
    _drop_pairing(nb)
    return jupytext.writes(nb, fmt=PAIR_FORMAT)


def _drop_pairing(nb) -> None:
    nb.metadata.get("jupytext", {}).pop("formats", None)


def unpaired(folder: Path | None = None) -> list[str]:
    """Notebooks whose ``.py`` pair is missing or differs, and ``.py`` files with no notebook."""
    problems = []
    folder = Path(folder or DEFAULT_CHAPTERS)
    for notebook in chapters(folder):
        pair = notebook.with_suffix(".py")
        if not pair.exists():
            problems.append(f"{notebook.name}: no {pair.name}")
        elif _comparable(pair.read_text()) != _comparable(paired_text(notebook)):
            problems.append(f"{notebook.name} and {pair.name} differ (run python -m parlab.tools.book build)")
    for pair in sorted(folder.glob("[0-9][0-9]_*.py")):
        if not pair.with_suffix(".ipynb").exists():
            problems.append(f"{pair.name}: no notebook (run python -m parlab.tools.book build {pair})")
    return problems


def _comparable(text: str) -> str:
    """The pair's text without the jupytext version line (it changes when jupytext updates)."""
    return re.sub(r"(?m)^#\s+jupytext_version: .*\n", "", text)


def _with_previous(notebook, previous: Path):
    """The freshly read chapter, with each cell's id and metadata from the previous build
    where jupytext matches the cell (``--update``'s own merge), so a rebuild's diff shows
    the cells that changed, not a new id on every cell. Jupytext lacks the rest of a build:
    execution without per-cell timestamps and with a cell timeout, and stable widget ids."""
    import nbformat
    from jupytext.combine import combine_inputs_with_outputs

    if not previous.exists():
        return notebook
    merged = combine_inputs_with_outputs(notebook, nbformat.read(previous, as_version=4),
                                         fmt=PAIR_FORMAT)
    merged.metadata.pop("widgets", None)  # the run writes the widgets' state afresh
    if len({cell.id for cell in merged.cells}) != len(merged.cells):
        raise RuntimeError(f"duplicate cell ids after reusing those of {previous.name}")
    return merged


def _stable_widget_ids(notebook, seed: str):
    """Replace the random widget model ids (fresh on every run) with ids numbered in a fixed
    order, so the stored widget state of an unchanged chapter is byte-for-byte the same.

    The order: the widgets the outputs show, cell by cell, each followed depth-first by the
    models it refers to (``IPY_MODEL_<id>``, keys sorted); then any model nothing refers to,
    sorted by its content.
    """
    import hashlib
    import json

    import nbformat

    state = notebook.metadata.get("widgets", {}).get(
        "application/vnd.jupyter.widget-state+json", {}).get("state", {})
    if not state:
        return notebook
    order: list[str] = []

    def visit(model_id):
        if model_id in state and model_id not in order:
            order.append(model_id)
            refs = re.findall(r"IPY_MODEL_([0-9a-f]{32})", json.dumps(state[model_id],
                                                                      sort_keys=True))
            for ref in refs:
                visit(ref)

    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            view = output.get("data", {}).get("application/vnd.jupyter.widget-view+json")
            if view:
                visit(view["model_id"])
    for model_id in sorted(set(state) - set(order),
                           key=lambda m: json.dumps(state[m], sort_keys=True)):
        order.append(model_id)
    text = nbformat.writes(notebook)
    for i, model_id in enumerate(order):
        text = text.replace(model_id, hashlib.md5(f"{seed}-{i}".encode()).hexdigest())
    return nbformat.reads(text, as_version=4)


def build(sources: list[Path], timeout: int = 900) -> None:
    """Execute each chapter from its ``.py`` and write the ``.ipynb`` with outputs, then re-pair."""
    import jupytext
    import nbformat

    for source in sources:
        source = Path(source).with_suffix(".py")
        notebook = jupytext.read(source)
        notebook.metadata.setdefault("kernelspec", {
            "display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"})
        target = source.with_suffix(".ipynb")
        notebook = _with_previous(notebook, target)
        started = time.monotonic()
        # no per-cell timestamps, and a cell's prints merged into one output however the
        # kernel flushed them: a rebuild then changes only what the code changed
        kernel_client(notebook, source.parent, timeout, record_timing=False,
                      coalesce_streams=True).execute()
        _drop_pairing(notebook)
        notebook = _stable_widget_ids(notebook, target.stem)
        nbformat.write(notebook, target)
        source.write_text(paired_text(target))
        print(f"built {target.name} in {time.monotonic() - started:.1f} s")


def to_html(out: Path, folder: Path | None = None) -> Path:
    """Build the HTML edition, a book site of the executed chapters (see :mod:`parlab.tools.site`);
    return its index page."""
    from parlab.tools.site import build_site

    return build_site(Path(out), chapters(folder))


def main(argv=None) -> int:
    try:
        return _main(argv)
    except FileNotFoundError as exc:
        print(f"python -m parlab.tools.book: {exc}", file=sys.stderr)
        return 2
    except (ValueError, RuntimeError) as exc:  # prose that drifted, or Sphinx's warnings
        print(f"python -m parlab.tools.book: {exc}", file=sys.stderr)
        return 1
    except ImportError as exc:
        print(f"python -m parlab.tools.book needs the maintainers' tools ({exc.name} is missing): "
              f"pip install 'parlab[tools]', or the repository's requirements.txt",
              file=sys.stderr)
        return 2


def _main(argv) -> int:
    parser = argparse.ArgumentParser(prog="python -m parlab.tools.book", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="execute chapters from their .py and re-pair them")
    b.add_argument("sources", nargs="*", type=Path)
    b.add_argument("--chapters", type=Path, default=DEFAULT_CHAPTERS,
                   help="the chapters folder when no source is named (default: ./chapters)")
    c = sub.add_parser("check", help="fail when a notebook and its .py pair differ")
    c.add_argument("--chapters", type=Path, default=DEFAULT_CHAPTERS)
    h = sub.add_parser("html", help="build the HTML edition")
    h.add_argument("--chapters", type=Path, default=DEFAULT_CHAPTERS)
    h.add_argument("--out", type=Path, default=Path("build") / "html")
    args = parser.parse_args(argv)
    if args.command == "build":
        chapters(args.chapters)  # a clear error when the folder is missing
        build(args.sources or sorted(args.chapters.glob("[0-9][0-9]_*.py")))
    elif args.command == "check":
        problems = unpaired(args.chapters)
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    else:
        print(f"wrote {to_html(args.out, args.chapters)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
