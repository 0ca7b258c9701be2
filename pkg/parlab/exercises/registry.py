"""The exercise registry: each chapter's module registers its checkers here; ``check`` runs one.

An unanswered exercise (``None`` or ``...``) gets a reminder, not a failure, so a notebook
runs top to bottom before the reader has tried anything. :mod:`parlab.exercises` imports
every chapter's module, so its ``check`` knows every exercise.
"""

from __future__ import annotations

import math

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, NamedTuple

__all__ = ["check", "exercise", "Verdict", "right", "wrong", "close", "number",
           "list_exercises", "Solution"]


@dataclass(frozen=True)
class Verdict:
    """The checker's answer: ``ok`` is True, False, or None (not answered yet)."""

    exercise_id: str
    ok: bool | None
    message: str

    def __repr__(self) -> str:
        mark = {True: "right", False: "not yet", None: "unanswered"}[self.ok]
        return f"Exercise {self.exercise_id}: {mark}. {self.message}"

    def __bool__(self) -> bool:
        return bool(self.ok)


class Solution(NamedTuple):
    """A worked solution (in a chapter's ``chNN_solutions`` module): the answer and the working.

    The answer prints as a function's name, a fraction with its decimal, an int with thousands
    separators, or as itself.
    """

    answer: Any
    working: str

    def __str__(self) -> str:
        answer = self.answer
        if callable(answer):
            shown = answer.__name__
        elif isinstance(answer, Fraction):
            shown = f"{answer} = {float(answer):.4f}"
        elif isinstance(answer, int):
            shown = f"{answer:,}"
        else:
            shown = str(answer)
        return f"{self.working}\nAnswer: {shown}"


@dataclass(frozen=True)
class _Exercise:
    exercise_id: str
    question: str
    checker: Callable[[Any], tuple[bool, str]]


_REGISTRY: dict[str, _Exercise] = {}


def number(answer) -> float:
    """``answer`` as a float; a ValueError naming it unless it is a finite number."""
    value = float(answer)
    if not math.isfinite(value):
        raise ValueError(f"{answer!r} is not a finite number")
    return value


def close(answer, expected: float, rel: float = 0.01) -> bool:
    """Whether a numeric answer is within ``rel`` (relative) of the expected value."""
    return math.isclose(float(answer), expected, rel_tol=rel)


def right(why: str = "") -> tuple[bool, str]:
    """A checker's positive verdict, with an optional sentence on why it is right."""
    return True, why or "Well done."


def wrong(hint: str) -> tuple[bool, str]:
    """A checker's negative verdict: a hint that points the way without the answer."""
    return False, hint


def exercise(exercise_id: str, question: str):
    """Register ``checker(answer) -> right(...) | wrong(...)`` under ``exercise_id``."""
    def register(checker):
        _REGISTRY[exercise_id] = _Exercise(exercise_id, question, checker)
        return checker
    return register


def list_exercises() -> dict[str, str]:
    """Every exercise id with its question."""
    return {k: v.question for k, v in sorted(_REGISTRY.items())}


def check(exercise_id: str, answer: Any) -> Verdict:
    """Check ``answer`` for exercise ``exercise_id`` (for example ``"00.1"``)."""
    if exercise_id not in _REGISTRY:
        raise ValueError(f"no exercise {exercise_id!r}; known: {sorted(_REGISTRY)}")
    if answer is None or answer is Ellipsis:
        return Verdict(exercise_id, None, "Replace the ... with your answer and run the cell again.")
    try:
        ok, message = _REGISTRY[exercise_id].checker(answer)
    except Exception as exc:  # a malformed answer is a wrong answer, with the reason
        ok, message = False, f"The answer could not be checked ({type(exc).__name__}: {exc})."
    return Verdict(exercise_id, ok, message)
