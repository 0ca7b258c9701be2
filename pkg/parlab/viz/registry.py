"""The figure registry: every figure the chapters draw, under the book's numbering.

Each chapter's experiment module (:mod:`parlab.experiments`) registers the recipes of its
figures (``@figure("fig-8-07-pipeline-step-5")``): run or compute, then draw with
:mod:`parlab.viz.plots`. So ``python -m parlab.tools.figures``, the HTML edition and the tests all
see the same list without a hand-kept index.
"""

from __future__ import annotations

from typing import Callable

__all__ = ["figure", "register", "registered"]

_REGISTRY: dict[str, tuple[str, Callable]] = {}


def register(name: str, make: Callable, title: str = "") -> None:
    """Register ``make() -> matplotlib.figure.Figure`` under the file name ``name`` (no suffix)."""
    if name in _REGISTRY:
        raise ValueError(f"figure {name!r} is registered twice")
    _REGISTRY[name] = (title, make)


def figure(name: str, title: str = ""):
    """Decorator form of :func:`register`."""
    def wrap(make):
        register(name, make, title)
        return make
    return wrap


def registered() -> dict[str, tuple[str, Callable]]:
    """The figures registered so far (by the modules imported so far), sorted by name.

    :func:`parlab.tools.figures.registry` imports every experiment module first, for the whole list.
    """
    return dict(sorted(_REGISTRY.items()))
