"""Open every chapter in JupyterLab, run all cells, look for errors, move a widget.

What a reader does, done by a browser: unit tests and nbval cannot see a slider that does
not move or a figure that does not render. Modelled on Galata, JupyterLab's own UI tests.
The saved outputs are also compared with the committed ones by nbval's rules, which is why
nbval does not run these chapters a second time (tests/conftest.py).
"""
import json
import re
import subprocess
import time
from pathlib import Path

import nbformat
import pytest

from nbval_outputs import differences

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "browser"

CHAPTERS = sorted(p.name for p in (REPO / "chapters").glob("[0-9][0-9]_*.ipynb"))
#: The chapters this file runs; test_jupyterlab_later.py runs the rest. Two files, because
#: pytest-xdist keeps a file on one worker: each worker then runs half the chapters in its
#: own JupyterLab and browser, and the suite does not end waiting for one worker doing all.
#: The first half, rounded up: the early chapters are shorter (measured on 2 busy cores with
#: eight chapters: 00-03 about 160 s, 04-07 about 165 s; chapter 08, added last, is among
#: the quickest, so with nine the first file takes 00-04).
FIRST = CHAPTERS[:(len(CHAPTERS) + 1) // 2]
#: Per chapter, what the text of a moved widget's output must show (a regular expression).
WIDGET_TEXT = {
    "03_pipeline_parallelism.ipynb": r"\d+(\.\d+)? ?% ",  # the active-GPU percentage
}

CODE_PROMPTS = "[...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')]" \
               ".map(e => e.textContent.trim())"
#: Every code cell has run: its prompt shows a number, none is queued or running.
ALL_RAN = f"""() => {{
  const indicator = document.querySelector('.jp-Notebook-ExecutionIndicator');
  const prompts = {CODE_PROMPTS};
  return indicator && indicator.dataset.status === 'idle' && prompts.length > 0
         && prompts.every(t => /^\\[\\d+\\]:$/.test(t));
}}"""

#: The kernel is idle and some code cell has neither run nor been queued.
IDLE_WITH_UNRUN = f"""() => {{
  const indicator = document.querySelector('.jp-Notebook-ExecutionIndicator');
  return indicator && indicator.dataset.status === 'idle'
         && {CODE_PROMPTS}.some(t => t === '[ ]:');
}}"""

#: Run All has begun: a cell is queued, running or done, or the kernel is busy.
STARTED = f"""() => {{
  const indicator = document.querySelector('.jp-Notebook-ExecutionIndicator');
  return (indicator && indicator.dataset.status === 'busy')
         || {CODE_PROMPTS}.some(t => t !== '[ ]:');
}}"""


#: In the cell of the moved control: the share of non-white pixels of its static default
#: figure and of the figure the explorer redrew after the slider moved. A redraw that is
#: blank or half-drawn has far less ink than the default render of the same figure.
INK = """() => {
  const ink = img => {
    const c = document.createElement('canvas');
    c.width = img.naturalWidth; c.height = img.naturalHeight;
    const g = c.getContext('2d'); g.drawImage(img, 0, 0);
    const d = g.getImageData(0, 0, c.width, c.height).data;
    let n = 0;
    for (let i = 0; i < d.length; i += 4) if (d[i] + d[i + 1] + d[i + 2] < 720) n++;
    return n / (c.width * c.height);
  };
  const cell = document.querySelector('.jp-Cell[data-moved]');
  const imgs = [...cell.querySelectorAll('.jp-OutputArea-output img')];
  const live = imgs.filter(i => i.closest('.widget-output')).map(ink);
  const still = imgs.filter(i => !i.closest('.widget-output')).map(ink);
  return {still, live};
}"""


def _open(page, lab, name):
    """Open the notebook and wait until every cell is rendered and the kernel is idle.

    The first chapter of a page loads JupyterLab at the notebook's address; later ones close
    what is open (which shuts its kernel down) and open the next file in the same app."""
    base, token, root = lab
    cells = len(json.loads((Path(root) / name).read_text())["cells"])
    if page.evaluate("() => !window.jupyterapp"):
        # one workspace per page: no tab restored from another test file's page
        workspace = f"page-{Path(name).stem}"
        page.goto(f"{base}/lab/workspaces/{workspace}/tree/{name}?token={token}")
    else:
        # the last chapter's moved widget left it unsaved: close it without the dialog
        page.evaluate("async name => { const app = window.jupyterapp;"
                      " for (const w of app.shell.widgets('main'))"
                      "   if (w.context) w.context.model.dirty = false;"
                      " await app.commands.execute('application:close-all');"
                      " await app.commands.execute('docmanager:open',"
                      " {path: name, factory: 'Notebook'}); }", name)
    page.wait_for_selector(".jp-NotebookPanel", timeout=60_000)
    page.wait_for_function(
        f"() => document.querySelectorAll('.jp-NotebookPanel').length === 1 && "
        f"document.querySelectorAll('.jp-Notebook .jp-Cell').length === {cells} && "
        f"document.querySelector('.jp-NotebookPanel .jp-Notebook-ExecutionIndicator') && "
        f"(window.jupyterapp?.shell.currentWidget?.context?.path ?? {json.dumps(name)})"
        f" === {json.dumps(name)}", timeout=60_000)
    if page.query_selector(".jp-Dialog"):  # should the kernel dialog appear anyway: accept
        page.click(".jp-Dialog .jp-mod-accept")
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000)


def _menu(page, menu, command):
    page.click(f".lm-MenuBar-itemLabel:text-is('{menu}')")
    page.click(f".lm-Menu-item[data-command='{command}']")


def _run_all(page, root=None):
    """Clear every stored output (and check it is gone), run all cells, wait until all ran."""
    _menu(page, "Edit", "editmenu:clear-all")
    page.wait_for_function(
        f"() => document.querySelectorAll('.jp-OutputArea-output').length === 0 && "
        f"{CODE_PROMPTS}.every(t => t === '[ ]:')", timeout=20_000)
    for attempt in range(3):  # a click that lands while the page is busy can be lost:
        page.click(".jp-NotebookPanel .jp-Notebook")  # the notebook is the current widget
        _menu(page, "Run", "runmenu:run-all")
        try:  # seen once under load: no cell queued, the kernel idle; then click again
            page.wait_for_function(STARTED, timeout=20_000, polling=250)
            break
        except Exception:
            if attempt == 2:
                raise AssertionError(f"Run All started no cell in 3 tries\n{_stuck(page, root)}")
    # (under pytest-timeout's 300 s, so that a hang says where it is). Seen once under heavy
    # load: JupyterLab's server dropped the kernel's websocket (its log: "AttributeError:
    # 'NoneType' object has no attribute 'kernel_ws_protocol'"), the queued cells were lost
    # and the kernel sat idle. A reader would press Run All again: so does this, twice at most.
    deadline, stalled_since, retries = time.monotonic() + 240, None, 0
    while not page.evaluate(ALL_RAN):
        now = time.monotonic()
        if now > deadline:
            raise AssertionError(f"Run All did not finish in 240 s\n{_stuck(page, root)}")
        idle = page.evaluate(IDLE_WITH_UNRUN)
        stalled_since = (stalled_since or now) if idle else None
        if stalled_since and now - stalled_since > 20:
            if retries == 2:
                raise AssertionError(f"Run All stopped with cells not run, 3 times\n"
                                     f"{_stuck(page, root)}")
            retries, stalled_since = retries + 1, None
            page.click(".jp-NotebookPanel .jp-Notebook")
            _menu(page, "Run", "runmenu:run-all")
        time.sleep(0.2)


#: The cells not yet run: their prompt, first line and output text.
STUCK = """() => [...document.querySelectorAll('.jp-CodeCell')].map((c, i) => ({i,
  prompt: c.querySelector('.jp-InputArea-prompt')?.textContent.trim() ?? '(hidden)',
  source: (c.querySelector('.jp-InputArea-editor')?.innerText ?? '').split('\\n')[0],
  output: (c.querySelector('.jp-OutputArea')?.innerText ?? '').slice(-2000)}))
  .filter(c => !/^\\[\\d+\\]:$/.test(c.prompt) && c.prompt !== '(hidden)')"""


def _stuck(page, root=None) -> str:
    """Where a Run All hangs: the cells not run yet, the processes, JupyterLab's log."""
    try:
        cells = page.evaluate(STUCK)
        status = page.evaluate("() => (document.querySelector('.jp-Notebook-ExecutionIndicator')"
                               " || {dataset: {}}).dataset.status")
    except Exception as error:  # the page itself may be what hangs
        cells, status = f"(not readable: {error})", "?"
    columns = "pid,ppid,stat,etime,time,wchan:20,args"  # -ww: whole lines, also without a tty
    tree = subprocess.run(["ps", "-ww", "-eo", columns, "--forest"], capture_output=True,
                          text=True).stdout
    tree = "\n".join(line[:200] for line in tree.splitlines()
                     if any(k in line for k in ("ipykernel", "python", "forkserver")))
    log = Path(root, "jupyterlab.log") if root else None
    log = log.read_text()[-3000:] if log and log.is_file() else ""
    return (f"kernel status {status!r}; cells not run: {json.dumps(cells, indent=1)}\n{tree}\n"
            f"JupyterLab's log (end):\n{log}")


def _save_and_read(page, lab, name):
    page.keyboard.press("Control+s")
    path = Path(lab[2]) / name
    deadline = time.monotonic() + 30
    while True:
        try:
            notebook = json.loads(path.read_text())
        except json.JSONDecodeError:  # read while the server was writing it (seen in CI)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
            continue
        code = [c for c in notebook["cells"] if c["cell_type"] == "code"]
        if all(c.get("execution_count") for c in code) or time.monotonic() > deadline:
            unrun = [i for i, c in enumerate(code) if not c.get("execution_count")]
            assert unrun == [], f"{name}: code cells {unrun} did not run in JupyterLab"
            return notebook
        time.sleep(0.1)  # a save takes tenths of a second: look often


def _explorer_outputs(page):
    return page.eval_on_selector_all(
        ".widget-vbox .widget-output",
        "els => els.map(e => e.innerText + '|' + e.querySelectorAll('img').length)")


def _move_one_control(page):
    """Move the first slider one step right, or where a chapter has no slider, pick the next
    option of its first dropdown. Marks the control's cell (``data-moved``); returns its kind."""
    handles = page.query_selector_all(".widget-vbox .widget-slider .noUi-handle")
    if handles:
        control = handles[0]
        control.scroll_into_view_if_needed()
        control.click()
        page.keyboard.press("ArrowRight")
        kind = "slider"
    else:
        control = page.query_selector(".widget-vbox .widget-dropdown select")
        assert control is not None, "no slider and no dropdown to move"
        control.scroll_into_view_if_needed()
        options = control.eval_on_selector_all("option", "os => os.map(o => o.value)")
        current = control.evaluate("e => e.selectedIndex")
        control.select_option(options[(current + 1) % len(options)])
        kind = "dropdown"
    control.evaluate("e => { e.closest('.jp-Cell').dataset.moved = '1'; }")
    return kind


@pytest.mark.parametrize("name", FIRST)
def test_chapter_runs_in_jupyterlab(lab, lab_page, name):
    check_chapter(lab, lab_page, name)


def check_chapter(lab, page, name):
    """Open the chapter, run all, find no error and a figure, move one explorer's control.
    Where it fails, a screenshot of the page is kept in test-artifacts/browser/."""
    try:
        _check_chapter(lab, page, name)
    except BaseException:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        try:
            page.screenshot(path=str(ARTIFACTS / name.replace(".ipynb", "-failed.png")))
        except Exception:
            pass  # the page itself may be what failed
        raise


def _check_chapter(lab, page, name):
    _open(page, lab, name)
    _run_all(page, lab[2])
    notebook = _save_and_read(page, lab, name)
    errors = [o for c in notebook["cells"] for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert errors == [], f"{name}: cell errors {[(e['ename'], e['evalue']) for e in errors]}"
    # what nbval checks, on JupyterLab's run (tests/conftest.py then skips nbval's own run)
    differ = differences(nbformat.reads(json.dumps(notebook), as_version=4),
                         nbformat.read(REPO / "chapters" / name, as_version=4))
    assert differ == [], f"{name}: outputs differ from the committed ones:\n" + "\n".join(differ)
    assert page.query_selector_all(".jp-RenderedImage img"), f"{name}: no figure rendered"
    # every chapter has at least one explorer, and one of its controls must work
    assert page.query_selector_all(".widget-vbox .widget-output"), f"{name}: no explorer"
    before = _explorer_outputs(page)
    moved = _move_one_control(page)
    page.wait_for_function(
        "before => { const now = [...document.querySelectorAll("
        "'.widget-vbox .widget-output')].map(e => e.innerText + '|' + "
        "e.querySelectorAll('img').length); return JSON.stringify(now) !== "
        "JSON.stringify(before); }", arg=before, timeout=60_000)
    try:  # let the redrawn figure arrive before the screenshot
        page.wait_for_function(
            "() => [...document.querySelectorAll('.jp-Cell[data-moved] .widget-output img')]"
            ".length > 0", timeout=15_000)
    except Exception:
        pass  # an explorer may print text only
    after = _explorer_outputs(page)
    assert after != before, f"{name}: moving a {moved} changed no explorer's output"
    ink = page.evaluate(INK)
    if ink["still"] and ink["live"]:
        assert ink["live"][0] >= 0.5 * ink["still"][0], \
            f"{name}: the redrawn figure is blank or half drawn: {ink}"
    if name in WIDGET_TEXT:
        assert any(re.search(WIDGET_TEXT[name], text) for text in after), after
    # the moved explorer (its outermost box: controls and the redrawn output)
    box = page.query_selector(".jp-Cell[data-moved] .jp-OutputArea-output .widget-vbox")
    box.evaluate("e => e.scrollIntoView({block: 'start'})")
    page.wait_for_function(
        "() => [...document.querySelectorAll('.jp-Cell[data-moved] .widget-output img')]"
        ".every(i => i.complete && i.naturalWidth > 0)", timeout=15_000)
    # two animation frames: the decoded image has been painted before the screenshot
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    area = box.bounding_box()
    viewport = page.viewport_size
    area["height"] = min(area["height"], viewport["height"] - area["y"])
    page.screenshot(path=str(ARTIFACTS / name.replace(".ipynb", "-widget.png")), clip=area)
    page.screenshot(path=str(ARTIFACTS / name.replace(".ipynb", ".png")))

