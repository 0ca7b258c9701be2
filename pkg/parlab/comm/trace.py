"""A run's timeline as a Chrome trace: the JSON that Perfetto and chrome://tracing open.

Why: :mod:`parlab.launch.spans` times each rank's work inside the rank; this turns the spans of
all ranks into one file a reader can open at https://ui.perfetto.dev (or chrome://tracing)
and zoom into, next to the simulated Gantt chart of the same schedule.

The format is the Trace Event Format that ``torch.profiler``'s ``export_chrome_trace`` also
writes: ``{"traceEvents": [...], "displayTimeUnit": "ms"}``, where

- every span is a *complete* event: ``{"ph": "X", "name", "cat", "pid", "tid", "ts", "dur",
  "args"}`` with ``ts`` and ``dur`` in microseconds, ``ts`` counted from the earliest span;
- ``pid`` is the rank, so each rank is one process (track); ``tid`` 0 is its "compute" row
  and ``tid`` 1 its "communication" row, named by ``process_name`` / ``thread_name``
  metadata events (``"ph": "M"``) and ordered by ``process_sort_index`` /
  ``thread_sort_index``, the names torch.profiler uses;
- each ``send`` is joined to the ``recv`` that took its message by a flow event pair
  (``"ph": "s"`` on the sender, ``"ph": "f"`` on the receiver), drawn as an arrow. The k-th
  send from rank a to rank b is matched with the k-th receive on b from a.

A comm span's ``args`` carry ``bytes``, ``peer`` (global rank) and ``op``.
"""

from __future__ import annotations

import gzip
import json
import os
from collections import defaultdict
from pathlib import Path

from parlab.launch import SPAN_CATEGORIES, Span

__all__ = ["chrome_trace", "save_trace", "load_trace", "trace_summary", "TRACE_SUFFIXES"]

#: The file names :func:`save_trace` writes (gzip for the second; Perfetto opens both).
TRACE_SUFFIXES = (".json", ".json.gz")
_TID = {cat: tid for tid, cat in enumerate(SPAN_CATEGORIES)}


def _us(ns: int) -> float:
    """Nanoseconds as microseconds, to the nanosecond (the trace format's unit)."""
    return round(ns / 1000, 3)


def _check_path(path) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike ending in {' or '.join(TRACE_SUFFIXES)}"
                        f", got {type(path).__name__} {path!r}")
    p = Path(path)
    if not p.name.endswith(TRACE_SUFFIXES) or p.name in TRACE_SUFFIXES:
        raise ValueError(f"a trace file's name must end in {' or '.join(TRACE_SUFFIXES)} (what "
                         f"Perfetto and chrome://tracing open), got {str(path)!r}")
    return p


def _check_spans(spans_by_rank, names):
    if not isinstance(spans_by_rank, (list, tuple)):
        raise TypeError(f"spans_by_rank must be a list with one list of Span per rank, "
                        f"got {type(spans_by_rank).__name__}")
    for rank, spans in enumerate(spans_by_rank):
        bad = [s for s in spans if not isinstance(s, Span)] \
            if isinstance(spans, (list, tuple)) else [spans]
        if bad:
            raise TypeError(f"spans_by_rank[{rank}] must be a list of parlab.launch.Span, "
                            f"found {type(bad[0]).__name__} {bad[0]!r}")
    if not any(spans_by_rank):
        raise ValueError("no spans to export: every rank's list is empty (were they "
                         "recorded inside parlab.launch.recording()?)")
    if names is not None and (not isinstance(names, (list, tuple)) or len(names) != len(
            spans_by_rank) or not all(isinstance(n, str) for n in names)):
        raise ValueError(f"names must be one string per rank ({len(spans_by_rank)}), "
                         f"got {names!r}")


def _metadata(rank: int, name: str) -> list[dict]:
    events = [{"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
               "args": {"name": name}},
              {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
               "args": {"sort_index": rank}}]
    for cat, tid in _TID.items():
        events += [{"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
                    "args": {"name": cat}},
                   {"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid,
                    "args": {"sort_index": tid}}]
    return events


def _flows(spans_by_rank, t0: int) -> list[dict]:
    """An arrow from each send span to the recv span that took its message."""
    sends, recvs = defaultdict(list), defaultdict(list)
    for rank, spans in enumerate(spans_by_rank):
        for s in sorted(spans, key=lambda s: s.start_ns):
            if s.args.get("op") == "send":
                sends[(rank, s.args["peer"])].append(s)
            elif s.args.get("op") == "recv":
                recvs[(s.args["peer"], rank)].append(s)
    events, flow_id = [], 0
    for (src, dst), sent in sorted(sends.items()):
        for s, r in zip(sent, recvs.get((src, dst), [])):
            flow_id += 1
            common = {"name": "message", "cat": "transfer", "id": flow_id,
                      "tid": _TID["communication"]}
            events.append({**common, "ph": "s", "pid": src,
                           "ts": _us(s.start_ns + s.dur_ns // 2 - t0)})
            events.append({**common, "ph": "f", "bp": "e", "pid": dst,
                           "ts": _us(r.start_ns + r.dur_ns // 2 - t0)})
    return events


def chrome_trace(spans_by_rank, names=None, path=None) -> dict:
    """Every rank's spans as one Chrome trace; written to ``path`` too, when given.

    ``spans_by_rank[r]`` are global rank r's :class:`Span` s; ``names`` (one per rank, such
    as the book's GPU names) are added to the track names ("rank 0 (A1)").
    """
    target = None if path is None else _check_path(path)
    _check_spans(spans_by_rank, names)
    t0 = min(s.start_ns for spans in spans_by_rank for s in spans)
    events = []
    for rank, spans in enumerate(spans_by_rank):
        label = f"rank {rank}" + (f" ({names[rank]})" if names else "")
        events += _metadata(rank, label)
        events += [{"ph": "X", "name": s.name, "cat": s.cat, "pid": rank, "tid": _TID[s.cat],
                    "ts": _us(s.start_ns - t0), "dur": _us(s.dur_ns), "args": dict(s.args)}
                   for s in sorted(spans, key=lambda s: s.start_ns)]
    events += _flows(spans_by_rank, t0)
    trace = {"traceEvents": events, "displayTimeUnit": "ms",
             "otherData": {"clock": "time.perf_counter_ns (monotonic; one machine)",
                           "start_ns": t0}}
    if target is not None:
        save_trace(trace, target)
    return trace


def save_trace(trace: dict, path) -> Path:
    """Write ``trace`` as JSON (gzip-compressed for a ``.json.gz`` name); returns the path."""
    target = _check_path(path)
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise TypeError("trace must be a dict with a 'traceEvents' list, as chrome_trace returns")
    if not target.parent.is_dir():
        raise ValueError(f"cannot write {str(path)!r}: the folder {str(target.parent)!r} does "
                         f"not exist")
    opener = gzip.open if target.name.endswith(".gz") else open
    with opener(target, "wt", encoding="utf-8") as f:
        json.dump(trace, f)
    return target


def load_trace(path) -> dict:
    """Read a trace written by :func:`save_trace` (or by ``torch.profiler``)."""
    target = _check_path(path)
    opener = gzip.open if target.name.endswith(".gz") else open
    with opener(target, "rt", encoding="utf-8") as f:
        trace = json.load(f)
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError(f"{str(path)!r} is not a Chrome trace: no 'traceEvents' list")
    return trace


def _union_us(intervals) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def trace_summary(trace: dict) -> list[dict]:
    """One row per track (rank): its name, span counts per row, and milliseconds computing,
    communicating and idle (no span at all) between the trace's first and last moment."""
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise TypeError("trace must be a dict with a 'traceEvents' list, as chrome_trace returns")
    events = trace["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    if not spans:
        return []
    start = min(e["ts"] for e in spans)
    length = max(e["ts"] + e["dur"] for e in spans) - start
    rows = []
    for pid in sorted({e["pid"] for e in spans}, key=lambda p: (str(type(p)), p)):
        mine = [e for e in spans if e["pid"] == pid]
        row = {"track": names.get(pid, str(pid))}
        for cat in SPAN_CATEGORIES:
            row[f"{cat} spans"] = sum(e["cat"] == cat for e in mine)
        for cat in SPAN_CATEGORIES:
            row[f"{cat} ms"] = sum(e["dur"] for e in mine if e["cat"] == cat) / 1000
        row["idle ms"] = (length - _union_us((e["ts"], e["ts"] + e["dur"]) for e in mine)) / 1000
        rows.append(row)
    return rows
