"""Bytes for people: one unit system for every number the companion prints or draws.

Decimal (SI) units throughout: 1 kB = 1,000 B, 1 GB = 10^9 B. GPU memory is sold that way
(an "80 GB" H100 holds 80 x 10^9 bytes), link speeds are quoted that way (400 Gb/s), and
the chapter's figures use them, so a number printed here can be set beside the book's
without converting. (Binary units, KiB and GiB, appear nowhere in the output.)
"""

from __future__ import annotations

__all__ = ["KB", "MB", "GB", "TB", "format_bytes"]

KB, MB, GB, TB = 10**3, 10**6, 10**9, 10**12


def format_bytes(n: float) -> str:
    """``n`` bytes in decimal units with three significant digits: 48 B, 1.54 kB, 2.1 GB."""
    for unit, size in (("TB", TB), ("GB", GB), ("MB", MB), ("kB", KB)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"
