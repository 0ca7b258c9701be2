"""Every schedule as a program: what each rank runs, in order, before anything is timed.

A :class:`Program` is the input of the event-driven simulator (:func:`parlab.pipeline.timeline`):
per rank, one or more lanes of actions, and where each stage lives. It covers chapter 03's
schedules (``"book"``, ``"naive"``, ``"gpipe"``, ``"1f1b"``, ``"interleaved"``, from
:func:`parlab.pipeline.schedules.schedule_lanes`) and the split-backward ones of
:mod:`parlab.pipeline.zero_bubble` (``"zb-h1"``, ``"zbv"``, ``"dualpipev"``).

Placements: ``"loop"`` puts stage k on rank k % p (one stage per rank, or interleaving's v
chunks); ``"v"`` puts 2p stages on p ranks, rank r holding stages r and 2p - 1 - r.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from parlab.checks import check_count
from parlab.pipeline.schedules import Action, PLACEMENTS, SCHEDULES, schedule_lanes, stage_rank
from parlab.pipeline.zero_bubble import ZERO_BUBBLE

__all__ = ["Program", "program", "program_from_order", "PROGRAMS", "PLACEMENTS", "pair_parts",
           "actions_of"]

#: Every schedule :func:`program` knows.
PROGRAMS = tuple(SCHEDULES) + tuple(ZERO_BUBBLE)


@dataclass(frozen=True)
class Program:
    """Per rank, the lanes of actions it runs (``lanes[rank][lane]``, in order).

    ``stages`` is the number of ranks p; ``chunks`` the stages each rank holds (the
    pipeline has ``stages * chunks`` of them); ``slot_size`` as in
    :class:`parlab.pipeline.Schedule` (one action's share of a whole rank's work on one
    micro-batch of the batch).
    """

    name: str
    stages: int
    microbatches: int
    chunks: int
    placement: str
    lanes: dict = field(repr=False)
    slot_size: float = 1.0

    @property
    def virtual_stages(self) -> int:
        """Number of stages in the pipeline (``stages * chunks``)."""
        return self.stages * self.chunks

    def rank_of(self, stage: int) -> int:
        """The rank that holds ``stage``."""
        return stage_rank(stage, self.stages, self.placement)

    def stages_of(self, rank: int) -> list[int]:
        """The stages ``rank`` holds, in increasing order."""
        return [k for k in range(self.virtual_stages) if self.rank_of(k) == rank]

    def order(self) -> dict[int, list[str]]:
        """Each rank's actions as strings, lane after lane (one lane: the order it runs them);
        an overlapped pair (a tuple in a lane) gives its forward, then its backward."""
        return {rank: [str(a) for lane in lanes for item in lane for a in pair_parts(item)]
                for rank, lanes in self.lanes.items()}


def program(name: str, stages: int = 4, microbatches: int = 8, chunks: int | None = None,
            layers: int | None = None) -> Program:
    """The program of schedule ``name`` on ``stages`` ranks with ``microbatches`` micro-batches.

    ``chunks`` is the number of stages per rank: free for ``"interleaved"`` (default 1),
    1 for the other one-stage-per-rank schedules, and 2 for the V schedules (``"zbv"``,
    ``"dualpipev"``, whose 2p stages are fixed by the placement). DualPipeV needs at least
    2p micro-batches, as DeepSeek's code and PyTorch require.
    """
    if name not in PROGRAMS:
        raise ValueError(f"unknown schedule {name!r}; known: {list(PROGRAMS)}")
    if name in SCHEDULES:
        v = 1 if chunks is None else chunks
        lanes = schedule_lanes(name, stages, microbatches, v, layers)
        m = 1 if name == "naive" else microbatches
        slot = float(microbatches) if name == "naive" else 1.0 / v
        return Program(name, stages, m, v, "loop", lanes, slot)
    generate, placement, _ = ZERO_BUBBLE[name]
    check_count("stages", stages, "pipeline ranks")
    check_count("microbatches", microbatches, "micro-batches per batch")
    own = 2 if placement == "v" else 1
    if chunks is not None and chunks != own:
        what = (f"a V schedule has 2 x ranks = {2 * stages} stages, two per rank (rank r holds "
                f"r and {2 * stages - 1} - r)" if own == 2 else "it holds one stage per rank")
        raise ValueError(f"{name!r} cannot take chunks={chunks}: {what}; use chunks={own} "
                         f"or leave it out")
    if layers is not None:
        check_count("layers", layers, "layers of the model")
        if layers % (stages * own):
            raise ValueError(f"{name!r} cuts the model into {stages * own} stages of whole "
                             f"layers, and {layers} layers do not split so; use a multiple of "
                             f"{stages * own} layers")
    lanes = {rank: [order] for rank, order in generate(stages, microbatches).items()}
    return Program(name, stages, microbatches, own, placement, lanes, 1.0 / own)


def program_from_order(order: dict, placement: str = "loop", chunks: int = 1,
                       name: str = "custom") -> Program:
    """A one-lane :class:`Program` from hand-written orders, ``{rank: ["0F0", "0I0", ...]}``.

    Nothing is checked here but the form; :func:`parlab.pipeline.timeline` checks that the
    order can run (each action on its stage's rank, every pass once, no W before its B).
    """
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; known: {list(PLACEMENTS)}")
    check_count("chunks", chunks, "stages per rank")
    if placement == "v" and chunks != 2:
        raise ValueError(f"a V placement holds two stages per rank, got chunks={chunks}; "
                         f"use chunks=2")
    if not isinstance(order, dict) or sorted(order) != list(range(len(order))) or not order:
        raise ValueError(f"order must be a dict {{rank: [action, ...]}} with ranks 0, 1, ..., "
                         f"got {order!r}")
    lanes = {rank: [[Action.parse(a) for a in order[rank]]] for rank in range(len(order))}
    actions = [a for lanes_ in lanes.values() for a in lanes_[0]]
    if not actions:
        raise ValueError("order holds no action; write at least one, such as '0F0'")
    m = max(a.microbatch for a in actions) + 1
    return Program(name, len(order), m, chunks, placement, lanes, 1.0 / chunks)


def pair_parts(item) -> tuple:
    """The actions of one lane item: an Action alone, or an overlapped pair's two."""
    return (item,) if isinstance(item, Action) else tuple(item)


def actions_of(prog: Program) -> list[tuple[int, int, int, Action]]:
    """Every ``(rank, lane, position in the lane, action)`` of ``prog`` (pairs unpacked)."""
    return [(rank, lane_index, position, a) for rank, lanes in prog.lanes.items()
            for lane_index, lane in enumerate(lanes)
            for position, item in enumerate(lane) for a in pair_parts(item)]
