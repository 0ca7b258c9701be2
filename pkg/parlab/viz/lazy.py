"""matplotlib's modules, imported where a figure first uses them: ``plt``, ``patches``,
``lines`` and ``ticker`` stand for ``matplotlib.pyplot``, ``.patches``, ``.lines`` and
``.ticker``.

Why: :mod:`parlab.experiments` imports every plot module, and the rank server preloads it
(its ranks run the chapters' experiments) while most chapters import it before their first
launch. An eager ``import matplotlib.pyplot`` in the plot modules cost about 0.4 s there:
in every rank server, whose ranks never draw, and in a kernel before its first launch,
serially. Through these stand-ins matplotlib is imported at the first figure, or in a
notebook kernel on the thread that imports while the first launch waits for the server
(:func:`parlab.launch.server.import_while_waiting`).
"""

from __future__ import annotations

import importlib

__all__ = ["plt", "patches", "lines", "ticker"]


class _Module:
    """Stands for the module ``name``: the first attribute read imports it."""

    __slots__ = ("_name",)

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attribute: str):
        return getattr(importlib.import_module(self._name), attribute)

    def __repr__(self) -> str:
        return f"<{self._name}, imported at its first use>"


plt = _Module("matplotlib.pyplot")
patches = _Module("matplotlib.patches")
lines = _Module("matplotlib.lines")
ticker = _Module("matplotlib.ticker")
