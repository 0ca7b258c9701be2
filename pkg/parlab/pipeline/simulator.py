"""The pipeline simulator: from a schedule, the chapter's per-step table and its costs.

Why a simulator next to the executor: the chapter's Figures 8-3 to 8-13 are a table
(which GPU computes what, which tensor travels where, how many GPUs are busy), and the
slides' arguments are counts taken from such tables (bubble fraction, in-flight
activations). :func:`simulate` derives them from ``pipeline_order`` alone, and checks on
the way that the schedule is runnable: every action present once, on the rank that holds
its stage, and never before its inputs can have arrived. The executor
(:mod:`parlab.pipeline.executor`) then runs the same schedule on real ranks, and its log must
equal :meth:`Simulation.events`.

Timing model (the book's): a time step is a computation phase followed by a
communication phase. An activation ``y_i`` made in step t is sent in step t and used in
step t+1 or later; so is an error ``E_i``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from parlab.checks import check_index
from parlab.pipeline.schedules import Action, check_placed, Schedule

__all__ = ["StageTransfer", "Event", "StepRecord", "Simulation", "simulate", "stage_gpu_name",
           "stage_gpu_names"]


class StageTransfer(NamedTuple):
    """A tensor sent between ranks in a step's communication phase.

    ``kind`` is "y" (an activation, to the next stage) or "E" (an error, dLoss/dy, to the
    previous stage); ``microbatch`` is 0-based; ``src``/``dst`` are ranks and
    ``src_stage``/``dst_stage`` the (virtual) stages they belong to; ``step`` is 1-based.
    """

    step: int
    kind: str
    microbatch: int
    src: int
    dst: int
    src_stage: int
    dst_stage: int


class Event(NamedTuple):
    """One line of a rank's log: in ``step`` it ran ``action`` and then sent ``sent`` (or None)."""

    step: int
    rank: int
    action: str
    sent: StageTransfer | None


@dataclass
class StepRecord:
    """One time step: who computed what, what was sent, which ranks were busy."""

    step: int
    compute: list[tuple[int, Action]]
    transfers: list[StageTransfer]
    active: list[int]
    active_percent: float


@dataclass
class Simulation:
    """What :func:`simulate` found. Per-step lists are indexed by step - 1.

    ``bubble_fraction`` = idle (rank, step) slots / all slots: (p-1)/(m+p-1) for GPipe.
    Papers often quote bubble time over ideal time instead, (p-1)/m for GPipe; both are
    available (``bubble_over_ideal``). A step in which a rank runs two actions (the book's
    last stages) counts as one busy slot, as the chapter draws it. ``peak_inflight[r]``: the most micro-batches (or,
    interleaved, chunk x micro-batch pairs) whose activations rank r held at once, between
    their forward and their backward. ``peak_activation[r]`` is the same in units of "one
    micro-batch of the batch through one whole stage" (it scales by the schedule's slot
    size: the naive schedule's single micro-batch is the whole batch).
    """

    schedule: Schedule
    records: list[StepRecord]
    active_percent: list[float]
    bubble_fraction: float
    bubble_over_ideal: float
    peak_inflight: list[int]
    peak_activation: list[float]
    names: list[str] = field(default_factory=list)

    @property
    def steps(self) -> int:
        """Total number of time steps."""
        return len(self.records)

    @property
    def time(self) -> float:
        """Duration in units of one micro-batch through one whole stage (steps x slot size)."""
        return self.steps * self.schedule.slot_size

    @property
    def transfers(self) -> list[StageTransfer]:
        """Every transfer between ranks, in step order."""
        return [t for record in self.records for t in record.transfers]

    def events(self) -> list[Event]:
        """The log each rank must write when it runs this schedule, ordered by step and rank."""
        sent = {(t.step, t.src_stage, t.kind, t.microbatch): t for t in self.transfers}
        out = []
        for record in self.records:
            for rank, action in record.compute:
                kind = "y" if action.kind == "F" else "E"
                key = (record.step, action.stage, kind, action.microbatch)
                out.append(Event(record.step, rank, str(action), sent.get(key)))
        return out

    def table(self) -> str:
        """The per-step table: each GPU's work, the transfers, and the share of busy GPUs."""
        from parlab.pipeline.notation import action_code, transfer_label
        p = self.schedule.stages
        cells = [[", ".join(action_code(a, self) for r, a in rec.compute if r == rank)
                  or "." for rank in range(p)] for rec in self.records]
        sends = [", ".join(transfer_label(self, t) for t in rec.transfers) or "-"
                 for rec in self.records]
        header = ["step", *self.names, "transfers", "active"]
        rows = [[str(rec.step), *cells[i], sends[i], f"{rec.active_percent:g}%"]
                for i, rec in enumerate(self.records)]
        widths = [max(len(h), *(len(row[c]) for row in rows)) for c, h in enumerate(header)]
        line = lambda cells_: "  ".join(c.ljust(w) for c, w in zip(cells_, widths)).rstrip()
        return "\n".join([line(header)] + [line(row) for row in rows])

    def next_iteration(self) -> list[tuple[int, int]]:
        """Per rank, (the step of its last action, the step of its first action in the next
        iteration), under a synchronous flush.

        Each rank updates its weights once its own last backward is done; the next iteration
        runs the same schedule again, shifted by the fewest steps that put every rank's first
        action after its own update. For the chapter's schedules rank 0 decides: its last
        backward comes last, and the next batch enters through it.
        """
        busy = [[t + 1 for t in range(self.steps) if self.schedule.actions(r, t)]
                for r in range(self.schedule.stages)]
        shift = max(row[-1] - row[0] + 1 for row in busy)
        return [(row[-1], row[0] + shift) for row in busy]

    def summary(self) -> str:
        """One line: steps, bubble fraction, peak in-flight micro-batches per rank."""
        unit = ("(chunk, micro-batch) pairs" if self.schedule.chunks > 1 else "micro-batches")
        return (f"{self.schedule.name}: {self.steps} time steps, bubble fraction "
                f"{self.bubble_fraction:.3f} (idle slots / all slots), peak in-flight "
                f"{unit} per rank {self.peak_inflight}")


def stage_gpu_name(rank: int) -> str:
    """The book's GPU names, two GPUs per server: ranks 0-3 are A1, A2, B1, B2; then C1, ..."""
    check_index("rank", rank)
    return f"{chr(ord('A') + rank // 2)}{rank % 2 + 1}" if rank < 52 else f"GPU{rank}"


def stage_gpu_names(stages: int) -> list[str]:
    """Names of ``stages`` pipeline ranks (A1, A2, B1, B2 for the book's four)."""
    return [stage_gpu_name(r) for r in range(stages)]


def simulate(sched: Schedule) -> Simulation:
    """Check ``sched`` and derive its per-step table, bubble fraction and peak memory."""
    if not isinstance(sched, Schedule):
        raise ValueError(f"simulate needs a Schedule (from parlab.pipeline.schedule or "
                         f"from_order), got {type(sched).__name__}")
    p, K = sched.stages, sched.virtual_stages
    _check(sched)
    records, inflight, peaks = [], [0] * p, [0] * p
    for step in range(sched.steps):
        compute, transfers = [], []
        for rank in range(p):
            for action in sched.actions(rank, step):
                compute.append((rank, action))
                inflight[rank] += 1 if action.kind == "F" else -1
                peaks[rank] = max(peaks[rank], inflight[rank])
                target = action.stage + 1 if action.kind == "F" else action.stage - 1
                if 0 <= target < K and sched.rank_of(target) != rank:
                    transfers.append(StageTransfer(step + 1, "y" if action.kind == "F" else "E",
                                              action.microbatch, rank, sched.rank_of(target),
                                              action.stage, target))
        active = sorted({rank for rank, _ in compute})
        records.append(StepRecord(step + 1, compute, transfers, active,
                                  round(100.0 * len(active) / p, 2)))
    busy = sum(len(rec.active) for rec in records)
    slots = p * len(records)
    return Simulation(
        schedule=sched, records=records,
        active_percent=[rec.active_percent for rec in records],
        bubble_fraction=(slots - busy) / slots if slots else 0.0,
        bubble_over_ideal=(slots - busy) / busy if busy else 0.0,
        peak_inflight=peaks,
        peak_activation=[round(n * sched.slot_size, 6) for n in peaks],
        names=stage_gpu_names(p),
    )


def _check(sched: Schedule) -> None:
    """Raise a ValueError naming the first action that is misplaced, repeated, or too early."""
    p, K, m = sched.stages, sched.virtual_stages, sched.microbatches
    done: dict[tuple[int, str, int], tuple[int, int, int]] = {}  # -> (step, rank, position)
    for step in range(sched.steps):
        for rank in range(p):
            for position, action in enumerate(sched.actions(rank, step)):
                where = f"time step {step + 1}, rank {rank}: {action}"
                if action.kind not in "FB":
                    raise ValueError(f"{where} splits the backward (I input gradient, W weight "
                                     f"gradient); simulate counts time steps of F and the full "
                                     f"backward B only: run a split backward through "
                                     f"parlab.pipeline.timeline")
                check_placed(where, action, rank, K, m, sched.rank_of(action.stage) if
                             0 <= action.stage < K else rank)
                key = (action.stage, action.kind, action.microbatch)
                if key in done:
                    raise ValueError(f"{where} was already run in time step {done[key][0] + 1}")
                for need in _needs(action, K):
                    _check_before(where, need, done, step, rank, position)
                done[key] = (step, rank, position)
    missing = [str(Action(s, k, i)) for s in range(K) for k in "FB" for i in range(m)
               if (s, k, i) not in done]
    if missing:
        raise ValueError(f"the schedule never runs {', '.join(missing[:6])}"
                         + (f" and {len(missing) - 6} more" if len(missing) > 6 else ""))


def _needs(action: Action, K: int) -> list[Action]:
    """The actions whose results ``action`` consumes."""
    if action.kind == "F":
        return [Action(action.stage - 1, "F", action.microbatch)] if action.stage else []
    needs = [Action(action.stage, "F", action.microbatch)]
    if action.stage < K - 1:
        needs.append(Action(action.stage + 1, "B", action.microbatch))
    return needs


def _check_before(where, need, done, step, rank, position):
    """``need`` must have finished in an earlier step, or earlier in this step on this rank."""
    key = (need.stage, need.kind, need.microbatch)
    if key not in done:
        raise ValueError(f"{where} runs before {need}, whose result it needs")
    when, who, pos = done[key]
    if when < step or (when == step and who == rank and pos < position):
        return
    tensor = "activation y" if need.kind == "F" else "error E"
    raise ValueError(f"{where} needs the {tensor}{need.microbatch} of {need}, which is made "
                     f"in the same time step on rank {who}; it can only arrive in the "
                     f"communication phase, so {where.split(': ')[1]} must wait a step")
