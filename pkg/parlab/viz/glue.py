"""Numbers in a chapter's prose that come from the code: ``glue`` and the ``<span data-glue>``.

A markdown cell cannot run code, so a number in prose is typed by hand and can drift from
what the code computes. Three pieces keep it honest, none of them in what a reader reads:

1. a *hidden glue cell* calls ``glue("ring_bytes", sent, ",")``: it records the formatted
   value as an output in the format of MyST-NB's ``glue`` (a ``scrapbook`` record), so nbval
   re-checks it on every run like any other output. The glue calls sit in their own cell
   right after the reader's cell that computed the values, tagged
   ``# %% tags=["remove-cell"] jupyter={"source_hidden": true, "outputs_hidden": true}``:
   the book site removes it and JupyterLab shows it collapsed. It holds nothing but glue
   calls (and the assignment of a helper value they need); ``tests/test_site.py`` checks
   that, and that no reader's cell calls ``glue``;
2. the prose writes the same text inside ``<span data-glue="ring_bytes">96</span>``, which
   JupyterLab shows as plain text;
3. ``parlab.tools.site`` fails when a span's text differs from its record, and the book site
   turns each span into MyST-NB's ``{glue:text}`` role, so the HTML edition prints the
   recorded value itself.
"""

from __future__ import annotations

__all__ = ["glue", "GLUE_PREFIX"]

#: MyST-NB's (and scrapbook's) prefix for the MIME types of a hidden glued value.
GLUE_PREFIX = "application/papermill.record/"


def glue(name: str, value, fmt: str = "") -> None:
    """Record ``format(value, fmt)`` under ``name`` for the prose.

    Returns None, so a glue cell shows no value even when a glue call is its last line. The
    output carries an empty ``text/plain`` too, so JupyterLab shows an empty line rather
    than a "no renderer" note.
    """
    from IPython.display import display

    if not isinstance(name, str) or not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"glue name must be letters, digits, '_' or '-', got {name!r}")
    text = format(value, fmt)
    # quoted: MyST-NB reads the record with ast.literal_eval, which would make "1,024" a tuple
    display({"text/plain": "", GLUE_PREFIX + "text/plain": repr(text)}, raw=True,
            metadata={"scrapbook": {"name": name, "mime_prefix": GLUE_PREFIX}})
