"""What each rank sends home after ``fn`` returns, besides its result: the reports.

A report is how a layer above the launcher gets data out of every rank without the launcher
knowing what it is. That layer registers a function by name, in every process that imports
it (the ranks are forked from a server that imported parlab, so every rank has it), and
optionally a ``start`` function. Each rank calls every ``start`` as soon as its process
group is up (before the launcher's own first barrier, before ``fn``), and after ``fn``
returns it calls every registered function and sends the values home with its result;
the caller finds them in the run's ``.extras[rank][name]`` (see :class:`parlab.launch.Run`).
Nothing is kept on the caller's side: each run carries its own.

The toy backend registers ``"traffic"``: ``start`` marks where this run begins in the
rank's traffic log (under torchrun one process serves many runs), and the report is what the
rank sent since; :attr:`parlab.launch.Run.traffic` merges the ranks' reports into one log.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["register_collector", "start_reports", "collect_reports"]

#: This process's report functions, by name (the same in every rank: set at import time).
_collectors: dict[str, Callable[[], Any]] = {}
_starts: dict[str, Callable[[], None]] = {}


def register_collector(name: str, collect: Callable[[], Any],
                       start: Callable[[], None] | None = None) -> None:
    """Have every rank call ``collect()`` after ``fn`` returns and send the value home.

    ``start()``, if given, is called on every rank once its process group is up, before
    anything of the run is sent. The value of ``collect()`` must pickle; it lands in the
    run's ``.extras[rank][name]``. A value that has a classmethod ``merge(values)`` (the toy
    backend's ``TrafficLog``) can be merged across ranks by the caller without the launcher
    knowing its type.
    """
    _collectors[name] = collect
    if start is None:
        _starts.pop(name, None)
    else:
        _starts[name] = start


def start_reports() -> None:
    """Run on a rank once its process group is up: every registered ``start``."""
    for start in _starts.values():
        start()


def collect_reports() -> dict[str, Any]:
    """Run on a rank after ``fn``: every registered report, by name."""
    return {name: collect() for name, collect in _collectors.items()}
