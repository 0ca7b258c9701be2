"""The chapter's words for a schedule, and what its step lists say, to find their slips.

Why: the notebook shows each time step the way Figures 8-3 to 8-13 do (GPU names A1,
A2, B1, B2; micro-batches x1..x4 counted from 1; activations y_i, errors E_i, gradients
G_i), while the package counts from 0 like PyTorch. The labels are made here, in one
place. The short code of an action (:func:`action_code`) is ``F1`` for the forward pass of
x1 and ``E1`` for its backward pass (error E1 and gradient G1): never ``B1``, which is a
GPU's name. PyTorch's stage-qualified strings (``2F0``, ``2B0``) stay as they are.

``BOOK_STEPS`` is what the chapter's text lists for each of its 11 steps, transcribed as
data. It is used for one thing only: :func:`errata` compares it with the simulated
table, so the notebook can say where the text slips, found by computation rather than
by hand.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["action_code", "ACTION_CODES", "compute_label", "transfer_label", "describe_step",
           "BOOK_STEPS", "BOOK_ACTIVE_PERCENT", "Erratum", "errata", "book_lists"]


def _chunk(sim, stage: int) -> str:
    return f" (chunk {stage // sim.schedule.stages + 1})" if sim.schedule.chunks > 1 else ""


#: The letter of each action kind in the short code: F forward, E backward (the book's
#: backward step computes the error E_i and the gradient G_i). Not B: B1 is a GPU.
ACTION_CODES = {"F": "F", "B": "E"}


def action_code(action, sim=None) -> str:
    """``F1`` / ``E1``: the short code of ``action`` (micro-batch from 1), the one notation
    of the step table, the Gantt chart and the trace timeline. With an interleaved ``sim``
    a ``c2`` names the model chunk."""
    chunk = (f"c{action.stage // sim.schedule.stages + 1}"
             if sim is not None and sim.schedule.chunks > 1 else "")
    return f"{ACTION_CODES[action.kind]}{action.microbatch + 1}{chunk}"


def compute_label(sim, action, short: bool = False) -> str:
    """What a rank computes for ``action``, in the book's terms (micro-batches from 1)."""
    i = action.microbatch + 1
    first, last = action.stage == 0, action.stage == sim.schedule.virtual_stages - 1
    if short:
        return action_code(action, sim)
    if action.kind == "F":
        source = f"x{i}" if first else f"y{i}"
        result = f"model output {i}" if last else f"y{i}"
        return f"forward: {source} -> {result}{_chunk(sim, action.stage)}"
    return f"backward: error E{i} and gradient G{i}{_chunk(sim, action.stage)}"


def transfer_label(sim, transfer) -> str:
    """``y1 A1->A2``: the tensor (micro-batch from 1), from which GPU to which."""
    return (f"{transfer.kind}{transfer.microbatch + 1} "
            f"{sim.names[transfer.src]}->{sim.names[transfer.dst]}")


def describe_step(sim, step: int) -> str:
    """One time step as the chapter lists it: computing, communication, active GPUs."""
    if not 1 <= step <= sim.steps:
        raise ValueError(f"step must be 1 to {sim.steps} for this schedule, got {step}")
    record = sim.records[step - 1]
    lines = [f"Time step {step} of {sim.steps}", "  Computing:"]
    lines += [f"    {sim.names[r]}  {compute_label(sim, a)}" for r, a in record.compute]
    lines += ["    (nothing)"] if not record.compute else []
    lines.append("  Communication:")
    lines += [f"    {sim.names[t.src]} sends {'activation' if t.kind == 'y' else 'error'} "
              f"{t.kind}{t.microbatch + 1} to {sim.names[t.dst]}" for t in record.transfers]
    lines += ["    (nothing)"] if not record.transfers else []
    names = ", ".join(sim.names[r] for r in record.active) or "none"
    lines.append(f"  Active GPUs: {names} ({record.active_percent:g}% active)")
    return "\n".join(lines)


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
