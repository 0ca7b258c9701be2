"""The book site: numbers in prose equal the code's, and the site has every chapter, figure,
widget default and link, an API page, and none of the test plumbing (glue calls, NBVAL
markers) that readers should not see. The HTML is read back with the standard library's
parser."""
import ast
import hashlib
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from parlab.tools import book, site
from parlab.viz import glue

REPO = Path(__file__).resolve().parents[1]
CHAPTERS = REPO / "chapters"


def _glued(name, value, fmt=""):
    """A code cell's output from ``glue``, as a kernel would store it."""
    InteractiveShell.instance()
    with capture_output() as captured:
        glue(name, value, fmt)
    (output,) = captured.outputs
    return nbformat.v4.new_output("display_data", data=output.data, metadata=output.metadata)


def _notebook(markdown, *outputs):
    code = nbformat.v4.new_code_cell("pass")
    code.outputs = list(outputs)
    return nbformat.v4.new_notebook(cells=[code, nbformat.v4.new_markdown_cell(markdown)])


def test_glue_writes_what_myst_nb_reads():
    """MyST-NB's own reader (the independent reference) finds the value under its name."""
    from myst_nb.ext.glue import extract_glue_data_cell
    from myst_nb.core.variables import format_plain_text

    cell = nbformat.v4.new_code_cell("pass")
    cell.outputs = [_glued("total", 1536 * 2048, ","), _glued("ratio", 2 / 3, ".2f")]
    data = dict(extract_glue_data_cell(cell))
    assert format_plain_text(data["total"]["data"]["text/plain"], "") == "3,145,728"
    assert format_plain_text(data["ratio"]["data"]["text/plain"], "") == "0.67"
    assert cell.outputs == []  # hidden from the page


def test_a_drifted_or_unknown_prose_number_is_reported():
    ok = _notebook('sends <span data-glue="sent">96</span> bytes', _glued("sent", 96))
    assert site.glue_problems(ok, "nb") == []
    drifted = _notebook('sends <span data-glue="sent">95</span> bytes', _glued("sent", 96))
    assert site.glue_problems(drifted, "nb") == [
        "nb: the prose says '95' for 'sent', the code computed '96'"]
    unknown = _notebook('<span data-glue="snet">96</span>', _glued("sent", 96))
    assert "'snet', which no code cell glues (glued: ['sent'])" in site.glue_problems(unknown)[0]


def test_the_book_command_stops_on_drift(tmp_path, capsys):
    folder = tmp_path / "chapters"
    folder.mkdir()
    nbformat.write(_notebook('# 00 · T\n<span data-glue="sent">95</span>', _glued("sent", 96)),
                   folder / "00_t.ipynb")
    assert book.main(["html", "--chapters", str(folder), "--out", str(tmp_path / "html")]) == 1
    err = capsys.readouterr().err
    assert "the prose says '95' for 'sent'" in err and "Traceback" not in err


@pytest.mark.parametrize("path", sorted(CHAPTERS.glob("[0-9][0-9]_*.ipynb")), ids=lambda p: p.stem)
def test_every_prose_number_equals_the_code(path):
    assert site.glue_problems(nbformat.read(path, as_version=4), path.name) == []


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links, self.images, self.scripts, self.captions, self.alts = [], [], [], 0, []
        self.text, self._in_caption = [], False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])
        elif tag == "img":
            self.images.append(attrs.get("src", ""))
            self.alts.append(attrs.get("alt", ""))
        elif tag in ("script", "link") and (attrs.get("src") or attrs.get("href")):
            self.scripts.append(attrs.get("src") or attrs.get("href"))
        elif tag == "figcaption":
            self.captions += 1

    def handle_data(self, data):
        self.text.append(data)


def _read(page: Path) -> _Page:
    parsed = _Page()
    parsed.feed(page.read_text())
    return parsed


def _distinct_images(notebook):
    return len({o["data"]["image/png"] for c in notebook.cells for o in c.get("outputs", [])
                if "image/png" in o.get("data", {})})


def test_site_has_every_chapter_figure_widget_and_link(book_site):
    notebooks = book.chapters(CHAPTERS)
    index = _read(book_site / "index.html")
    for path in notebooks:
        assert f"{path.stem}.html" in index.links, f"{path.stem} missing from the contents"
        page_file = book_site / f"{path.stem}.html"
        page, notebook = _read(page_file), nbformat.read(path, as_version=4)
        text = " ".join(page.text)
        # every stored figure is on the page once, and every image file it names exists
        figures = [src for src in page.images if src.startswith("_images/")]
        assert len(figures) == _distinct_images(notebook), path.stem
        assert all((book_site / src).stat().st_size > 1000 for src in figures)
        # a caption only where it says more than the title drawn in the image
        shown = [[o for o in c.outputs if "scrapbook" not in o.get("metadata", {})]
                 for c in notebook.cells if c.cell_type == "code"]
        meta = [o[0].get("metadata", {}).get("parlab", {}) for o in shown
                if len(o) == 1 and "image/png" in o[0].get("data", {})]
        captioned = sum(m.get("caption", "") not in ("", m.get("title")) for m in meta)
        assert page.captions == captioned, path.stem
        # a figure's title is its image's alternative text
        images = [[o for o in c if "image/png" in o.get("data", {})] for c in shown]
        titles = {i[0]["metadata"]["parlab"]["title"] for i in images
                  if len(i) == 1 and i[0].get("metadata", {}).get("parlab", {}).get("title")}
        assert titles <= set(page.alts), (path.stem, titles - set(page.alts))
        # each explorer: a note in place of the live widget, below its default figure
        widgets = [o["data"]["text/plain"] for c in notebook.cells if c.cell_type == "code"
                   for o in c.outputs if "application/vnd.jupyter.widget-view+json"
                   in o.get("data", {}) and o["data"]["text/plain"].startswith("[interactive]")]
        assert text.count("Interactive in JupyterLab:") == len(widgets), path.stem
        # glued numbers are printed from the records
        for name, value in site.glue_values(notebook).items():
            assert value in text
        # every link inside the site resolves; nothing is fetched from the network
        for href in page.links:
            target = href.split("#")[0]
            if target and not re.match(r"^[a-z]+:", target):
                assert (page_file.parent / target).exists(), f"{path.stem}: broken link {href}"
        assert not [s for s in page.scripts if s.startswith(("http:", "https:", "//"))]
    # prose that names another chapter links to it
    linked = {href.split("#")[0] for href in _read(book_site / "03_pipeline_parallelism.html").links}
    assert "02_data_parallelism.html" in linked
    assert "search.html" in index.links or (book_site / "search.html").exists()
    search_index = (book_site / "searchindex.js").read_text()
    assert all(json.dumps(p.stem)[1:-1] in search_index for p in notebooks)


def test_the_built_site_shows_no_scaffolding_and_has_an_api_page(book_site):
    """No glue call, no NBVAL marker, no Sphinx figure counter ("Figure 1"), no figure twice;
    an API page that a chapter links to."""
    for page_file in sorted(book_site.glob("*.html")):
        assert "glue(" not in page_file.read_text() and "NBVAL" not in page_file.read_text()
    for page_file in sorted(book_site.glob("0*.html")):
        html, page = page_file.read_text(), _read(page_file)
        assert "caption-number" not in html, f"{page_file.name}: Sphinx numbers the figures"
        assert not re.search(r"Figure \d+(?![-\d])", " ".join(page.text)), page_file.name
        figures = [src for src in page.images if src.startswith("_images/")]
        assert len(figures) == len(set(figures)), f"{page_file.name}: a figure shown twice"
        digests = [hashlib.md5((book_site / src).read_bytes()).hexdigest() for src in figures]
        assert len(digests) == len(set(digests)), f"{page_file.name}: a figure shown twice"
        assert not re.search(r"(?<!\d)0%\|", html), f"{page_file.name}: a bar stored at 0 %"
    api = (book_site / "api.html").read_text()
    for name in ("parlab.launch.run", "parlab.memory.estimate", "parlab.viz.show",
                 "parlab.data_parallel.split_batch", "parlab.exercises.check"):
        assert f'id="{name}"' in api, name
    assert "api.html" in _read(book_site / "index.html").links
    linked = _read(book_site / "02_data_parallelism.html").links
    assert "api.html#parlab.data_parallel.split_batch" in linked
    assert sum(href == "api.html#parlab.data_parallel.split_batch" for href in linked) == 1


def test_a_chapter_links_the_first_mention_of_a_public_name():
    index = {"run": ["launch"], "step": ["data_parallel"], "reference": ["data_parallel",
                                                                         "pipeline"]}
    aliases, seen = {"dp": "data_parallel"}, set()
    line = ("Call `run(fn, 4)`, then `dp.step`, `reference`, `dp.reference`, `run` again, "
            "`pipeline.step`, `nothing`, {glue:text}`run` and [`run`](x.md).")
    assert site._link_api(line, index, aliases, seen) == (
        "Call {py:obj}`run(fn, 4) <parlab.launch.run>`, then "
        "{py:obj}`dp.step <parlab.data_parallel.step>`, `reference`, "
        "{py:obj}`dp.reference <parlab.data_parallel.reference>`, `run` again, "
        "`pipeline.step`, `nothing`, {glue:text}`run` and [`run`](x.md).")


def _code_cells(path):
    return [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


CHAPTER_NOTEBOOKS = sorted(CHAPTERS.glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("path", CHAPTER_NOTEBOOKS, ids=lambda p: p.stem)
def test_readers_cells_hold_no_glue_and_glue_cells_nothing_else(path):
    """A reader's cell never calls ``glue``; a hidden glue cell (tagged ``remove-cell``,
    collapsed in JupyterLab) holds only glue calls, the import of glue and assignments of
    the helper values they use, and shows nothing but the records."""
    for cell in _code_cells(path):
        hidden = site.HIDDEN_TAG in cell.metadata.get("tags", [])
        assert "NBVAL" not in cell.source, f"{path.stem}: a marker in a cell: {cell.source[:80]}"
        if not hidden:
            assert "glue(" not in cell.source, f"{path.stem}: glue in a reader's cell:\n{cell.source}"
            continue
        assert cell.metadata.get("jupyter", {}).get("source_hidden"), path.stem
        for statement in ast.parse(cell.source).body:
            call = statement.value if isinstance(statement, ast.Expr) else None
            ok = (isinstance(statement, (ast.Assign, ast.ImportFrom))
                  or isinstance(call, ast.Call) and getattr(call.func, "id", "") == "glue")
            assert ok, f"{path.stem}: not a glue call in a glue cell: {ast.unparse(statement)}"
        assert all("scrapbook" in o.get("metadata", {}) for o in cell.outputs), path.stem


@pytest.mark.parametrize("path", CHAPTER_NOTEBOOKS, ids=lambda p: p.stem)
def test_every_glued_value_is_used_by_the_prose(path):
    notebook = nbformat.read(path, as_version=4)
    used = {name for c in notebook.cells if c.cell_type == "markdown"
            for name, _ in site.GLUE_SPAN.findall(c.source)}
    assert set(site.glue_values(notebook)) - used == set()


@pytest.mark.parametrize("path", CHAPTER_NOTEBOOKS, ids=lambda p: p.stem)
def test_progress_bars_are_stored_finished(path):
    """Where widgets do not render (GitHub, the site), a bar shows its text: the end state."""
    bars = [o["data"]["text/plain"] for c in _code_cells(path) for o in c.outputs
            if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
            and not o["data"]["text/plain"].startswith("[interactive]")]
    assert all("100%" in bar for bar in bars), bars


def test_every_public_face_is_on_the_api_page_or_left_out_by_name():
    """A new subpackage (context_parallel was missed once) reaches the API page."""
    from parlab.tools.site import API_FACES

    pkg = Path(__file__).resolve().parents[1] / "pkg" / "parlab"
    faces = {p.parent.name for p in pkg.glob("*/__init__.py")}
    assert faces - set(API_FACES) <= {"checks", "progress", "tools"}, faces - set(API_FACES)
