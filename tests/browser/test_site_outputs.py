"""The HTML edition in a real browser: no output is cut off.

Every chapter page (and the API page) is opened in one headless Chromium at a laptop's
width; an output whose content is wider than its box must scroll (``overflow-x: auto`` on
it or on a box around it inside the output) or fit, and no output may stick out of the
content column. Skipped, with the reason, where Chromium or Playwright is missing (see
conftest.py); the site is the session's shared ``book_site``.
"""
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: Every element of an output whose content is cut: wider than its box with no scrollbar
#: on it or around it (inside the output), or an output wider than the content column.
CUT_OUTPUTS = """() => {
  const scrolls = el => ['auto', 'scroll'].includes(getComputedStyle(el).overflowX);
  const column = (document.querySelector('.bd-article') || document.body).getBoundingClientRect();
  const name = el => el.tagName.toLowerCase() + (el.className ? '.' + String(el.className)
                     .trim().split(/\\s+/).join('.') : '');
  const cut = [];
  for (const output of document.querySelectorAll('div.cell_output')) {
    const box = output.getBoundingClientRect();
    if (box.right > column.right + 1)
      cut.push(`${name(output)} ends at ${box.right}px, the column at ${column.right}px`);
    for (const el of [output, ...output.querySelectorAll('*')]) {
      if (el.clientWidth === 0 || el.scrollWidth <= el.clientWidth + 1) continue;
      const overflow = getComputedStyle(el).overflowX;
      let ok = overflow === 'auto' || overflow === 'scroll';
      for (let a = el.parentElement; !ok && overflow === 'visible' && a && a !== output.parentElement;
           a = a.parentElement) ok = scrolls(a);
      if (!ok) cut.push(`${name(el)}: ${el.scrollWidth}px of content in ${el.clientWidth}px ` +
                        `(overflow-x: ${overflow}): ${el.textContent.trim().slice(0, 60)}`);
    }
  }
  return cut;
}"""


def cut_outputs(page, site: Path) -> dict[str, list[str]]:
    """{page name: the cut outputs} over every chapter page and the API page."""
    found = {}
    for html in sorted(site.glob("[0-9][0-9]_*.html")) + sorted(site.glob("api.html")):
        page.goto(html.as_uri())
        page.wait_for_load_state("load")
        problems = page.evaluate(CUT_OUTPUTS)
        if problems:
            found[html.name] = problems
    return found


def test_no_output_is_cut_off(page, book_site):
    page.set_viewport_size({"width": 1280, "height": 900})
    chapters = list((REPO / "chapters").glob("[0-9][0-9]_*.ipynb"))
    assert len(list(book_site.glob("[0-9][0-9]_*.html"))) == len(chapters)
    assert cut_outputs(page, book_site) == {}
    # and the check sees a cut: a page whose outputs lose their scrollbars
    page.goto(next(book_site.glob("05_*.html")).as_uri())
    page.add_style_tag(content="div.cell_output * { overflow-x: hidden !important; }")
    assert page.evaluate(CUT_OUTPUTS)
