"""Spans: what a rank was doing and when, timed on the wall clock inside the rank.

Why: the simulator draws a pipeline as a table of equal time steps, and the traffic log
says what was sent but not when. A *span* is one measured piece of a rank's work: a
forward pass, a ``send``, an ``all_reduce``, with its start and duration. Collected from
every rank they make the real timeline of a run (``parlab.comm.chrome_trace`` writes it as a
Chrome trace), where waiting and overlap show up as gaps and long receives.

Inside a rank::

    with recording() as recorder:            # the rank's spans go to recorder.spans
        with span("0F1", "compute", microbatch=1):
            ...
        with span("send", "communication", op="send", peer=1, bytes=32):
            dist.send(t, 1)

Every rank that :func:`parlab.launch.run` starts records while ``fn`` runs: the run's
``.spans[r]`` holds rank r's spans, with no code of yours. Library code calls :func:`span`
unconditionally: outside any recording (in the notebook's own process) it returns a shared
do-nothing context manager (one global lookup, no clock read). Recordings nest: a span goes
to every recording that is open, so code that records its own spans inside ``fn`` (the
pipeline executor, data-parallel training) still gets exactly them, and the run gets them
too. A recorder belongs to its process; ranks run one thread each, so there is no locking.

Clock: ``time.perf_counter_ns`` (CLOCK_MONOTONIC on Linux, the same system-wide clock on
macOS). All processes of one machine read the same clock, so the spans of ranks started
by :func:`parlab.launch.run` line up with each other. Under ``torchrun`` across machines
every machine has its own monotonic clock with its own zero: spans of ranks on different
machines cannot be compared without a clock offset, which this module does not estimate.

A span is host time. On a GPU, kernels run asynchronously: a compute span ends when its
kernels are queued, and their running time lands in the next call that waits for them
(a ``recv``, an ``.item()``). torch.profiler with CUDA activities shows the device side.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = ["SPAN_CATEGORIES", "Span", "SpanRecorder", "span", "recording"]

#: A span is compute (the rank's own work) or communication (waiting for or moving bytes).
SPAN_CATEGORIES = ("compute", "communication")


@dataclass(frozen=True)
class Span:
    """One timed piece of work: ``start_ns`` on the monotonic clock, ``dur_ns`` long.

    ``args`` holds what a reader of the timeline wants to know about it (for a transfer:
    ``op``, ``peer`` (global rank), ``bytes``); values are numbers or strings, so they
    travel into JSON unchanged.
    """

    name: str
    cat: str
    start_ns: int
    dur_ns: int
    args: dict = field(default_factory=dict)

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.dur_ns


def _check(name, cat) -> None:
    if not isinstance(name, str) or not name:
        raise TypeError(f"a span's name must be a non-empty string, got {name!r}")
    if cat not in SPAN_CATEGORIES:
        raise ValueError(f"a span's cat must be one of {SPAN_CATEGORIES}, got {cat!r}")


class _Timed:
    """The context manager of one span while recording: reads the clock at enter and exit,
    and gives the span to each of ``recorders``."""

    __slots__ = ("recorders", "name", "cat", "args", "start")

    def __init__(self, recorders, name, cat, args):
        self.recorders, self.name, self.cat, self.args = recorders, name, cat, args

    def __enter__(self):
        self.start = time.perf_counter_ns()
        return self

    def __exit__(self, *exc) -> bool:
        end = time.perf_counter_ns()
        timed = Span(self.name, self.cat, self.start, end - self.start, self.args)
        for recorder in self.recorders:
            recorder.spans.append(timed)
        return False  # a span that raised is still recorded, and the error goes on


class _Off:
    """What :func:`span` returns when nothing records: enter and exit do nothing."""

    __slots__ = ()

    def __enter__(self):
        return None

    def __exit__(self, *exc) -> bool:
        return False


_OFF = _Off()
_active: "tuple[SpanRecorder, ...]" = ()  # the open recordings, outermost first


class SpanRecorder:
    """The spans of one process, in the order they ended. ``tags`` go into every span's args
    (a training loop sets ``recorder.tags["step"]`` once per step, and the spans of code it
    calls carry the step without knowing about it)."""

    def __init__(self, **tags):
        self.spans: list[Span] = []
        self.tags = dict(tags)

    def span(self, name: str, cat: str = "compute", **args):
        """A context manager that times its body as one span of this recorder only."""
        _check(name, cat)
        return _Timed((self,), name, cat, {**self.tags, **args})


def span(name: str, cat: str = "compute", **args):
    """Time the ``with`` body as a span of every open recording; do nothing when none records.

    Its ``args`` are the tags of the open recordings (an inner one's win over an outer
    one's), then ``args``.
    """
    recorders = _active
    if not recorders:
        return _OFF
    _check(name, cat)
    tags = {}
    for recorder in recorders:
        tags.update(recorder.tags)
    return _Timed(recorders, name, cat, {**tags, **args})


@contextmanager
def recording(**tags):
    """Record this process's spans until the ``with`` block ends; yields the recorder.

    A nested ``recording`` collects the spans of its own block; the outer one keeps getting
    them too, and goes on alone after the inner block ends.
    """
    global _active
    recorder = SpanRecorder(**tags)
    previous, _active = _active, _active + (recorder,)
    try:
        yield recorder
    finally:
        _active = previous
