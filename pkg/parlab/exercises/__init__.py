"""Exercise checkers: say whether a reader's answer is right, and why, without giving it away.

Each chapter has a module here (``ch00``, ``ch01``, ...) that registers its exercises in
:mod:`parlab.exercises.registry`. A notebook calls ``check("03.2", my_answer)``; the verdict
prints as one line. The checkers compute their answers from real runs and calculators, so
they may import any subpackage; nothing imports them.
"""

from parlab.exercises import (  # noqa: F401
    ch00, ch01, ch02, ch03, ch04, ch05, ch06, ch07, ch08, ch09
)
from parlab.exercises.registry import Verdict, check, list_exercises

__all__ = ["check", "list_exercises", "Verdict"]
