"""nbval's comparison, applied to the notebook JupyterLab ran and saved.

The browser tests run every chapter in JupyterLab. Comparing what JupyterLab saved with the
committed outputs, by nbval's own rules, checks the same thing as nbval's run of the chapter:
nbval's stream merging (``\\r`` progress lines folded), the output keys it skips (metadata,
images, widget model ids), our sanitizer file, and each cell's ``nbval-*`` tags. So when the
browser tests run, the chapters are not executed a second time by nbval (tests/conftest.py
leaves those items out); without a browser, nbval runs them as before.
"""
import copy
import re
from collections import defaultdict
from pathlib import Path

from nbval.plugin import (
    coalesce_streams, find_comment_markers, find_metadata_tags, get_sanitize_patterns,
    transform_streams_for_comparison
)

#: What nbval leaves out of a comparison (IPyNbFile.skip_compare, without --nbdime).
SKIP = ("metadata", "traceback", "prompt_number", "output_type", "name", "execution_count",
        "application/vnd.jupyter.widget-view+json", "image/png", "image/jpeg")
SANITIZE = Path(__file__).resolve().parent / "nbval_sanitize.cfg"


def _flatten(outputs, patterns) -> dict:
    """``{key: [value, ...]}`` as nbval compares them: ``data`` flattened, skipped keys out."""
    flat = defaultdict(list)
    for output in transform_streams_for_comparison(coalesce_streams(copy.deepcopy(outputs))):
        for key, value in output.items():
            if key in SKIP:
                continue
            for k, v in (value.items() if key == "data" else [(key, value)]):
                if k not in SKIP:
                    for regex, replace in patterns:
                        v = re.sub(regex, replace, v) if isinstance(v, str) else v
                    flat[k].append(v)
    return dict(flat)


def differences(ran, committed) -> list[str]:
    """The code cells whose outputs differ, by nbval's rules (``ran``, ``committed``: nbformat
    v4 notebooks). Cells tagged ``nbval-ignore-output`` or ``nbval-skip``, and cells the
    committed notebook never ran, are not compared, as nbval does not compare them."""
    patterns = get_sanitize_patterns(SANITIZE.read_text())
    pairs = zip((c for c in ran.cells if c.cell_type == "code"),
                (c for c in committed.cells if c.cell_type == "code"))
    found = []
    for number, (new, old) in enumerate(pairs):
        options = dict(find_metadata_tags(old.metadata))
        options.update(find_comment_markers(old.source))
        if options.get("skip") or options.get("check") is False or old.execution_count is None:
            continue
        want, got = _flatten(old.outputs, patterns), _flatten(new.outputs, patterns)
        if want != got:
            first = (old.source.splitlines() or [""])[0]
            found.append(f"Cell {number} ({first!r}):\n  committed: {want}\n  JupyterLab: {got}")
    return found
