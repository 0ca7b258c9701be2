"""The HTML edition: the chapters as a book site, built offline from their stored outputs.

    python -m parlab.tools.book html [--chapters DIR] [--out build/html]

The stack is the one under Jupyter Book 1: Sphinx, MyST-NB (notebooks as Sphinx documents)
and sphinx-book-theme (navigation, full-text search, previous/next links). Nothing is
executed (``nb_execution_mode = "off"``): the pages show the outputs stored in the notebooks,
the same ones nbval re-checks, and no step needs the network.

Sphinx reads a prepared copy of each chapter (:func:`prepare`), in which

- **numbers in prose come from the code**: every ``<span data-glue="name">text</span>`` must
  equal the value a code cell recorded with :func:`parlab.viz.glue` (:func:`glue_problems`;
  the build stops on a difference), and becomes MyST-NB's ``{glue:text}`` role, so the page
  prints the recorded value itself;
- **a widget's default is in place**: the live control needs a kernel, so its output becomes
  a one-line note; the figure it draws at its default setting is already the output just
  above it (:mod:`parlab.viz.explorer` shows it as an ordinary image);
- **figures get captions**: an image shown by :func:`parlab.viz.show` with a caption becomes a
  numbered figure with that caption;
- **chapters link to each other**: "chapter 02" in prose becomes a link to chapter 02.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

__all__ = ["prepare", "build_site", "glue_values", "glue_problems", "GLUE_SPAN"]

#: A number in prose that a code cell computed: ``<span data-glue="name">text</span>``.
GLUE_SPAN = re.compile(r'<span data-glue="([\w-]+)">(.*?)</span>')
_WIDGET = "application/vnd.jupyter.widget-view+json"
_CHAPTER_REF = re.compile(r"\b([Cc]hapters? )(\d\d)\b")
_CODE_OR_LINK = re.compile(r"(`[^`]*`|\[[^\]]*\]\([^)]*\)|<[^>]+>)")

CONF = '''# Written by parlab.tools.site for one build; see that module.
project = "parlab"
author = "the parlab authors"
copyright = "the parlab authors"
extensions = ["myst_nb"]
nb_execution_mode = "off"
nb_output_stderr = "show"
html_theme = "sphinx_book_theme"
html_title = "parlab: Parallelism Strategies in Deep Learning"
html_theme_options = {"use_download_button": True, "show_toc_level": 2}
numfig = True
numfig_format = {"figure": "Figure %s"}
exclude_patterns = ["_build"]
'''

INDEX = '''# parlab: Parallelism Strategies in Deep Learning, executed

The runnable companion to the book chapter, as stored after its last run: every figure
here was drawn by real `torch.distributed` ranks exchanging real tensors. The pages are
static; to move the sliders and re-run the ranks, open the notebooks in JupyterLab (see
the repository's README). Search is at the top of the sidebar.

```{{toctree}}
:maxdepth: 1
:caption: Chapters

{chapters}
```
'''


def glue_values(notebook) -> dict[str, str]:
    """``{name: text}`` of every value the notebook's code cells recorded with ``glue``."""
    values = {}
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            record = output.get("metadata", {}).get("scrapbook")
            if record:
                raw = output["data"][record.get("mime_prefix", "") + "text/plain"]
                try:
                    values[record["name"]] = str(ast.literal_eval(raw))
                except (SyntaxError, ValueError):
                    values[record["name"]] = raw
    return values


def glue_problems(notebook, label: str = "") -> list[str]:
    """Every ``data-glue`` span whose text differs from its record, or that has none."""
    values, problems = glue_values(notebook), []
    for cell in notebook.cells:
        if cell.cell_type != "markdown":
            continue
        for name, text in GLUE_SPAN.findall(cell.source):
            if name not in values:
                problems.append(f"{label}: the prose uses {name!r}, which no code cell glues "
                                f"(glued: {sorted(values) or 'none'})")
            elif values[name] != text:
                problems.append(f"{label}: the prose says {text!r} for {name!r}, the code "
                                f"computed {values[name]!r}")
    return problems


def _link_chapters(text: str, files: dict[str, str], own: str) -> str:
    """Turn "chapter 02" into a link to chapter 02's notebook, outside code and links."""
    def link(match):
        number = match.group(2)
        if number not in files or number == own:
            return match.group(0)
        return f"[{match.group(0)}]({files[number]})"

    parts = _CODE_OR_LINK.split(text)
    return "".join(part if i % 2 else _CHAPTER_REF.sub(link, part) for i, part in enumerate(parts))


def _prepare_notebook(notebook, files: dict[str, str], own: str):
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            source = GLUE_SPAN.sub(lambda m: "{glue:text}`%s`" % m.group(1), cell.source)
            cell.source = "\n".join(line if line.startswith("#") else
                                    _link_chapters(line, files, own)
                                    for line in source.split("\n"))
            continue
        shown = [o for o in cell.get("outputs", [])
                 if "scrapbook" not in o.get("metadata", {})]  # glue records are hidden
        for output in shown:
            data = output.get("data", {})
            if _WIDGET in data:
                what = data.get("text/plain", "").removeprefix("[interactive] ")
                output["data"] = {"text/markdown": f"*Interactive in JupyterLab:* {what}. "
                                                  "The figure above is its default setting."}
        # MyST-NB wraps every output of the cell in the figure: only a lone image gets one
        if len(shown) == 1 and "image/png" in shown[0].get("data", {}):
            caption = shown[0].get("metadata", {}).get("parlab", {}).get("caption")
            if caption:
                cell.metadata.setdefault("mystnb", {})["figure"] = {"caption": caption}
    notebook.metadata.pop("widgets", None)
    return notebook


def prepare(notebooks: list[Path], source: Path) -> list[Path]:
    """Write Sphinx's source folder: ``conf.py``, ``index.md`` and a prepared copy of each
    chapter notebook. Raises ValueError listing every prose number that differs from the
    code's."""
    import nbformat

    files = {nb.name[:2]: nb.name for nb in notebooks}
    if source.exists():
        shutil.rmtree(source)
    source.mkdir(parents=True)
    problems, written = [], []
    for path in notebooks:
        notebook = nbformat.read(path, as_version=4)
        problems += glue_problems(notebook, path.name)
        target = source / path.name
        nbformat.write(_prepare_notebook(notebook, files, path.name[:2]), target)
        written.append(target)
    if problems:
        raise ValueError("numbers in the prose differ from the code's:\n  " + "\n  ".join(problems))
    (source / "conf.py").write_text(CONF)
    (source / "index.md").write_text(INDEX.format(chapters="\n".join(p.stem for p in written)))
    return written


def build_site(out: Path, notebooks: list[Path]) -> Path:
    """Build the site of ``notebooks`` into ``out`` (``index.html`` and one page per
    chapter); return the index. Any Sphinx warning (a broken reference, say) fails it."""
    import io
    import tempfile

    from sphinx.application import Sphinx

    out = Path(out)
    with tempfile.TemporaryDirectory(prefix="parlab-site-") as tmp:
        work = Path(tmp)  # Sphinx's sources, doctrees and MyST-NB's files stay in here
        prepare(notebooks, work / "src")
        warnings = io.StringIO()
        app = Sphinx(str(work / "src"), str(work / "src"), str(work / "html"),
                     str(work / "doctrees"), "html", status=None, warning=warnings,
                     freshenv=True)
        app.build()
        if app.statuscode or warnings.getvalue().strip():
            raise RuntimeError(f"Sphinx reported problems:\n{warnings.getvalue()}")
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(work / "html", out)
    return out / "index.html"
