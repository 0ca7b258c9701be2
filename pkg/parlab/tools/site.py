"""The HTML edition: the chapters as a book site, built offline from their stored outputs.

    python -m parlab.tools.book html [--chapters DIR] [--out build/html]

The stack is the one under Jupyter Book 1: Sphinx, MyST-NB (notebooks as Sphinx documents)
and sphinx-book-theme (navigation, full-text search, previous/next links). Nothing is
executed (``nb_execution_mode = "off"``): the pages show the outputs stored in the notebooks,
the same ones nbval re-checks, and no step needs the network.

Sphinx reads a prepared copy of each chapter (:func:`prepare`), in which

- **numbers in prose come from the code**: every ``<span data-glue="name">text</span>`` must
  equal the value a hidden glue cell recorded with :func:`parlab.viz.glue`
  (:func:`glue_problems`; the build stops on a difference), and becomes MyST-NB's
  ``{glue:text}`` role, so the page prints the recorded value itself. The glue cells are
  tagged ``remove-cell``: MyST-NB reads their records and leaves them off the page;
- **a widget's default is in place**: the live control needs a kernel, so an explorer's
  output becomes a one-line note; the figure it draws at its default setting is already
  the output just above it (:mod:`parlab.viz.explorer` shows it as an ordinary image). A
  finished progress bar shows its text (:mod:`parlab.progress` stores the final state);
- **a figure appears once, with the book's numbering only**: an image shown by
  :func:`parlab.viz.show` becomes a figure whose alternative text is its title. The title
  is drawn in the image, so a caption repeating it is left out; a caption passed to
  ``show`` that differs from the title is printed under the figure. Sphinx's own counter
  ("Figure 1") is off: where a figure is one of the book's, its title says "Figure 8-xx".
  An image identical to one shown earlier in the chapter (an explorer opened on the run
  drawn above it) is shown once;
- **wide outputs scroll**: ``parlab.css`` widens the content column and gives every output
  a horizontal scrollbar where it is wider than the column;
- **an API reference** (``api.md``) documents each public face (:data:`API_FACES`) from its
  ``__all__`` and docstrings with Sphinx autodoc, and a chapter's first mention of a
  public name in backticks (`` `run` ``, `` `dp.step` ``, `` `estimate(...)` ``) links to
  its entry; a name two faces export is linked only where the prose qualifies it;
- **chapters link to each other**: "chapter 02" in prose becomes a link to chapter 02.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

__all__ = ["prepare", "build_site", "glue_values", "glue_problems", "api_index", "GLUE_SPAN",
           "API_FACES", "HIDDEN_TAG"]

#: A number in prose that a code cell computed: ``<span data-glue="name">text</span>``.
GLUE_SPAN = re.compile(r'<span data-glue="([\w-]+)">(.*?)</span>')
#: The tag of the cells a reader does not see (the glue cells): the site removes them.
HIDDEN_TAG = "remove-cell"
#: The public faces on the API page: what a reader's cell imports. Left out: ``checks`` and
#: ``progress`` (helpers the package calls for itself) and ``tools`` (maintainers' commands).
API_FACES = ("launch", "comm", "models", "memory", "data_parallel", "sharded", "pipeline",
             "tensor_parallel", "tensor_parallel.debug", "expert_parallel", "context_parallel",
             "hybrid", "viz", "viz.plots", "viz.widgets", "experiments", "exercises", "units",
             "hardware")
#: Names a face exports for the chapters' machinery, not for readers: left off the API page.
API_EXCLUDE = {"viz": ("glue",)}
_WIDGET = "application/vnd.jupyter.widget-view+json"
_CHAPTER_REF = re.compile(r"\b([Cc]hapters? )(\d\d)\b")
_CODE_OR_LINK = re.compile(r"(`[^`]*`|\[[^\]]*\]\([^)]*\)|<[^>]+>)")
#: a name in backticks, outside a role (``{glue:text}`x` ``) and link text: `run(fn, 4)`, `dp.step`
_API_MENTION = re.compile(r"(?<![}`\[])`((?:[A-Za-z_][\w.]*\.)?([A-Za-z_]\w*))(\([^`]*\))?`(?!`)")
_ALIAS = re.compile(r"^from parlab import (\w+) as (\w+)|^import parlab\.([\w.]+) as (\w+)", re.M)

CONF = '''# Written by parlab.tools.site for one build; see that module.
project = "parlab"
author = "the parlab authors"
copyright = "the parlab authors"
extensions = ["myst_nb", "sphinx.ext.autodoc"]
nb_execution_mode = "off"
nb_output_stderr = "show"
html_theme = "sphinx_book_theme"
html_title = "parlab: Parallelism Strategies in Deep Learning"
html_theme_options = {"use_download_button": True, "show_toc_level": 2}
html_static_path = ["_static"]
html_css_files = ["parlab.css"]
numfig = False  # the book's own numbering ("Figure 8-2") is in each figure's title
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
exclude_patterns = ["_build"]
'''

#: Wide outputs scroll (or fit), never cut: a wider column, and a horizontal scrollbar on
#: every output that is wider than it.
CSS = """/* Written by parlab.tools.site. */
.bd-page-width { max-width: 100rem; }
.bd-main .bd-content .bd-article-container { max-width: 100%; }
@media (min-width: 960px) {
  .bd-sidebar-primary { flex: 0 0 15rem; max-width: 15rem; }
  .bd-sidebar-secondary { flex: 0 0 13rem; max-width: 13rem; }
}
div.cell_output { max-width: 100%; }
div.cell_output .output, div.cell_output pre, div.cell_output .text_html,
div.cell_output .pst-scrollable-table-container { max-width: 100%; overflow-x: auto; }
div.cell_output pre { white-space: pre; }
div.cell_output img, figure img { max-width: 100%; height: auto; }
"""

INDEX = '''# parlab: Parallelism Strategies in Deep Learning, executed

The runnable companion to the book chapter, as stored after its last run: every figure
here was drawn by real `torch.distributed` ranks exchanging real tensors. The pages are
static; to move the sliders and re-run the ranks, open the notebooks in JupyterLab (see
the repository's README). Search is at the top of the sidebar; the functions and classes
the chapters call are in the [API reference](api.md).

```{{toctree}}
:maxdepth: 1
:caption: Chapters

{chapters}
```

```{{toctree}}
:maxdepth: 1
:caption: Reference

api
```
'''

API = '''# API reference

The public faces of the `parlab` package, each with what its `__all__` exports, from the
docstrings. A chapter's cells import from these; the chapters link a name's first mention
here.
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


def api_index(faces=API_FACES) -> dict[str, list[str]]:
    """``{name: [face, ...]}`` of every name the faces export (``__all__``)."""
    import importlib

    index: dict[str, list[str]] = {}
    for face in faces:
        for name in importlib.import_module(f"parlab.{face}").__all__:
            if name not in API_EXCLUDE.get(face, ()):
                index.setdefault(name, []).append(face)
    return index


def _api_page(faces=API_FACES) -> str:
    blocks = [API]
    for face in faces:
        exclude = ", ".join(API_EXCLUDE.get(face, ()))
        blocks.append(f"## `parlab.{face}`\n\n```{{eval-rst}}\n.. automodule:: parlab.{face}\n"
                      f"   :members:\n" + (f"   :exclude-members: {exclude}\n" if exclude else "")
                      + "```\n")
    return "\n".join(blocks)


def _link_chapters(text: str, files: dict[str, str], own: str) -> str:
    """Turn "chapter 02" into a link to chapter 02's notebook, outside code and links."""
    def link(match):
        number = match.group(2)
        if number not in files or number == own:
            return match.group(0)
        return f"[{match.group(0)}]({files[number]})"

    parts = _CODE_OR_LINK.split(text)
    return "".join(part if i % 2 else _CHAPTER_REF.sub(link, part) for i, part in enumerate(parts))


def _api_target(mention: str, name: str, index, aliases: dict[str, str]) -> str | None:
    """``parlab.face.name`` for a mention in backticks, or None (not public, or ambiguous)."""
    faces = index.get(name)
    if not faces:
        return None
    qualifier = mention[:-len(name)].rstrip(".")
    if qualifier:
        face = aliases.get(qualifier, qualifier.removeprefix("parlab."))
        if face not in faces:
            return None
    elif len(faces) == 1:
        face = faces[0]
    else:
        return None
    return f"parlab.{face}.{name}"


def _link_api(line: str, index, aliases: dict[str, str], seen: set[str]) -> str:
    """Link the first mention, in the chapter, of each public name to the API page."""
    def link(match):
        mention, name = match.group(1), match.group(2)
        target = _api_target(mention, name, index, aliases)
        if target is None or target in seen:
            return match.group(0)
        seen.add(target)
        return "{py:obj}`%s <%s>`" % (match.group(0)[1:-1], target)

    return _API_MENTION.sub(link, line)


def _aliases(notebook) -> dict[str, str]:
    """The chapter's short names of faces: ``from parlab import data_parallel as dp``."""
    code = "\n".join(c.source for c in notebook.cells if c.cell_type == "code")
    return {m[1] or m[3]: m[0] or m[2] for m in _ALIAS.findall(code)}


def _figure(cell, shown: list) -> None:
    """The image's title as its alternative text; a lone image becomes a figure, with a
    caption only where one says more than the title drawn in the image."""
    images = [o for o in shown if "image/png" in o.get("data", {})]
    if len(images) != 1:
        return
    meta = images[0].get("metadata", {}).get("parlab", {})
    title, caption = meta.get("title", ""), meta.get("caption", "")
    mystnb = cell.metadata.setdefault("mystnb", {})
    if title or caption:
        mystnb["image"] = {"alt": caption or title}
    # MyST-NB wraps every output of the cell in the figure: only a lone image gets one
    if len(shown) == 1:
        mystnb["figure"] = {"classes": "parlab-figure"}  # empty options would mean no figure
        if caption and caption != title:
            mystnb["figure"]["caption"] = caption


def _prepare_notebook(notebook, files: dict[str, str], own: str, index=None):
    index = index or {}
    aliases, seen, seen_images = _aliases(notebook), set(), set()
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            lines = []
            for line in cell.source.split("\n"):
                if not line.startswith("#"):
                    line = _link_chapters(_link_api(line, index, aliases, seen), files, own)
                lines.append(line)
            cell.source = GLUE_SPAN.sub(lambda m: "{glue:text}`%s`" % m.group(1),
                                        "\n".join(lines))
            continue
        if HIDDEN_TAG in cell.metadata.get("tags", []):
            continue  # MyST-NB reads its glue records and leaves the cell off the page
        outputs = []
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if _WIDGET in data:
                what = data.get("text/plain", "")
                if what.startswith("[interactive] "):
                    data = {"text/markdown": "*Interactive in JupyterLab:* "
                                             f"{what.removeprefix('[interactive] ')}. "
                                             "The figure above is its default setting."}
                else:  # a progress bar: its stored text is its final state
                    data = {"text/plain": what}
                output["data"] = data
            if "image/png" in data and data["image/png"] in seen_images:
                continue  # the same figure is on the page already
            outputs.append(output)
        cell.outputs = outputs
        shown = [o for o in outputs if "scrapbook" not in o.get("metadata", {})]
        seen_images.update(o["data"]["image/png"] for o in shown
                           if "image/png" in o.get("data", {}))
        _figure(cell, shown)
    notebook.metadata.pop("widgets", None)
    return notebook


def prepare(notebooks: list[Path], source: Path) -> list[Path]:
    """Write Sphinx's source folder: ``conf.py``, ``index.md``, ``api.md``, the stylesheet
    and a prepared copy of each chapter notebook. Raises ValueError listing every prose
    number that differs from the code's."""
    import nbformat

    files = {nb.name[:2]: nb.name for nb in notebooks}
    if source.exists():
        shutil.rmtree(source)
    source.mkdir(parents=True)
    read = {path: nbformat.read(path, as_version=4) for path in notebooks}
    problems = [p for path, notebook in read.items() for p in glue_problems(notebook, path.name)]
    if problems:
        raise ValueError("numbers in the prose differ from the code's:\n  " + "\n  ".join(problems))
    index, written = api_index(), []
    for path, notebook in read.items():
        target = source / path.name
        nbformat.write(_prepare_notebook(notebook, files, path.name[:2], index), target)
        written.append(target)
    (source / "conf.py").write_text(CONF)
    (source / "_static").mkdir()
    (source / "_static" / "parlab.css").write_text(CSS)
    (source / "index.md").write_text(INDEX.format(chapters="\n".join(p.stem for p in written)))
    (source / "api.md").write_text(_api_page())
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
