"""What travelled between the ranks: transfer records, tables, and what it would cost on real links.

The toy backend (:mod:`parlab.comm.toy`) logs every message as a :class:`Transfer`.
``run_with_traffic`` runs a function on N ranks with that backend and returns the merged
log as a :class:`TrafficLog`, which answers the chapter's questions: how many bytes each
rank sent, over which links, in which step, and how long that would take on a real
cluster (:mod:`parlab.comm.topology`).

The time model (alpha-beta, as in the collective-communication literature):

- a message of b bytes over a link costs alpha + b / bandwidth;
- the messages of one *step* of one collective (same group label, call and step) run at
  the same time; a step lasts as long as its slowest message; steps run one after another;
- a port shared by several messages of a step divides its bandwidth: each GPU has an
  NVLink port and a NIC, each with an outgoing and an incoming direction, and a message
  takes as long as the busier of its two ports needs for all the bytes they carry;
- the spine is non-blocking, and pipelining across steps (which real libraries do) is
  ignored: the model gives the textbook step-by-step time, not a measurement.

The closed forms in :mod:`parlab.comm.cost` give the same numbers without running anything;
the tests check that the logged traffic and the model agree with them.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from parlab.comm.topology import Topology

__all__ = ["Transfer", "TrafficLog"]


@dataclass(frozen=True)
class Transfer:
    """One logical message: ``nbytes`` from global rank ``src`` to ``dst``.

    ``op`` is the collective (``all_reduce``, ``send``, ...), ``algorithm`` the algorithm
    that ran it, ``step`` its step inside that collective (0-based), ``group`` the label of
    the process group, and ``call`` which call of that group it was (0 for the group's first
    collective; for send/recv, the how-many-th message between this pair).
    """

    op: str
    algorithm: str
    step: int
    src: int
    dst: int
    nbytes: int
    group: str = "world"
    call: int = 0


_FIELDS = list(Transfer.__dataclass_fields__)


# --------------------------------------------------------------------------- the merged log


class TrafficLog:
    """Every transfer of a run, counted once (by its sender), with tables and a time model."""

    def __init__(self, records):
        self.records = list(records)

    @classmethod
    def from_rank_logs(cls, logs) -> TrafficLog:
        """Merge each rank's log (``logs[r]`` from global rank r), keeping what each rank sent.

        Records are ordered by group (in order of appearance), call, step, src and dst.
        """
        return cls.merge([cls(rec for rec in log if rec.src == rank)
                          for rank, log in enumerate(logs)])

    @classmethod
    def merge(cls, logs) -> TrafficLog:
        """All the records of ``logs`` in one log (nothing is dropped: each rank's report
        holds only what that rank sent, so no transfer is in two of them).

        How a run's ``.traffic`` is made from every rank's report (the launcher calls this
        without naming the class). Records are ordered by group (in order of appearance),
        call, step, src and dst.
        """
        records = [rec for log in logs for rec in log.records]
        groups = {g: i for i, g in enumerate(dict.fromkeys(rec.group for rec in records))}
        return cls(sorted(records, key=lambda r: (groups[r.group], r.call, r.step, r.src, r.dst)))

    def __len__(self) -> int:
        return len(self.records)

    def __repr__(self) -> str:
        return f"TrafficLog({len(self.records)} transfers, {self.total_bytes():,} bytes)"

    def total_bytes(self) -> int:
        """Bytes of every transfer in the log, added up."""
        return sum(rec.nbytes for rec in self.records)

    def filter(self, **fields) -> TrafficLog:
        """The records whose fields equal the values given: ``filter(op="all_reduce", call=0)``."""
        unknown = set(fields) - set(_FIELDS)
        if unknown:
            raise ValueError(f"unknown field(s) {sorted(unknown)}; fields: {_FIELDS}")
        return TrafficLog(r for r in self.records
                          if all(getattr(r, k) == v for k, v in fields.items()))

    def to_pandas(self):
        """One row per transfer."""
        import pandas as pd
        return pd.DataFrame([vars(r) for r in self.records], columns=_FIELDS)

    def ranks(self) -> list[int]:
        return sorted({r.src for r in self.records} | {r.dst for r in self.records})

    def per_rank(self):
        """Bytes and messages each rank sent and received."""
        import pandas as pd
        rows = {rank: {"rank": rank, "sent": 0, "received": 0, "messages sent": 0}
                for rank in self.ranks()}
        for rec in self.records:
            rows[rec.src]["sent"] += rec.nbytes
            rows[rec.src]["messages sent"] += 1
            rows[rec.dst]["received"] += rec.nbytes
        return pd.DataFrame(list(rows.values())).set_index("rank")

    def per_link(self, topology: Topology | None = None):
        """Bytes and messages per directed link src -> dst (and its type, given a topology)."""
        import pandas as pd
        totals = defaultdict(lambda: [0, 0])
        for rec in self.records:
            totals[(rec.src, rec.dst)][0] += rec.nbytes
            totals[(rec.src, rec.dst)][1] += 1
        rows = [{"src": s, "dst": d, "bytes": b, "messages": m}
                for (s, d), (b, m) in sorted(totals.items())]
        frame = pd.DataFrame(rows, columns=["src", "dst", "bytes", "messages"])
        if topology is not None:
            frame["link"] = [topology.link_type(s, d) for s, d in zip(frame.src, frame.dst)]
        return frame

    def per_step(self):
        """One row per step of each collective call: messages, bytes, and the largest message."""
        import pandas as pd
        rows = []
        for key, recs in self._steps().items():
            group, op, algorithm, call, step = key
            rows.append({"group": group, "op": op, "algorithm": algorithm, "call": call,
                         "step": step, "messages": len(recs),
                         "bytes": sum(r.nbytes for r in recs),
                         "largest": max(r.nbytes for r in recs)})
        return pd.DataFrame(rows, columns=["group", "op", "algorithm", "call", "step", "messages",
                                           "bytes", "largest"])

    def per_link_type(self, topology: Topology) -> dict[str, int]:
        """Bytes over NVLink, through one rail switch, and through the spine."""
        totals = dict.fromkeys(("nvlink", "rail", "spine"), 0)
        for rec in self.records:
            totals[topology.link_type(rec.src, rec.dst)] += rec.nbytes
        return totals

    def matrix(self, step: int | None = None, n: int | None = None):
        """An n x n array of bytes sent src (row) -> dst (column), for one step or all."""
        import numpy as np
        n = n or (max(self.ranks()) + 1 if self.records else 0)
        grid = np.zeros((n, n), dtype=np.int64)
        for rec in self.records:
            if step is None or rec.step == step:
                grid[rec.src, rec.dst] += rec.nbytes
        return grid

    def _steps(self) -> dict:
        """Records grouped by (group, op, algorithm, call, step), in order of appearance."""
        steps = {}
        for rec in self.records:
            steps.setdefault((rec.group, rec.op, rec.algorithm, rec.call, rec.step), []).append(rec)
        return steps

    # ---------------------------------------------------------------- the alpha-beta model
    def step_times(self, topology: Topology, placement=None):
        """Seconds per step on ``topology`` (rank r on GPU ``placement[r]``, default GPU r)."""
        import pandas as pd
        rows = []
        for (group, op, algorithm, call, step), recs in self._steps().items():
            seconds, slowest = _step_time(recs, topology, placement)
            rows.append({"group": group, "op": op, "call": call, "step": step,
                         "seconds": seconds, "slowest link": slowest})
        return pd.DataFrame(rows, columns=["group", "op", "call", "step", "seconds",
                                           "slowest link"])

    def time(self, topology: Topology, placement=None) -> float:
        """Modelled seconds for the whole log: the sum of its steps' times."""
        return sum(_step_time(recs, topology, placement)[0] for recs in self._steps().values())


def _step_time(records, topology: Topology, placement=None) -> tuple[float, str]:
    """The time of one step: each message waits for the busier of its two ports."""
    gpu = (lambda r: r) if placement is None else (lambda r: placement[r])
    load = defaultdict(int)  # (gpu, port, direction) -> bytes through it in this step
    paths = []
    for rec in records:
        src, dst = gpu(rec.src), gpu(rec.dst)
        kind = topology.link_type(src, dst)
        port = "nvlink" if kind == "nvlink" else "nic"
        load[(src, port, "out")] += rec.nbytes
        load[(dst, port, "in")] += rec.nbytes
        paths.append((src, dst, kind, port))
    worst, slowest = 0.0, ""
    for src, dst, kind, port in paths:
        link = topology.links[kind]
        busiest = max(load[(src, port, "out")], load[(dst, port, "in")])
        seconds = link.alpha + busiest / link.bandwidth
        if seconds > worst:
            worst = seconds
            slowest = f"{topology.gpu_name(src)}->{topology.gpu_name(dst)} ({kind})"
    return worst, slowest
