"""What the last launch did, and the values each rank sends home after ``fn`` returns.

A collector is how a layer above the launcher (the toy backend's traffic log) gets each
rank's data back without the launcher knowing about it: the launcher only calls the
registered functions and files their values under ``last_run().extras[rank]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["LaunchRecord", "last_run", "register_collector", "collectors", "remember"]

_collectors: dict[str, Callable[[], Any]] = {}


@dataclass
class LaunchRecord:
    """What the last :func:`run` in this process did (for notebooks that want more than results)."""

    world_size: int
    backend: str
    seconds: float
    outputs: list[str] = field(default_factory=list)
    extras: list[dict] = field(default_factory=list)


_last_run: LaunchRecord | None = None


def last_run() -> LaunchRecord | None:
    """The record of the most recent :func:`run` call in this process (None before the first)."""
    return _last_run


def register_collector(name: str, collect: Callable[[], Any]) -> None:
    """Have every rank call ``collect()`` after ``fn`` returns and send the value back.

    The toy backend uses this to bring each rank's traffic log home; the values land in
    ``last_run().extras[rank][name]``.
    """
    _collectors[name] = collect



def collectors() -> dict[str, Callable[[], Any]]:
    """The registered collectors, by name (called on every rank after ``fn`` returns)."""
    return dict(_collectors)


def remember(record: LaunchRecord) -> None:
    """File ``record`` as the last launch of this process."""
    global _last_run
    _last_run = record
