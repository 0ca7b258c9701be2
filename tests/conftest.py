"""Shared fixtures."""
import pytest


@pytest.fixture
def pid_dir(tmp_path):
    """A folder where ranks record their process ids."""
    return str(tmp_path)


@pytest.fixture(scope="session")
def book_site(tmp_path_factory):
    """The HTML edition of the committed chapters, built once per test run: under
    pytest-xdist the workers share one build (the first to ask builds it, under a lock)."""
    import os
    from pathlib import Path

    from filelock import FileLock

    from parlab.tools import book

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # this run's folder, shared by its workers
    out = root / "book-site" / "html"
    with FileLock(str(root / "book-site.lock")):
        if not (out / "index.html").is_file():
            book.to_html(out, Path(__file__).resolve().parents[1] / "chapters")
    return out
