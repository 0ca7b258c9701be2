"""Worked solutions stay where a reader has to choose to look.

For every ``parlab.exercises.chNN_solutions`` module: importing the exercises (what a
chapter does) does not load it, no chapter imports it, and the chapter's checker module
has no ``_answers()`` one call away. Each chapter's tests check that its solutions agree
with its checkers.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "pkg" / "parlab" / "exercises").glob("ch*_solutions.py"))


def test_there_are_worked_solutions():
    assert [p.stem for p in SOLUTIONS] == ["ch02_solutions", "ch03_solutions", "ch04_solutions"]


@pytest.fixture(scope="module")
def loaded_by_import() -> set[str]:
    """The solution modules that ``import parlab.exercises`` loads, in a fresh process (one
    for every chapter: each start imports torch)."""
    names = [f"parlab.exercises.{p.stem}" for p in SOLUTIONS]
    code = f"import sys, parlab.exercises; print([n for n in {names!r} if n in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    return set(ast.literal_eval(out))


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_solutions_are_out_of_a_readers_reach(path, loaded_by_import):
    import importlib

    chapter_id = path.stem[2:4]
    checkers = importlib.import_module(f"parlab.exercises.ch{chapter_id}")
    assert not hasattr(checkers, "_answers")
    assert f"parlab.exercises.{path.stem}" not in loaded_by_import
    imports = re.compile(rf"^\s*(from\s+\S*{path.stem}\s+import|import\s+.*{path.stem})", re.M)
    for chapter in (ROOT / "chapters").glob(f"{chapter_id}_*.py"):
        assert not imports.search(chapter.read_text()), chapter.name
    module = importlib.import_module(f"parlab.exercises.{path.stem}")
    worked = module.solutions()
    assert worked and all(key.startswith(f"{chapter_id}.") for key in worked)
    assert all("Answer: " in str(solution) for solution in worked.values())


def test_a_solution_prints_its_answer():
    from fractions import Fraction

    from parlab.exercises.registry import Solution

    assert str(Solution(12345, "w")) == "w\nAnswer: 12,345"
    assert str(Solution(Fraction(3, 7), "w")) == "w\nAnswer: 3/7 = 0.4286"
    assert str(Solution(print, "w")) == "w\nAnswer: print"
    assert str(Solution({0: ["0F0"]}, "w")) == "w\nAnswer: {0: ['0F0']}"
