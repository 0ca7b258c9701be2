"""Whether the browser tests can run here: Chromium and Playwright (.ci/run installs both)."""
import os
from pathlib import Path

CHROMIUM = os.environ.get("PARLAB_CHROMIUM", "/usr/bin/chromium")


def missing() -> str:
    """Why the browser tests cannot run here, or "" when they can."""
    if not Path(CHROMIUM).exists():
        return f"Chromium not found at {CHROMIUM} (apt-get install chromium; .ci/run does)"
    try:
        import playwright.sync_api  # noqa: F401
        import pytest_playwright  # noqa: F401
    except ImportError:
        return "playwright or pytest-playwright not installed (pip install -r requirements.txt)"
    return ""
