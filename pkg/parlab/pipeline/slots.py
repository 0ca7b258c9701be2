"""Work against time: how many actions a schedule packs into its (GPU, time step) slots.

Why this module exists: the book's schedule lets a GPU run a forward *and* a backward in
one time step (B2 in steps 5-7, B1 in step 6), while GPipe and 1F1B run one action per
step. Counted in steps, the book's schedule then looks faster than both, and its
"active GPUs" percentages look lower than the work done, because a GPU that does two
actions in a step counts once. To compare like with like, :func:`slot_count` counts the
actions next to the busy slots, :func:`work_percent` gives each step's work as a share of
the GPUs, and :func:`one_action_per_slot` rebuilds a schedule under the rule the others
follow: each rank keeps its order of work, runs one action per step, and every action
goes into the earliest step its inputs allow (the same placement rule that built it).
"""

from __future__ import annotations

from typing import NamedTuple

from parlab.pipeline.schedules import Schedule, _place_in_steps, entry_actions
from parlab.pipeline.simulator import Simulation

__all__ = ["SlotCount", "slot_count", "work_percent", "one_action_per_slot", "doubled_steps"]


class SlotCount(NamedTuple):
    """Actions against slots for one simulated schedule.

    ``actions``: forward and backward actions run (2 x stages x micro-batches for a
    one-chunk schedule); ``busy_slots``: (rank, step) pairs with at least one action;
    ``doubled_slots``: those with more than one; ``slots``: ranks x steps.
    """

    actions: int
    busy_slots: int
    doubled_slots: int
    slots: int
    steps: int

    def __str__(self) -> str:
        return (f"{self.actions} actions in {self.busy_slots} busy slots "
                f"({self.doubled_slots} slots hold two actions) of {self.slots} slots "
                f"({self.steps} steps)")


def slot_count(sim: Simulation) -> SlotCount:
    """Count the actions, busy slots and doubled slots of ``sim``."""
    per_slot: dict[tuple[int, int], int] = {}
    for record in sim.records:
        for rank, _ in record.compute:
            per_slot[(record.step, rank)] = per_slot.get((record.step, rank), 0) + 1
    return SlotCount(actions=sum(per_slot.values()), busy_slots=len(per_slot),
                     doubled_slots=sum(1 for n in per_slot.values() if n > 1),
                     slots=sim.schedule.stages * sim.steps, steps=sim.steps)


def doubled_steps(sched: Schedule) -> dict[int, list[int]]:
    """Per rank, the time steps (from 1) in which it runs more than one action."""
    if not isinstance(sched, Schedule):
        raise ValueError(f"doubled_steps needs a Schedule (from parlab.pipeline.schedule or "
                         f"from_order), got {type(sched).__name__}")
    return {rank: [step + 1 for step, entry in enumerate(row) if len(entry_actions(entry)) > 1]
            for rank, row in sched.pipeline_order.items()}


def work_percent(sim: Simulation) -> list[float]:
    """Per step, the actions run as a share of the ranks (100 = one action per rank).

    Where no rank doubles up this equals ``sim.active_percent``; where one does, it is
    higher: the active percentage counts a rank that runs two actions once.
    """
    p = sim.schedule.stages
    return [round(100.0 * len(record.compute) / p, 2) for record in sim.records]


def one_action_per_slot(sched: Schedule) -> Schedule:
    """``sched`` with every doubled step split: each rank runs its actions in the same order,
    one per time step, each as early as its inputs allow.

    A rank's actions inside a doubled entry keep their written order (the book's: the
    forward, then the backward). A schedule without doubled entries comes back with the
    same steps.
    """
    if not isinstance(sched, Schedule):
        raise ValueError(f"one_action_per_slot needs a Schedule (from parlab.pipeline.schedule "
                         f"or from_order), got {type(sched).__name__}")
    programs = {rank: [[a for entry in row for a in entry_actions(entry)]]
                for rank, row in sched.pipeline_order.items()}
    order = _place_in_steps(programs, sched.stages, sched.virtual_stages)
    return Schedule(f"{sched.name}, one action per slot", sched.stages, sched.microbatches,
                    sched.chunks, order, sched.slot_size)
