"""The event-driven pipeline simulator: a program, durations, and when each action runs.

Chapter 03's simulator (:func:`parlab.pipeline.simulate`) counts time steps in which every
action takes one step. Here every action takes its own time: F (forward), B (input
gradient, PyTorch's code "I"), W (weight gradient) and the full backward B + W (code "B",
chapter 03's backward), plus a time per transfer between ranks. Each rank works through
its lanes in order (:class:`parlab.pipeline.Program`); an action starts as soon as its lane
is free and its inputs are there:

* F of stage k, micro-batch i: after F of stage k-1 on i (plus a transfer if k-1 is
  on another rank);
* B (or the full backward) of stage k: after F of k on i and after the input gradient of
  stage k+1 on i (its "I" or its full "B"; plus a transfer between ranks);
* W of stage k: after B of stage k on i (same rank, nothing to send).

With ``Durations.steps()`` (F = 1, full backward = 1, free transfers: a step's
communication phase) each action starts at the step chapter 03's table puts it in, so
:meth:`Timeline.to_schedule` gives back that table, its percentages and its errata.

Memory with W deferred (Qi et al. 2024, §2 and Table 1): a forward leaves its activations
(1 unit per stage and micro-batch). B needs them to carry the gradient to the stage's
input, and afterwards only part stays: what W needs, the input of every layer that
multiplies a weight (dL/dA = dL/dy^T x needs x) and the gradient of its output (dL/dy).
The rest, tensors kept only to pass the gradient through (activation functions' inputs,
attention probabilities), is freed at B. So B releases ``1 - kept_for_w`` and W the
``kept_for_w`` that W used; a full backward releases all of it at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from parlab.checks import check_count
from parlab.pipeline.programs import Program, actions_of, pair_parts
from parlab.pipeline.schedules import Action, check_placed, Schedule

__all__ = ["Durations", "Timed", "Timeline", "timeline"]


class Durations(NamedTuple):
    """How long each pass takes, per action (one stage of the program), and one transfer.

    ``B`` is the input gradient and ``W`` the weight gradient (Qi et al.'s letters); a full
    backward takes ``B + W``. ``overlap`` is DeepSeek's F&B, a forward overlapped with a
    full backward (DualPipeV's pairs); None runs a pair's two passes one after the other.
    """

    F: float = 1.0
    B: float = 1.0
    W: float = 1.0
    transfer: float = 0.0
    overlap: float | None = None

    @classmethod
    def steps(cls) -> "Durations":
        """Chapter 03's time step: F and the full backward one step each, transfers free."""
        return cls(1.0, 0.5, 0.5, 0.0)

    def split(self, chunks: int) -> "Durations":
        """These times, given for one rank's share of the model, for one of the ``chunks``
        equal stages it holds (a V: 2, each half a rank's layers): F, B, W and F&B divided by
        ``chunks``; a transfer stays one transfer (the same activation crosses the link)."""
        check_count("chunks", chunks, "stages per rank")
        overlap = None if self.overlap is None else self.overlap / chunks
        return Durations(self.F / chunks, self.B / chunks, self.W / chunks, self.transfer,
                         overlap)

    def of(self, kind: str) -> float:
        """The duration of an action of ``kind`` (PyTorch's code: F, I, W, or B for B + W)."""
        return {"F": self.F, "I": self.B, "W": self.W, "B": self.B + self.W}[kind]

    def check(self) -> "Durations":
        """This, if every time is a finite number >= 0; else a ValueError naming the bad one."""
        for name, value in zip(self._fields, self):
            if name == "overlap" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 0:
                raise ValueError(f"duration {name}={value!r} must be a finite number >= 0 "
                                 f"(F forward, B input gradient, W weight gradient, transfer "
                                 f"between ranks)")
        if self.F + self.B + self.W == 0:
            raise ValueError("durations F, B and W are all 0: nothing would take time")
        return self


class Timed(NamedTuple):
    """One action on the time axis: ``rank`` ran ``action`` in ``lane`` from ``start`` to ``end``."""

    rank: int
    lane: int
    action: Action
    start: float
    end: float


@dataclass
class Timeline:
    """What :func:`timeline` found: every action's start and end, and the costs per rank.

    ``idle[r]`` is the time rank r computes nothing between 0 and ``makespan`` (the end of
    the last action anywhere); all ranks start at 0 and wait for the flush, so a rank's idle
    time is the makespan minus its work.
    """

    program: Program
    durations: Durations
    entries: list

    @property
    def makespan(self) -> float:
        """When the last action ends."""
        return max((e.end for e in self.entries), default=0.0)

    def of_rank(self, rank: int) -> list[Timed]:
        """``rank``'s actions by start time (lane order within a tie)."""
        return sorted((e for e in self.entries if e.rank == rank), key=lambda e: (e.start, e.lane))

    def order(self) -> dict[int, list[str]]:
        """Each rank's actions as strings, by start time."""
        return {r: [str(e.action) for e in self.of_rank(r)] for r in range(self.program.stages)}

    @property
    def busy(self) -> list[float]:
        """Per rank, the time it computes (overlapping lanes counted once)."""
        out = []
        for r in range(self.program.stages):
            total, reach = 0.0, 0.0
            for e in sorted(self.of_rank(r), key=lambda e: e.start):
                total += max(0.0, e.end - max(e.start, reach))
                reach = max(reach, e.end)
            out.append(total)
        return out

    @property
    def idle(self) -> list[float]:
        """Per rank, the makespan minus the time it computes: its share of the bubble."""
        return [self.makespan - b for b in self.busy]

    @property
    def bubble_fraction(self) -> float:
        """Idle time over all ranks' time (chapter 03's idle slots over all slots)."""
        total = self.program.stages * self.makespan
        return sum(self.idle) / total if total else 0.0

    @property
    def peak_inflight(self) -> list[int]:
        """Per rank, the most (stage, micro-batch) pairs holding activations at once.

        A pair holds them from its F until its full backward, or until its W when the
        backward is split.
        """
        return [max(_walk(self.of_rank(r), 1.0), default=0) for r in range(self.program.stages)]

    def peak_activations(self, kept_for_w: float = 0.5) -> list[float]:
        """Per rank, the most activations held at once, in units of one stage's forward.

        ``kept_for_w`` is the share of a forward's activations that W still needs after B
        (0: W needs nothing, as if the backward were not split; 1: B frees nothing).
        """
        if isinstance(kept_for_w, bool) or not isinstance(kept_for_w, (int, float)) \
                or not 0 <= kept_for_w <= 1:
            raise ValueError(f"kept_for_w must be a number from 0 to 1 (the share of a "
                             f"forward's activations W needs after B), got {kept_for_w!r}")
        return [max(_walk(self.of_rank(r), kept_for_w, count=False), default=0.0)
                for r in range(self.program.stages)]

    @property
    def parameters(self) -> list[float]:
        """Per rank, its share of the model's parameters (stages held / stages)."""
        prog = self.program
        return [len(prog.stages_of(r)) / prog.virtual_stages for r in range(prog.stages)]

    @property
    def parameter_copies(self) -> int:
        """How many ranks hold each stage's parameters (DeepSeek's bidirectional DualPipe: 2)."""
        prog = self.program
        return max(sum(1 for r in range(prog.stages) if k in prog.stages_of(r))
                   for k in range(prog.virtual_stages))

    def to_schedule(self) -> Schedule:
        """Chapter 03's step table of this timeline: the action starting at t goes into step t.

        Only where every action of F and full backward B takes one step (``Durations.steps()``)
        and starts on a whole step; otherwise a ValueError says which action does not.
        """
        prog = self.program
        for e in self.entries:
            if e.action.kind not in "FB" or e.end - e.start != 1 or e.start != int(e.start):
                raise ValueError(f"{e.action} on rank {e.rank} runs from {e.start:g} to "
                                 f"{e.end:g}: a step table needs F and full backward B "
                                 f"actions of one step each, starting on whole steps "
                                 f"(Durations.steps())")
        steps = int(self.makespan)
        order = {r: [None] * steps for r in range(prog.stages)}
        for r in range(prog.stages):
            for e in self.of_rank(r):
                t, code = int(e.start), str(e.action)
                held = order[r][t]
                order[r][t] = code if held is None else (*((held,) if isinstance(held, str)
                                                            else held), code)
        return Schedule(prog.name, prog.stages, prog.microbatches, prog.chunks, order,
                        prog.slot_size, prog.placement)


def _walk(entries, kept_for_w, count=True):
    """Activations held after each action (a count of pairs when ``count``)."""
    release = {"F": -1.0, "B": 1.0, "I": 0.0 if count else 1.0 - kept_for_w,
               "W": 1.0 if count else kept_for_w}
    held, out = 0.0, []
    for e in entries:
        held -= release[e.action.kind]
        out.append(round(held, 9))
    return [int(h) for h in out] if count else out


def timeline(prog: Program, durations: Durations | None = None) -> Timeline:
    """Check ``prog`` and put every action in time (see the module's rules).

    ``durations`` default to F = B = W = 1 and free transfers. A program that cannot run
    (an action on a rank that does not hold its stage, a pass missing or repeated, a W
    before its B, an order that waits forever) gets a ValueError naming the action.
    """
    if not isinstance(prog, Program):
        raise ValueError(f"timeline needs a Program (from parlab.pipeline.program or "
                         f"program_from_order), got {type(prog).__name__}")
    if durations is not None and not isinstance(durations, Durations):
        raise ValueError(f"durations must be a parlab.pipeline.Durations (F, B, W, transfer, "
                         f"overlap), such as Durations(F=1, B=1, W=1), got {durations!r}")
    durations = (durations or Durations()).check()
    present = _check(prog)
    K = prog.virtual_stages
    end: dict[tuple[int, str, int], float] = {}

    def arrive(stage, kind, i, rank):
        key = (stage, kind, i)
        if key not in end:
            return None
        return end[key] + (durations.transfer if prog.rank_of(stage) != rank else 0.0)

    def ready(a: Action, rank: int):
        needs = []
        if a.kind == "F":
            needs = [(a.stage - 1, "F")] if a.stage else []
        elif a.kind in "BI":
            needs = [(a.stage, "F")]
            if a.stage < K - 1:
                needs.append((a.stage + 1, "B" if (a.stage + 1, "B", a.microbatch) in present
                              else "I"))
        else:
            needs = [(a.stage, "I")]
        times = [arrive(stage, kind, a.microbatch, rank) for stage, kind in needs]
        return None if None in times else max(times, default=0.0)

    lanes = [(rank, lane_index, _unpaired(lane, durations)) for rank, ls in prog.lanes.items()
             for lane_index, lane in enumerate(ls)]
    heads, free = [0] * len(lanes), [0.0] * len(lanes)
    entries: list[Timed] = []
    while any(h < len(lane) for h, (_, _, lane) in zip(heads, lanes)):
        moved = False
        for n, (rank, lane_index, lane) in enumerate(lanes):
            while heads[n] < len(lane):
                item = lane[heads[n]]
                parts = pair_parts(item)
                times = [ready(a, rank) for a in parts]
                if None in times:
                    break
                start = max(free[n], *times)
                free[n] = start + (durations.overlap if len(parts) > 1
                                   else durations.of(parts[0].kind))
                for a in parts:  # a pair: both passes span the F&B
                    end[(a.stage, a.kind, a.microbatch)] = free[n]
                    entries.append(Timed(rank, lane_index, a, start, free[n]))
                heads[n] += 1
                moved = True
        if not moved:
            waiting = {rank: str(lane[h]) for h, (rank, _, lane) in zip(heads, lanes)
                       if h < len(lane)}
            raise ValueError(f"the program waits forever: each rank's next action needs a "
                             f"result that comes after it (next actions {waiting})")
    entries.sort(key=lambda e: (e.start, e.rank, e.lane))
    return Timeline(prog, durations, entries)


def _unpaired(lane, durations):
    """``lane`` with each overlapped pair as one item if F&B has a time, else unpacked."""
    if durations.overlap is not None:
        return list(lane)
    return [a for item in lane for a in pair_parts(item)]


def _check(prog: Program) -> set:
    """The set of (stage, kind, micro-batch) present; a ValueError for a misplaced action."""
    K, m = prog.virtual_stages, prog.microbatches
    seen: dict[tuple[int, str, int], tuple[int, int, int]] = {}
    for rank, lane_index, position, a in actions_of(prog):
        where = f"rank {rank}: {a}"
        check_placed(f"{where} ({prog.placement} placement)", a, rank, K, m,
                     prog.rank_of(a.stage) if 0 <= a.stage < K else rank)
        key = (a.stage, a.kind, a.microbatch)
        if key in seen:
            raise ValueError(f"{where} appears twice")
        seen[key] = (rank, lane_index, position)
    for (stage, kind, i), (rank, lane, position) in seen.items():
        if kind == "W":
            b = seen.get((stage, "I", i))
            if b is None:
                raise ValueError(f"rank {rank}: {stage}W{i} has no input gradient {stage}I{i} "
                                 f"before it: W needs the output gradient that B computes")
            if b[1] == lane and b[2] > position:
                raise ValueError(f"rank {rank}: {stage}W{i} comes before its B, {stage}I{i}; "
                                 f"W needs the output gradient that B computes, so W must follow it")
    missing = []
    for k in range(K):
        for i in range(m):
            full, split = (k, "B", i) in seen, ((k, "I", i) in seen, (k, "W", i) in seen)
            if (k, "F", i) not in seen:
                missing.append(f"{k}F{i}")
            if full and any(split):
                raise ValueError(f"stage {k}, micro-batch {i} has a full backward {k}B{i} and "
                                 f"a split one ({k}I{i}/{k}W{i}); write one or the other")
            if not full and not all(split):
                missing.append(f"{k}B{i} (or {k}I{i} and {k}W{i})" if not any(split)
                               else f"{k}W{i}")
    if missing:
        raise ValueError(f"the program never runs {', '.join(missing[:5])}"
                         + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    return set(seen)
