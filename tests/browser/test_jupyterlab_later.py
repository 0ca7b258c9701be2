"""The chapters test_jupyterlab.py leaves for another pytest-xdist worker (see FIRST there)."""
import pytest

from test_jupyterlab import CHAPTERS, FIRST, check_chapter


@pytest.mark.parametrize("name", [name for name in CHAPTERS if name not in FIRST])
def test_chapter_runs_in_jupyterlab(lab, lab_page, name):
    check_chapter(lab, lab_page, name)
