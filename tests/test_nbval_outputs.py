"""The browser tests' output check (tests/nbval_outputs.py) finds what nbval would find.

It replaces nbval's own run of a chapter when the browser tests run that chapter, so it must
flag a changed output, and ignore exactly what nbval ignores: cells tagged
``nbval-ignore-output``, images, widget ids, split streams, the sanitizer file's patterns.
"""
import copy
from pathlib import Path

import nbformat
import pytest

from nbval_outputs import differences

CHAPTER = Path(__file__).resolve().parents[1] / "chapters" / "02_data_parallelism.ipynb"


@pytest.fixture(scope="module")
def committed():
    return nbformat.read(CHAPTER, as_version=4)


def _checked_stream_cell(notebook):
    """The first code cell that nbval compares and that printed to stdout."""
    for cell in notebook.cells:
        if (cell.cell_type == "code" and "nbval-ignore-output" not in cell.metadata.get("tags", [])
                and any(o.output_type == "stream" for o in cell.outputs)):
            return cell
    raise AssertionError("no compared cell prints")


def test_the_committed_notebook_equals_itself(committed):
    assert differences(copy.deepcopy(committed), committed) == []


def test_a_changed_printed_number_is_found(committed):
    ran = copy.deepcopy(committed)
    stream = next(o for o in _checked_stream_cell(ran).outputs if o.output_type == "stream")
    stream.text = stream.text.replace("0", "9", 1)
    found = differences(ran, committed)
    assert len(found) == 1 and "committed" in found[0]


def test_a_missing_output_is_found(committed):
    ran = copy.deepcopy(committed)
    _checked_stream_cell(ran).outputs = []
    assert len(differences(ran, committed)) == 1


def test_what_nbval_ignores_is_ignored(committed):
    ran = copy.deepcopy(committed)
    ignored = next(c for c in ran.cells if "nbval-ignore-output" in c.metadata.get("tags", []))
    ignored.outputs = []
    stream = next(o for o in _checked_stream_cell(ran).outputs if o.output_type == "stream")
    half = len(stream.text) // 2  # one print arriving as two stream messages
    first = copy.deepcopy(stream)
    first.text, stream.text = stream.text[:half], stream.text[half:]
    cell = _checked_stream_cell(ran)
    cell.outputs.insert(cell.outputs.index(stream), first)
    assert differences(ran, committed) == []


def test_the_sanitizer_patterns_apply(committed):
    ran, ref = copy.deepcopy(committed), copy.deepcopy(committed)
    for notebook, address in ((ran, "0x7f00aa11bb22"), (ref, "0x55aa33cc44dd")):
        stream = next(o for o in _checked_stream_cell(notebook).outputs
                      if o.output_type == "stream")
        stream.text += f"at {address}\n"
    assert differences(ran, ref) == []
