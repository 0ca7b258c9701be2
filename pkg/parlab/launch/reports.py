"""What each rank sends home after ``fn`` returns, besides its result: the reports.

A report is how a layer above the launcher gets data out of every rank without the launcher
knowing what it is. That layer registers a function by name, in every process that imports
it (the ranks are forked from a server that imported parlab, so every rank has it). After
``fn`` returns, each rank calls every registered function and sends the values home with
its result; the caller finds them in the run's ``.extras[rank][name]`` (see
:class:`parlab.launch.Run`). Nothing is kept on the caller's side: each run carries its own.

The toy backend registers ``"traffic"``: each rank's report is the log of what that rank
sent, and :attr:`parlab.launch.Run.traffic` merges the ranks' reports into one log.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["register_collector", "collect_reports"]

#: This process's report functions, by name (the same in every rank: set at import time).
_collectors: dict[str, Callable[[], Any]] = {}


def register_collector(name: str, collect: Callable[[], Any]) -> None:
    """Have every rank call ``collect()`` after ``fn`` returns and send the value home.

    The value must pickle; it lands in the run's ``.extras[rank][name]``. A value that has a
    classmethod ``merge(values)`` (the toy backend's ``TrafficLog``) can be merged across
    ranks by the caller without the launcher knowing its type.
    """
    _collectors[name] = collect


def collect_reports() -> dict[str, Any]:
    """Run on a rank after ``fn``: every registered report, by name."""
    return {name: collect() for name, collect in _collectors.items()}
