"""What :func:`parlab.launch.run` returns: the ranks' results, and what the run saw.

A :class:`Run` is a ``list`` of the results in rank order (``run(fn, 4) == [6.0] * 4``, and
it prints, pickles and compares like that list), with attributes for the rest. Each run
carries its own record: two runs in one cell, or a run inside a widget callback, never
read each other's.
"""

from __future__ import annotations

from functools import cached_property

__all__ = ["Run"]


class Run(list):
    """The per-rank results of one launch, in rank order, and what the launch saw.

    - ``world_size``, ``backend``: what ran;
    - ``seconds``: wall time of the launch (under torchrun: of this process's part);
    - ``outputs``: each rank's printed text (stdout and stderr; empty under torchrun, where
      torchrun shows the output itself);
    - ``extras``: per rank, the values its reports sent home after ``fn``
      (:func:`parlab.launch.register_collector`), by name;
    - ``spans``: per rank, the :class:`parlab.launch.Span` s recorded on that rank while
      ``fn`` ran (every :func:`parlab.launch.span` inside ``fn`` and the code it calls);
    - ``traffic``: every rank's messages merged into one log (``parlab.comm.TrafficLog``)
      when the backend logs traffic (``backend="toy"``), else None.
    """

    def __init__(self, results, *, world_size: int, backend: str, seconds: float,
                 outputs: list[str], extras: list[dict], spans: list[list]):
        super().__init__(results)
        self.world_size = world_size
        self.backend = backend
        self.seconds = seconds
        self.outputs = list(outputs)
        self.extras = list(extras)
        self.spans = list(spans)

    @cached_property
    def traffic(self):
        """The ranks' ``"traffic"`` reports merged into one log, or None when no rank logged.

        Each rank's report is its own log (what it sent); the launcher does not know the
        log's type, only that it merges: ``type(part).merge(parts)``.
        """
        parts = [extra["traffic"] for extra in self.extras if extra.get("traffic") is not None]
        if not parts:
            return None
        return type(parts[0]).merge(parts)
