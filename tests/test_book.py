"""The book's plumbing: notebook pairs, exercise checkers and the figure registry."""
from pathlib import Path

import pytest

from parlab.tools import book, figures

CHAPTERS = Path(__file__).resolve().parents[1] / "chapters"
from parlab.exercises import Verdict, check, list_exercises


def test_every_notebook_has_an_identical_py_pair():
    assert book.chapters(CHAPTERS), "no chapter notebooks found"
    assert book.unpaired(CHAPTERS) == []


def test_a_changed_pair_is_detected(tmp_path):
    (tmp_path / "chapters").mkdir()
    source = CHAPTERS / "00_getting_started.ipynb"
    (tmp_path / "chapters" / source.name).write_bytes(source.read_bytes())
    (tmp_path / "chapters" / "00_getting_started.py").write_text("# %%\nprint('edited')\n")
    (tmp_path / "chapters" / "99_orphan.py").write_text("# %%\n")
    problems = book.unpaired(tmp_path / "chapters")
    assert any("differ" in p for p in problems) and any("no notebook" in p for p in problems)


def _widget_notebook(ids):
    """A notebook whose one output shows a VBox with two children, under the given ids."""
    import nbformat
    box, slider, layout = ids
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("explorer()")
    cell.outputs = [nbformat.v4.new_output("display_data", data={
        "text/plain": "[interactive]",
        "application/vnd.jupyter.widget-view+json": {"model_id": box, "version_major": 2,
                                                     "version_minor": 0}})]
    nb.cells = [nbformat.v4.new_markdown_cell("# title", id="title"), cell]
    cell.id = "code"
    state = {box: {"state": {"children": [f"IPY_MODEL_{slider}"]}},
             slider: {"state": {"layout": f"IPY_MODEL_{layout}", "value": 3}},
             layout: {"state": {}}}
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": state}}
    return nb


def test_rebuilt_notebooks_keep_their_cell_and_widget_ids(tmp_path):
    import uuid

    import nbformat
    first, second = ([uuid.uuid4().hex for _ in range(3)] for _ in range(2))
    a = nbformat.writes(book._stable_widget_ids(_widget_notebook(first), "ch"))
    b = nbformat.writes(book._stable_widget_ids(_widget_notebook(second), "ch"))
    assert a == b and not any(i in a for i in first)  # random ids gone, the rest identical
    previous = tmp_path / "old.ipynb"
    old = _widget_notebook(first)
    nbformat.write(old, previous)
    new = _widget_notebook(first)
    for cell in new.cells:  # jupytext gives every cell of a freshly read .py a new id
        cell.id = uuid.uuid4().hex[:8]
    new.cells.insert(1, nbformat.v4.new_markdown_cell("a new cell"))
    new.cells[2].source += "  # edited"  # jupytext's merge still matches it, by position
    merged = book._with_previous(new, previous)
    assert [merged.cells[0].id, merged.cells[2].id] == [c.id for c in old.cells]
    assert merged.cells[1].id not in {c.id for c in old.cells}
    assert merged.cells[2].source.endswith("# edited") and "widgets" not in merged.metadata


def test_every_exercise_waits_for_an_answer_and_rejects_a_wrong_one():
    exercises = list_exercises()
    assert {"00.1", "00.2"} <= set(exercises)
    for exercise_id in exercises:
        assert check(exercise_id, ...).ok is None
        verdict = check(exercise_id, "certainly not the answer")
        assert isinstance(verdict, Verdict) and verdict.ok is False


def test_exercise_00_checkers_accept_right_answers_without_printing_them():
    import torch
    import torch.distributed as dist

    assert check("00.1", 10).ok is True
    wrong = check("00.1", 4)
    assert wrong.ok is False and "10" not in wrong.message

    def sum_of_squares():
        t = torch.tensor([float(dist.get_rank() ** 2)])
        dist.all_reduce(t)
        return t.item()

    assert check("00.2", sum_of_squares).ok is True
    assert check("00.2", lambda: dist.get_rank()).ok is False
    assert check("00.4", 3).ok is True  # log2(8), counted from a real tree broadcast
    ring = check("00.4", 7)
    assert ring.ok is False and "ring" in ring.message


def test_unknown_exercise_is_a_clear_error():
    with pytest.raises(ValueError, match="no exercise"):
        check("99.9", 1)


def test_figures_command_lists_and_filters(capsys, tmp_path):
    assert figures.main(["--list"]) == 0
    assert "fig-00-all-reduce" in capsys.readouterr().out
    assert figures.main(["no-such-figure-*", "--out", str(tmp_path)]) == 2


def test_book_tool_without_a_chapters_folder_says_so(tmp_path, capsys):
    assert book.main(["check", "--chapters", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "no chapters folder at" in err and "--chapters DIR" in err and "Traceback" not in err


def test_no_chapter_shows_one_titled_figure_twice():
    """A figure's title (the ``parlab`` metadata that ``viz.show`` stores) appears once per
    chapter: an explorer under a figure the page just showed opens on other settings, or
    draws nothing until a control moves (``explore(shown_above=True)``)."""
    import nbformat

    for path in sorted(CHAPTERS.glob("[0-9][0-9]_*.ipynb")):
        titles = [title for cell in nbformat.read(path, as_version=4).cells
                  if cell.cell_type == "code" for output in cell.get("outputs", [])
                  if "image/png" in output.get("data", {})
                  if (title := output.get("metadata", {}).get("parlab", {}).get("title"))]
        twice = sorted({t for t in titles if titles.count(t) > 1})
        assert twice == [], f"{path.name} shows these figures twice: {twice}"
