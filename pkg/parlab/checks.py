"""Argument checks every layer shares, so a bad value gets the same clear message everywhere.

A teaching package is called with typed-in numbers; a wrong one must fail at once, naming
the argument, what it is for, and what was given, never deep inside a rank. Imports nothing
of parlab.

- :func:`check_count`: a whole number >= 1 (GPUs, layers, micro-batches, a batch, ...).
- :func:`check_index`: a whole number >= 0 (a rank, a stage, a replica: a position).
- :func:`check_positive_number`: any real number > 0 (seconds, watts, TB/s; ``math.inf``
  passes where a caller means "unlimited").
- :func:`check_choice`: one of a few allowed values, the message listing them.
"""

from __future__ import annotations

import numbers

__all__ = ["check_count", "check_index", "check_positive_number", "check_choice"]


def _detail(what: str) -> str:
    return f" ({what})" if what else ""


def check_count(name: str, value, what: str = "") -> int:
    """``value`` if it is a whole number >= 1 (not a bool); else a ValueError naming ``name``.

    ``what`` says what the number counts ("micro-batches per batch"), for the message.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer{_detail(what)}, got {value!r}")
    return value


def check_index(name: str, value, what: str = "") -> int:
    """``value`` if it is a whole number >= 0 (not a bool); else a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer{_detail(what)}, got {value!r}")
    return value


def check_positive_number(name: str, value, what: str = "") -> float:
    """``value`` as a float if it is a real number > 0 (not a bool); else a ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
        raise ValueError(f"{name} must be a positive number{_detail(what)}, got {value!r}")
    return float(value)


def check_choice(name: str, value, choices):
    """``value`` if it is one of ``choices`` (a bool never counts as 0 or 1); else a ValueError
    naming the valid choices."""
    if isinstance(value, bool) and not any(isinstance(c, bool) for c in choices) \
            or value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
    return value
