"""Chapter 03's experiments: the book's step lists against the simulator, and its figures.

``BOOK_STEPS`` is what the chapter's text lists for each of its 11 steps, transcribed as
data. It is used for one thing only: :func:`errata` compares it with the simulated
table, so the notebook can say where the text slips, found by computation rather than
by hand. The figure recipes (Figures 8-3 to 8-14, the schedules compared) simulate or run
a schedule here, then hand the result to :mod:`parlab.viz.plots`, which only draws.
"""

from __future__ import annotations

from typing import NamedTuple

from parlab.hybrid import pipeline_data_parallel
from parlab.pipeline import action_code, schedule, simulate, tradeoffs, transfer_label
from parlab.viz import figure
from parlab.viz.plots import comparison_figure, gantt_figure, step_figure, sync_figure

__all__ = ["BOOK_STEPS", "BOOK_ACTIVE_PERCENT", "Erratum", "errata", "book_lists"]


class BookStep(NamedTuple):
    compute: tuple[str, ...]        # "A1 F1": GPU, then action_code (F forward, E error + gradient)
    communication: tuple[str, ...]  # "y1 A1->A2" as in transfer_label
    active_percent: float


#: The chapter's lists for time steps 1-11, as printed (slips included).
BOOK_STEPS = (
    BookStep(("A1 F1",), ("y1 A1->A2",), 25),
    BookStep(("A1 F2", "A2 F1"), ("y2 A1->A2", "y1 A2->B3"), 50),
    BookStep(("A1 F3", "A2 F2", "B1 F1"), ("y3 A1->A2", "y2 A2->B1", "y1 B1->B2"), 75),
    BookStep(("A1 F4", "A2 F3", "B1 F2", "B2 F1"), ("y3 A1->A2", "y2 A2->B1", "y1 B1->B2"), 100),
    BookStep(("A2 F4", "B1 F3", "B2 F2", "B2 E1"), ("y4 A2->B1", "y3 B1->B2", "E1 B2->B1"), 75),
    BookStep(("B1 F4", "B2 F3", "B2 E2", "B1 E1"), ("y4 B1->B2", "E2 B2->B1"), 50),
    BookStep(("B2 F4", "B2 E3", "B1 E2", "A2 E1"), ("E3 B2->B1", "E2 B1->A2", "E1 A2->A1"), 75),
    BookStep(("B2 E4", "B1 E3", "A2 E2", "A1 E1"), ("E4 B2->B1", "E3 B1->A2", "E2 A2->A1"), 100),
    BookStep(("B1 E4", "A2 E3", "A1 E2"), ("E4 B1->A2", "E3 A2->A1"), 75),
    BookStep(("A2 E4", "A1 E3"), ("E4 A2->A1",), 50),
    BookStep(("A1 E4",), (), 25),
)
BOOK_ACTIVE_PERCENT = [s.active_percent for s in BOOK_STEPS]


def book_lists(sim) -> list[BookStep]:
    """The simulated table in the form of :data:`BOOK_STEPS` (in rank order, A1 first)."""
    out = []
    for record in sim.records:
        compute = tuple(f"{sim.names[r]} {action_code(a)}" for r, a in record.compute)
        sends = tuple(transfer_label(sim, t) for t in record.transfers)
        out.append(BookStep(compute, sends, record.active_percent))
    return out


class Erratum(NamedTuple):
    step: int
    what: str          # "computing", "communication" or "active GPUs"
    book_only: tuple   # listed by the book, not by the simulation
    computed_only: tuple  # found by the simulation, missing from the book

    def __str__(self) -> str:
        parts = []
        if self.book_only:
            parts.append(f"the text lists {', '.join(self.book_only)}")
        if self.computed_only:
            parts.append(f"the schedule needs {', '.join(self.computed_only)}")
        return f"step {self.step}, {self.what}: " + "; ".join(parts)


def errata(sim) -> list[Erratum]:
    """Where the chapter's step lists differ from the simulated book schedule."""
    ours = book_lists(sim)
    if len(ours) != len(BOOK_STEPS):
        raise ValueError(f"the book's table has {len(BOOK_STEPS)} steps; this schedule has "
                         f"{len(ours)} (simulate schedule('book', 4, 4))")
    found = []
    for step, (book, computed) in enumerate(zip(BOOK_STEPS, ours), start=1):
        for what, b, c in (("computing", book.compute, computed.compute),
                           ("communication", book.communication, computed.communication),
                           ("active GPUs", (f"{book.active_percent:g}%",),
                            (f"{computed.active_percent:g}%",))):
            b_only = tuple(x for x in b if x not in c)
            c_only = tuple(x for x in c if x not in b)
            if b_only or c_only:
                found.append(Erratum(step, what, b_only, c_only))
    return found


# --------------------------------------------------------------------------- figure recipes


def _book_simulation():
    return simulate(schedule("book", stages=4, microbatches=4))


def _register_steps():
    for step in range(1, 12):
        def make(step=step):
            return step_figure(_book_simulation(), step)
        figure(f"fig-8-{step + 2:02d}-pipeline-step-{step}",
               f"Figure 8-{step + 2}: the book's schedule, time step {step}")(make)


_register_steps()


@figure("fig-8-14-pipeline-data-sync", "Figure 8-14: two 4-stage pipeline replicas on 8 GPUs, "
                                      "gradients synced")
def _sync():
    return sync_figure(pipeline_data_parallel(schedule("book", stages=4, microbatches=2), 2))


@figure("fig-03-schedule-comparison", "Naive, GPipe, 1F1B, interleaved: bubble, memory, traffic")
def _comparison():
    return comparison_figure(tradeoffs())


@figure("fig-03-schedule-gantt", "Gantt charts of the book's schedule, GPipe, 1F1B, interleaved")
def _gantt():
    return gantt_figure([simulate(schedule(name, 4, 4, 2 if name == "interleaved" else 1))
                         for name in ("book", "gpipe", "1f1b", "interleaved")])
