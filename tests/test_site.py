"""The book site: numbers in prose equal the code's, and the site has every chapter, figure,
widget default and link. The HTML is read back with the standard library's parser."""
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
        self.links, self.images, self.scripts, self.captions = [], [], [], 0
        self.text, self._in_caption = [], False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])
        elif tag == "img":
            self.images.append(attrs.get("src", ""))
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


def _image_outputs(notebook):
    return sum("image/png" in o.get("data", {}) for c in notebook.cells
               for o in c.get("outputs", []))


def test_site_has_every_chapter_figure_widget_and_link(book_site):
    notebooks = book.chapters(CHAPTERS)
    index = _read(book_site / "index.html")
    for path in notebooks:
        assert f"{path.stem}.html" in index.links, f"{path.stem} missing from the contents"
        page_file = book_site / f"{path.stem}.html"
        page, notebook = _read(page_file), nbformat.read(path, as_version=4)
        text = " ".join(page.text)
        # every stored figure is on the page, and every image file it names exists
        figures = [src for src in page.images if src.startswith("_images/")]
        assert len(figures) == _image_outputs(notebook), path.stem
        assert all((book_site / src).stat().st_size > 1000 for src in figures)
        shown = [[o for o in c.outputs if "scrapbook" not in o.get("metadata", {})]
                 for c in notebook.cells if c.cell_type == "code"]
        captioned = sum(len(o) == 1 and "image/png" in o[0].get("data", {})
                        and bool(o[0].get("metadata", {}).get("parlab", {}).get("caption"))
                        for o in shown)
        assert page.captions == captioned, path.stem
        # each explorer: a note in place of the live widget, below its default figure
        widgets = [o["data"]["text/plain"] for c in notebook.cells if c.cell_type == "code"
                   for o in c.outputs if "application/vnd.jupyter.widget-view+json"
                   in o.get("data", {})]
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
