"""Pipeline schedules as data: for every time step and every rank, what it computes.

Why data and not code: the chapter explains pipeline parallelism as a table (time step x
GPU), and the same table drives everything here: the simulator counts bubbles and memory
from it, the executor runs it on real ranks, the plots draw it. A schedule is written in
PyTorch's vocabulary (``torch.distributed.pipelining``), so a reader can move from these
tables to the production API directly:

* an action is a string ``"2F0"`` (stage 2, forward, micro-batch 0) or ``"2B0"`` (backward);
  a schedule that splits the backward (:mod:`parlab.pipeline.zero_bubble`) also writes
  ``"2I0"`` (the input gradient) and ``"2W0"`` (the weight gradient), PyTorch's codes;
* ``pipeline_order[rank]`` has one entry per time step: an action, a tuple of actions
  (a rank that does two in one step, as the book's last stages do), or ``None`` (idle).

Each generator below only says in which *order* a rank works through its actions (its
program). :func:`_place_in_steps` then puts every action into the earliest time step in which its
inputs have arrived, one step after the step that produced them. So timings are derived,
never typed in, and hold for any number of stages and micro-batches.

Stages and ranks: with ``chunks = v > 1`` (interleaved 1F1B) there are ``p * v`` model
chunks ("virtual stages"); chunk ``k`` lives on rank ``k % p``, as in PyTorch's looped
placement. With ``v = 1`` stage and rank are the same number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NamedTuple, Union

from parlab.checks import check_count

__all__ = ["Action", "Entry", "Schedule", "schedule", "from_order", "SCHEDULES",
           "entry_actions", "schedule_lanes", "check_placed", "stage_rank", "PLACEMENTS"]

#: Where stages live: "loop" puts stage k on rank k % p; "v" puts 2p stages on p ranks,
#: rank r holding stages r and 2p - 1 - r.
PLACEMENTS = ("loop", "v")

_ACTION = re.compile(r"^(\d+)([FBIW])(\d+)$")


class Action(NamedTuple):
    """One unit of work: ``kind`` of ``microbatch`` on ``stage``.

    The kinds are PyTorch's codes (``torch.distributed.pipelining``): "F" forward, "B" full
    backward, "I" input gradient, "W" weight gradient. In the text and in every duration the
    notation is Qi et al.'s (2024): F, B = input gradient, W = weight gradient, so the code
    "I" is the pass called B there, and the code "B" is the full backward, B + W in one pass
    (chapter 03's backward).
    """

    stage: int
    kind: str
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    @classmethod
    def parse(cls, text) -> "Action":
        """``"2F0"`` -> Action(2, "F", 0); an Action passes through unchanged."""
        if isinstance(text, Action):
            return text
        match = _ACTION.match(str(text).strip()) if isinstance(text, str) else None
        if not match:
            raise ValueError(f"{text!r} is not an action: write stage, F, B, I or W, "
                             f"micro-batch, as in '2F0' (stage 2 forward micro-batch 0), '0B3' "
                             f"(full backward), '1I2' (input gradient) or '1W2' (weight gradient)")
        return cls(int(match[1]), match[2], int(match[3]))


def stage_rank(stage: int, ranks: int, placement: str = "loop") -> int:
    """The rank that holds ``stage`` of a pipeline on ``ranks`` ranks, in ``placement``."""
    if placement == "v":
        return stage if stage < ranks else 2 * ranks - 1 - stage
    return stage % ranks


def check_placed(where: str, action: Action, rank: int, virtual_stages: int, microbatches: int,
                 holder: int) -> None:
    """A ValueError unless ``action`` is inside the pipeline and ``rank`` is ``holder``, the
    rank that holds its stage; ``where`` starts the message."""
    K, m = virtual_stages, microbatches
    if not (0 <= action.stage < K and 0 <= action.microbatch < m):
        raise ValueError(f"{where} is outside the pipeline ({K} stages 0..{K - 1}, "
                         f"{m} micro-batches 0..{m - 1})")
    if holder != rank:
        raise ValueError(f"{where}: stage {action.stage} lives on rank {holder}, not on "
                         f"rank {rank}")


#: What a rank does in one time step: an action, several, or nothing.
Entry = Union[str, tuple, None]


def entry_actions(entry: Entry) -> tuple[Action, ...]:
    """The actions of one ``pipeline_order`` entry, in the order the rank runs them."""
    if entry is None:
        return ()
    if isinstance(entry, (tuple, list)):
        return tuple(Action.parse(a) for a in entry)
    return (Action.parse(entry),)


@dataclass(frozen=True)
class Schedule:
    """A pipeline schedule: ``pipeline_order[rank][step]`` for ``stages`` ranks.

    ``slot_size`` is how long one action takes, and how many activations one in-flight
    action holds, in units of "one of the batch's micro-batches through one whole stage":
    1 for GPipe, 1F1B and the book; ``m`` for naive model parallelism, which pushes the
    whole batch at once; ``1/v`` for interleaving, whose chunks hold 1/v of a stage.
    ``placement`` is where the stages live (:data:`PLACEMENTS`): "loop" for chapter 03's
    schedules, "v" for a split-backward program put into steps
    (:func:`parlab.pipeline.split_backward.program_steps`).
    """

    name: str
    stages: int
    microbatches: int
    chunks: int
    pipeline_order: dict = field(repr=False)
    slot_size: float = 1.0
    placement: str = "loop"

    @property
    def virtual_stages(self) -> int:
        """Number of model chunks in the pipeline (``stages * chunks``)."""
        return self.stages * self.chunks

    @property
    def steps(self) -> int:
        """Number of time steps."""
        return max((len(row) for row in self.pipeline_order.values()), default=0)

    def rank_of(self, stage: int) -> int:
        """The rank that holds (virtual) stage ``stage``."""
        return stage_rank(stage, self.stages, self.placement)

    def actions(self, rank: int, step: int) -> tuple[Action, ...]:
        """What ``rank`` computes in time step ``step`` (0-based), in order."""
        row = self.pipeline_order[rank]
        return entry_actions(row[step]) if step < len(row) else ()

    def __str__(self) -> str:
        width = max(len(_fmt(e)) for row in self.pipeline_order.values() for e in row) + 1
        lines = [f"{self.name}: {self.stages} stages, {self.microbatches} micro-batches, "
                 f"{self.chunks} chunk(s), {self.steps} time steps"]
        for rank in range(self.stages):
            lines.append(f"rank {rank}: " + "".join(_fmt(e).ljust(width)
                                                    for e in self.pipeline_order[rank]).rstrip())
        return "\n".join(lines)


def _fmt(entry: Entry) -> str:
    actions = entry_actions(entry)
    return "+".join(map(str, actions)) if actions else "."


# ----------------------------------------------------------------------------- placement


def _place_in_steps(programs: dict[int, list[list[Action]]], stages: int, virtual_stages: int) -> dict:
    """Turn each rank's program into time steps, every action as early as its inputs allow.

    ``programs[rank]`` is a list of lanes; each lane is an ordered list of actions and may
    run at most one action per time step (GPipe and 1F1B have one lane; the book's schedule
    has a forward lane and a backward lane, so a stage can do one of each in a step).
    A forward needs the previous stage's forward of that micro-batch in an *earlier* step
    (the activation travels in that step's communication phase); a backward needs the
    stage's own forward and the next stage's backward in earlier steps.
    """
    done: dict[tuple[int, str, int], int] = {}
    heads = {rank: [0] * len(lanes) for rank, lanes in programs.items()}
    order = {rank: [] for rank in programs}
    remaining = sum(len(lane) for lanes in programs.values() for lane in lanes)
    step = 0
    while remaining:
        finished_now = []
        for rank, lanes in programs.items():
            entry = []
            for lane_index, lane in enumerate(lanes):
                head = heads[rank][lane_index]
                if head < len(lane) and _ready(lane[head], done, step, virtual_stages):
                    entry.append(lane[head])
                    heads[rank][lane_index] += 1
            finished_now += entry
            order[rank].append(None if not entry else str(entry[0]) if len(entry) == 1
                               else tuple(map(str, entry)))
        if not finished_now:
            waiting = {r: str(lanes[i][h]) for r, lanes in programs.items()
                       for i, h in enumerate(heads[r]) if h < len(lanes[i])}
            raise RuntimeError(f"the schedule deadlocks at time step {step + 1}: every rank "
                               f"waits for an input that never comes (next actions {waiting})")
        for action in finished_now:
            done[(action.stage, action.kind, action.microbatch)] = step
        remaining -= len(finished_now)
        step += 1
    return _trim(order, stages)


def _ready(action: Action, done: dict, step: int, virtual_stages: int) -> bool:
    def before(stage, kind):
        return done.get((stage, kind, action.microbatch), step) < step
    if action.kind == "F":
        return action.stage == 0 or before(action.stage - 1, "F")
    last = action.stage == virtual_stages - 1
    return before(action.stage, "F") and (last or before(action.stage + 1, "B"))


def _trim(order: dict, stages: int) -> dict:
    """Drop trailing idle steps; every row as long as the longest (all ranks step together)."""
    steps = max((i + 1 for row in order.values() for i, e in enumerate(row) if e is not None),
                default=0)
    return {rank: (order[rank] + [None] * steps)[:steps] for rank in range(stages)}


# ----------------------------------------------------------------------------- programs


def _forwards(stage, microbatches):
    return [Action(stage, "F", i) for i in range(microbatches)]


def _backwards(stage, microbatches):
    return [Action(stage, "B", i) for i in range(microbatches)]


def _gpipe(p, m, v):
    """All forwards, then all backwards (GPipe): one lane per rank."""
    return {s: [_forwards(s, m) + _backwards(s, m)] for s in range(p)}


def _book(p, m, v):
    """The chapter's schedule: forwards and backwards each as early as possible, with room
    for one of each per step, so the last stages overlap a forward with a backward."""
    return {s: [_forwards(s, m), _backwards(s, m)] for s in range(p)}


def _one_f_one_b(p, m, v):
    """1F1B (PipeDream-flush): p-1-s warm-up forwards, then alternate, then drain."""
    programs = {}
    for s in range(p):
        warmup = min(p - 1 - s, m)
        program = _forwards(s, warmup)
        for i in range(m - warmup):
            program += [Action(s, "F", warmup + i), Action(s, "B", i)]
        program += [Action(s, "B", i) for i in range(m - warmup, m)]
        programs[s] = [program]
    return programs


def _interleaved(p, m, v):
    """Interleaved 1F1B (Megatron-LM; ordered as torch's ScheduleInterleaved1F1B).

    Rank r holds chunks r, r+p, r+2p, ...; micro-batches go round in rounds of
    ``per_round``: forward through chunk 0 of the round, then chunk 1, ...; backwards
    in the reverse chunk order. Warm-up is longer the further a rank is from the end.
    """
    rounds = max(1, m // p)
    per_round = m // rounds
    programs = {}
    for r in range(p):
        warmup = min((v - 1) * per_round + 2 * (p - 1 - r), m * v)
        counts: dict[tuple[str, int], int] = {}

        def next_action(kind, index):
            chunk = (index // per_round) % v
            stage = (chunk if kind == "F" else v - 1 - chunk) * p + r
            mb = counts.get((kind, stage), 0)
            counts[(kind, stage)] = mb + 1
            return Action(stage, kind, mb)

        program = [next_action("F", i) for i in range(warmup)]
        for i in range(m * v - warmup):
            program += [next_action("F", warmup + i), next_action("B", i)]
        program += [next_action("B", i) for i in range(m * v - warmup, m * v)]
        programs[r] = [program]
    return programs


#: name -> (program generator, one-line description)
SCHEDULES = {
    "book": (_book, "the chapter's 11-step schedule, generalised: forwards and backwards "
                    "each as soon as possible, one of each per step"),
    "naive": (_gpipe, "model parallelism without micro-batches: the whole batch goes "
                      "through stage after stage, then back"),
    "gpipe": (_gpipe, "GPipe: all micro-batches forward, then all backward"),
    "1f1b": (_one_f_one_b, "1F1B: after a short warm-up each stage alternates one forward "
                           "and one backward"),
    "interleaved": (_interleaved, "interleaved 1F1B: each rank holds v model chunks, "
                                  "so micro-batches visit it v times"),
}


def _check_layers(layers, stages, chunks):
    if layers is None:
        return
    check_count("layers", layers, "layers of the model")
    if stages > layers:
        raise ValueError(f"stages={stages} is more than the model's {layers} layers: every "
                         f"stage needs at least one layer; use stages <= {layers}")
    if layers % (stages * chunks):
        raise ValueError(f"chunks={chunks} does not divide the layers: {layers} layers on "
                         f"{stages} stages give {layers / stages:g} per stage, which cannot "
                         f"be cut into {chunks} equal chunks; choose stages * chunks that "
                         f"divides {layers}")


def schedule_lanes(name: str, stages: int = 4, microbatches: int = 4, chunks: int = 1,
                   layers: int | None = None) -> dict[int, list[list[Action]]]:
    """Each rank's program for the schedule ``name``, before it is put into time steps.

    ``{rank: [lane, ...]}``, each lane an ordered list of actions that runs one at a time
    (one lane per rank, two for the book's schedule). The arguments are checked as
    :func:`schedule` checks them; the naive schedule runs one micro-batch (the whole batch).
    """
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; known: {sorted(SCHEDULES)}")
    check_count("stages", stages, "pipeline stages, one rank each")
    check_count("microbatches", microbatches, "micro-batches per batch")
    check_count("chunks", chunks, "model chunks per rank")
    if chunks != 1 and name != "interleaved":
        raise ValueError(f"chunks={chunks} only applies to 'interleaved'; {name!r} holds one "
                         f"chunk per rank (use chunks=1)")
    _check_layers(layers, stages, chunks)
    if name == "interleaved":
        rounds = max(1, microbatches // stages)
        if microbatches % rounds:
            raise ValueError(
                f"interleaved 1F1B (like torch's ScheduleInterleaved1F1B) runs the micro-batches "
                f"in microbatches // stages = {rounds} equal rounds, and microbatches="
                f"{microbatches} is not a multiple of {rounds}; use a multiple of "
                f"stages={stages}, or at most {stages} micro-batches")
    generate = SCHEDULES[name][0]
    return generate(stages, 1 if name == "naive" else microbatches, chunks)


def schedule(name: str, stages: int = 4, microbatches: int = 4, chunks: int = 1,
             layers: int | None = None) -> Schedule:
    """The schedule ``name`` for ``stages`` ranks and a batch of ``microbatches`` micro-batches.

    ``name`` is one of ``"book"``, ``"naive"``, ``"gpipe"``, ``"1f1b"``, ``"interleaved"``;
    ``chunks`` (v) is the number of model chunks per rank and only applies to
    ``"interleaved"``. With ``layers`` the model is checked too: at least one layer per
    stage, and whole layers per chunk.
    """
    programs = schedule_lanes(name, stages, microbatches, chunks, layers)
    order = _place_in_steps(programs, stages, stages * chunks)
    slot = float(microbatches) if name == "naive" else 1.0 / chunks
    return Schedule(name, stages, 1 if name == "naive" else microbatches, chunks, order, slot)


def from_order(pipeline_order: dict, chunks: int = 1, name: str = "custom") -> Schedule:
    """A :class:`Schedule` from a hand-written ``pipeline_order`` (checked by the simulator)."""
    if not isinstance(pipeline_order, dict):
        raise TypeError("pipeline_order must be a dict {rank: [entry per time step]}, "
                        f"got {type(pipeline_order).__name__}")
    if not pipeline_order:
        raise ValueError("pipeline_order must hold one row per rank, {rank: [entry per time "
                         "step]} with ranks 0, 1, ...; got an empty dict")
    check_count("chunks", chunks, "model chunks per rank")
    stages = len(pipeline_order)
    if sorted(pipeline_order) != list(range(stages)):
        raise ValueError(f"pipeline_order must have ranks 0..{stages - 1} as keys, got "
                         f"{sorted(pipeline_order)}")
    rows = {r: list(pipeline_order[r]) for r in range(stages)}
    actions = [a for row in rows.values() for e in row for a in entry_actions(e)]
    if not actions:
        raise ValueError(f"pipeline_order must hold at least one action such as '0F0', got "
                         f"{pipeline_order!r}")
    microbatches = max((a.microbatch for a in actions), default=-1) + 1
    steps = max(len(row) for row in rows.values())
    rows = {r: row + [None] * (steps - len(row)) for r, row in rows.items()}
    return Schedule(name, stages, microbatches, chunks, rows, 1.0 / chunks)
