"""Chapter 03 exercises: read a pipeline schedule, count its bubble and its memory, write one.

Every expected answer is computed by the simulator when the checker runs, never typed in.
"""

from __future__ import annotations

from parlab.exercises.registry import exercise, right, wrong


def _sim(name, p, m, v=1):
    from parlab.pipeline import schedule, simulate
    return simulate(schedule(name, p, m, v))


@exercise("03.1", "GPipe on p=4 stages with m=12 micro-batches: what fraction of all "
                  "(GPU, time step) slots is idle? Answer as a number between 0 and 1.")
def _gpipe_bubble(answer):
    sim = _sim("gpipe", 4, 12)
    value = float(answer)
    if abs(value - sim.bubble_fraction) < 5e-3:
        return right("Idle slots over all slots: each GPU waits p-1 steps while the pipeline "
                     "fills and p-1 while it drains, out of 2(m+p-1) steps.")
    if abs(value - sim.bubble_over_ideal) < 5e-3:
        return wrong("That is the bubble measured against the ideal time (what papers often "
                     "quote). The question divides idle slots by all slots, busy ones included.")
    if value > 1:
        return wrong("Give a fraction between 0 and 1, not a percentage.")
    return wrong("Draw the Gantt chart (or simulate it): count the time steps, then the idle "
                 "cells of one row; every row has the same number.")


@exercise("03.2", "1F1B on p=4 stages with m=8 micro-batches: at most how many micro-batches' "
                  "activations does the first GPU (A1) hold at the same time?")
def _one_f_one_b_memory(answer):
    sim = _sim("1f1b", 4, 8)
    value = int(answer)
    if value == sim.peak_inflight[0]:
        return right("A1 keeps forwarding until the first error comes back; from then on each "
                     "backward frees one micro-batch for every new forward.")
    if value == _sim("gpipe", 4, 8).peak_inflight[0]:
        return wrong("That is GPipe, which runs every forward before any backward. In 1F1B, "
                     "when does A1 get its first error back, and what happens after that?")
    if value == 1:
        return wrong("That is the last stage, which runs each backward right after its forward. "
                     "A1 is the stage furthest from the loss.")
    return wrong("Count the forwards A1 runs before its first backward, then watch the count "
                 "once forwards and backwards alternate.")


@exercise("03.3", "In the book's schedule (Figures 8-3 to 8-13), in which time step does GPU "
                  "B1 both run a forward and compute an error?")
def _book_overlap(answer):
    sim = _sim("book", 4, 4)
    b1 = sim.names.index("B1")
    both = [r.step for r in sim.records
            if {a.kind for rank, a in r.compute if rank == b1} == {"F", "B"}]
    value = int(answer)
    if value in both:
        return right("B1 runs its last forward then, and E1, which B2 sent at the end of the "
                     "step before, lets it start its first backward in the same step. The "
                     "chapter lists both, but forgets that B1 must then send E1 on to A2.")
    overlaps_b2 = [r.step for r in sim.records
                   if {a.kind for rank, a in r.compute if rank == b1 + 1} == {"F", "B"}]
    if value in overlaps_b2:
        return wrong("In that step the overlap is on B2, the output layer. B1 gets its first "
                     "error one step after B2 computes it.")
    return wrong("Follow E1: B2 computes it one step after its first forward; it reaches B1 in "
                 "that step's communication phase. What is B1 still doing then?")


@exercise("03.4", "Write the pipeline_order of GPipe for p=2 stages and m=2 micro-batches: a "
                  "dict {rank: [entry per time step]} with actions such as '0F0' and None for "
                  "an idle step. It must be valid and as short as possible.")
def _write_gpipe(answer):
    from parlab.pipeline import from_order, simulate
    if not isinstance(answer, dict):
        return wrong("Answer with a dict: {0: [...], 1: [...]}, one list entry per time step.")
    try:
        sim = simulate(from_order(answer))
    except ValueError as exc:
        return wrong(f"The simulator rejects it: {exc}.")
    if sim.schedule.stages != 2 or sim.schedule.microbatches != 2:
        return wrong(f"That schedule has {sim.schedule.stages} stages and "
                     f"{sim.schedule.microbatches} micro-batches; the exercise asks for 2 and 2.")
    for rank, row in answer.items():
        kinds = [a.kind for step in range(sim.steps) for a in sim.schedule.actions(rank, step)]
        if "F" in kinds[kinds.index("B"):]:
            return wrong(f"Rank {rank} runs a forward after a backward: that is 1F1B's order. "
                         f"GPipe runs all forwards first.")
    best = _sim("gpipe", 2, 2).steps
    if sim.steps < best:
        return right(f"Valid, and {best - sim.steps} step(s) shorter than plain GPipe: rank 1 "
                     f"overlaps a forward and a backward in one step, as the book's schedule "
                     f"does.")
    if sim.steps > best:
        return wrong(f"It is valid but takes {sim.steps} time steps; some action could start "
                     f"earlier. An action may run in the step after its input was made.")
    return right(f"A valid GPipe schedule in {sim.steps} time steps; the simulator counts "
                 f"{sim.bubble_fraction:.0%} of its slots idle.")
