"""A real JupyterLab in a real (headless) Chromium, for the reader's-eye tests.

The server runs on a free loopback port with a random token, over a temporary copy of the
chapters (so autosave never touches the committed notebooks), and is stopped after the
tests. Skipped, with the reason, where Chromium or Playwright is missing; .ci/run
installs both.
"""
import json
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from chromium import CHROMIUM, missing

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    """Start JupyterLab over a copy of chapters/; yield (base_url, token, root_dir)."""
    reason = missing()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("lab")
    for notebook in sorted((REPO / "chapters").glob("[0-9][0-9]_*.ipynb")):
        # without outputs or execution counts: the file a test reads back after Run All must
        # be JupyterLab's save, never the committed outputs it is compared with (a copy with
        # them passed as "saved" at once, so the comparison checked the committed file
        # against itself)
        copy = nbformat.read(notebook, as_version=4)
        for cell in copy.cells:
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
        nbformat.write(copy, root / notebook.name)
    settings = root / ".settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    notebook = root / ".settings" / "@jupyterlab" / "notebook-extension"
    notebook.mkdir(parents=True)
    # start the notebook's kernel without asking, and shut it down when the notebook closes
    # (the next chapter opens in the same page); render every cell, not only those in view
    (notebook / "tracker.jupyterlab-settings").write_text(json.dumps(
        {"autoStartDefaultKernel": True, "kernelShutdown": True, "windowingMode": "none"}))
    port, token = _free_port(), secrets.token_hex(16)
    log = open(root / "jupyterlab.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}",
         "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={root}", f"--LabApp.user_settings_dir={root / '.settings'}",
         f"--LabApp.workspaces_dir={root / '.workspaces'}",
         # window.jupyterapp: a test opens the next chapter in the loaded page (as a reader
         # opens a file) instead of loading JupyterLab again, about 5 s a chapter
         "--LabApp.expose_app_in_browser=True"],
        stdout=log, stderr=subprocess.STDOUT, cwd=root)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    raise RuntimeError("JupyterLab did not start:\n"
                                       + (root / "jupyterlab.log").read_text()[-3000:])
                time.sleep(0.3)
        yield base, token, root
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


# pytest-playwright's fixtures (browser, context, page; --screenshot only-on-failure,
# --tracing retain-on-failure) drive Debian's Chromium: Playwright's own download is not used.
@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    reason = missing()
    if reason:
        pytest.skip(reason)
    return {**browser_type_launch_args, "executable_path": CHROMIUM,
            "args": ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update",
                     "--disable-sync"]}


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args):
    return {**browser_context_args, "viewport": {"width": 1400, "height": 1000}}


#: Let Chromium skip the layout and painting of cells out of view (they stay in the page, so
#: every check still finds them): with every cell rendered, each new output made the browser
#: lay out the whole notebook again, as much CPU as the kernel and its ranks used. And no CSS
#: animation or transition (JupyterLab's busy indicators repaint every frame while cells
#: run): five chapters' renderer took 26.9 core-s with them, 23.2 without.
SKIP_OFFSCREEN = """document.addEventListener('DOMContentLoaded', () => {
  const style = document.createElement('style');
  style.textContent = '.jp-Notebook .jp-Cell { content-visibility: auto; '
                      + 'contain-intrinsic-size: auto 150px; } '
                      + '*, *::before, *::after { animation: none !important; '
                      + 'transition: none !important; }';
  document.head.appendChild(style);
});"""


@pytest.fixture(scope="module")
def lab_page(browser, browser_context_args):
    """One page for a test file's chapters: JupyterLab loads once, each chapter opens in it.
    (pytest-playwright's ``page`` is new for every test; a failing chapter's screenshot is
    saved by the test itself.)"""
    context = browser.new_context(**browser_context_args)
    context.add_init_script(SKIP_OFFSCREEN)
    page = context.new_page()
    yield page
    context.close()
