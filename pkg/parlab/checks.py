"""Argument checks every layer shares, so a bad value gets the same clear message everywhere.

A teaching package is called with typed-in numbers; a wrong one must fail at once, naming
the argument, what it is for, and what was given, never deep inside a rank. Imports nothing.
"""

from __future__ import annotations

__all__ = ["check_count"]


def check_count(name: str, value, what: str = "") -> int:
    """``value`` if it is a whole number >= 1 (not a bool); else a ValueError naming ``name``.

    ``what`` says what the number counts ("micro-batches per batch"), for the message.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        detail = f" ({what})" if what else ""
        raise ValueError(f"{name} must be a whole number >= 1{detail}, got {value!r}")
    return value
