"""Shared fixtures."""
import pytest


@pytest.fixture
def pid_dir(tmp_path):
    """A folder where ranks record their process ids."""
    return str(tmp_path)


@pytest.fixture(scope="session")
def book_site(tmp_path_factory):
    """The HTML edition of the committed chapters, built once per test session."""
    from pathlib import Path

    from parlab.tools import book

    out = tmp_path_factory.mktemp("site") / "html"
    book.to_html(out, Path(__file__).resolve().parents[1] / "chapters")
    return out
