"""The HTML edition in a real browser: the navigation, a figure and the search box render."""
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "browser"


def test_book_site_renders_a_chapter(page, book_site):
    page.goto((book_site / "00_getting_started.html").as_uri())
    page.wait_for_selector("figure img")
    titles = page.locator(".bd-sidebar-primary nav a").all_inner_texts()
    assert len([t for t in titles if t[:2].isdigit()]) == len(
        list((REPO / "chapters").glob("[0-9][0-9]_*.ipynb"))), titles
    assert page.locator("figure img").first.evaluate("i => i.complete && i.naturalWidth > 0")
    assert page.locator("figure img").first.get_attribute("alt")  # the title, as text
    assert page.get_by_role("button", name="Search").count() + page.locator(
        "input[type=search], .search-button-field").count() > 0
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.locator("figure").first.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "book-site.png"))

