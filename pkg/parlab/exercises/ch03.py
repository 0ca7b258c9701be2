"""Chapter 03 exercises: predict a schedule's bubble, its memory and its messages before the
notebook prints them, then write a schedule of your own.

Every expected answer is computed by the simulator when the checker runs, never typed in;
a wrong answer gets a hint about which quantity to look at, never the number. The worked
solutions are in :mod:`parlab.exercises.ch03_solutions`, which the notebook does not
import: a reader opens it by choice.
"""

from __future__ import annotations

from parlab.exercises.registry import exercise, number, right, wrong

#: 03.1: GPipe on p stages with m micro-batches: twice the m of the GPipe run printed just
#: before the exercise, so that run (m = p) is a hint, not the answer.
_BUBBLE_P, _BUBBLE_M = 4, 8
#: The m of the chapter's runs and of the Gantt charts (a common wrong answer reuses it).
_RUN_M = 4
#: 03.2: 1F1B with more micro-batches than stages.
_MEMORY_P, _MEMORY_M = 4, 8
#: 03.3: interleaved 1F1B on the toy backend, as section 5 runs it.
_CHUNKS_P, _CHUNKS_M, _CHUNKS_V = 4, 4, 2


def _sim(name, p, m, v=1):
    from parlab.pipeline import schedule, simulate
    return simulate(schedule(name, p, m, v))


def _first_error_step(p: int) -> int:
    """The step in which the first stage can run its first backward: micro-batch 1 goes
    forward through p stages, its error is computed in the step after, and walks back one
    stage per step (the same in every schedule that forwards micro-batch 1 at once)."""
    sim = _sim("gpipe", p, 1)
    return next(r.step for r in sim.records for rank, a in r.compute if rank == 0 and a.kind == "B")


@exercise("03.1", f"GPipe on p={_BUBBLE_P} stages with m={_BUBBLE_M} micro-batches: what "
                  "fraction of all (GPU, time step) slots is idle? Answer as a number "
                  "between 0 and 1.")
def _gpipe_bubble(answer):
    sim = _sim("gpipe", _BUBBLE_P, _BUBBLE_M)
    value = number(answer)
    if abs(value - sim.bubble_fraction) < 5e-3:
        return right("The schedule takes 2(m+p-1) steps and every GPU is busy in 2m of "
                     "them, so every row of the Gantt chart has 2(p-1) empty cells, whatever "
                     "m is: the bubble fraction is (p-1)/(m+p-1). More micro-batches dilute "
                     "the same idle cells.")
    if 1 < value <= 100:
        return wrong("Give a fraction between 0 and 1, not a percentage.")
    if abs(value - sim.bubble_over_ideal) < 5e-3:
        return wrong("That is idle time over busy (ideal) time, the ratio papers often "
                     "quote. What does this question divide the idle slots by?")
    if abs(value - (1 - sim.bubble_fraction)) < 5e-3:
        return wrong("Which slots does your fraction count? The bubble is made of the slots "
                     "in which a GPU waits.")
    if abs(value - _sim("gpipe", _BUBBLE_P, _RUN_M).bubble_fraction) < 5e-3:
        return wrong("That fits the run printed above, with fewer micro-batches. With this "
                     "m, how many time steps does the schedule take, and in how many of them "
                     "is one GPU idle?")
    return wrong("Draw one GPU's row: it runs m forwards and later m backwards. Count the "
                 "time steps of the whole schedule first (when does the last stage start, "
                 "when does the first stage finish?), then that row's empty cells.")


@exercise("03.2", f"1F1B on p={_MEMORY_P} stages with m={_MEMORY_M} micro-batches: at most how "
                  "many micro-batches' activations does the first GPU (A1) hold at the same "
                  "time?")
def _one_f_one_b_memory(answer):
    sim = _sim("1f1b", _MEMORY_P, _MEMORY_M)
    value = number(answer)
    if value == sim.peak_inflight[0]:
        return right("A1 runs only the forwards needed to fill the pipeline, then waits for "
                     "its first error; from then on it alternates one backward (freeing a "
                     "micro-batch) with one forward (adding one), so the count stops growing, "
                     "however large m is.")
    if value == _sim("gpipe", _MEMORY_P, _MEMORY_M).peak_inflight[0]:
        return wrong("That is GPipe, which runs every forward before any backward. In 1F1B, "
                     "when does A1 get its first error back, and what happens after that?")
    if value == sim.peak_inflight[-1]:
        return wrong("That is the last stage, which runs each backward right after its "
                     "forward. A1 is the stage furthest from the loss.")
    if value == _first_error_step(_MEMORY_P) - 1:
        return wrong("That has A1 forwarding in every step until its first error returns. "
                     "1F1B's warm-up stops earlier: a stage runs just enough forwards to fill "
                     "the pipeline from itself to the last stage, then waits. How many does "
                     "that take for A1?")
    return wrong("Write out A1's row of the 1F1B schedule: how many forwards does it run "
                 "before it stops to wait for its first error? From then on A1 alternates one "
                 "backward (which frees a micro-batch) with one forward.")


@exercise("03.3", f"Interleaved 1F1B on p={_CHUNKS_P} GPUs with v={_CHUNKS_V} chunks each and "
                  f"m={_CHUNKS_M} micro-batches: how many messages (activations forward and "
                  "errors back) do the ranks send for one batch?")
def _interleaved_messages(answer):
    sim = _sim("interleaved", _CHUNKS_P, _CHUNKS_M, _CHUNKS_V)
    plain = _sim("1f1b", _CHUNKS_P, _CHUNKS_M)
    value, expected = number(answer), len(sim.transfers)
    if value == expected:
        return right("Every boundary between two chunks is a boundary between two GPUs "
                     "(chunk k lives on GPU k mod p), so each micro-batch crosses p·v - 1 of "
                     "them on the way forward and again on the way back.")
    if value == len(plain.transfers):
        return wrong("That is the count with one chunk per GPU, the book's run of section 4. "
                     "How many chunk boundaries does a micro-batch cross when each GPU holds "
                     "v chunks?")
    if value == expected / 2:
        return wrong("Does your count cover the whole batch's traffic? Which tensors does the "
                     "backward pass send between GPUs, and over which boundaries?")
    if value == len(_sim("interleaved", _CHUNKS_P, 2 * _CHUNKS_M, _CHUNKS_V).transfers):
        return wrong("That counts more micro-batches than this run has. How many messages "
                     "does one micro-batch cause?")
    if value == expected + 2 * _CHUNKS_M:
        return wrong("How many messages does one micro-batch cause on its way through a "
                     "model of two chunks? Of three? Compare that with the number of chunks.")
    return wrong("Count for one micro-batch first: how many chunk boundaries does it cross on "
                 "the way forward, and how many on the way back? Then multiply by the number "
                 "of micro-batches.")


@exercise("03.4", "Write the pipeline_order of GPipe for p=2 stages and m=2 micro-batches: a "
                  "dict {rank: [entry per time step]} with actions such as '0F0' and None for "
                  "an idle step. It must be valid, with one action per GPU and time step, "
                  "and as short as possible.")
def _write_gpipe(answer):
    from parlab.pipeline import from_order, simulate, slot_count
    if not isinstance(answer, dict):
        return wrong("Answer with a dict: {0: [...], 1: [...]}, one list entry per time step.")
    try:
        sim = simulate(from_order(answer))
    except ValueError as exc:
        return wrong(f"The simulator rejects it: {exc}.")
    if sim.schedule.stages != 2 or sim.schedule.microbatches != 2:
        return wrong(f"That schedule has {sim.schedule.stages} stages and "
                     f"{sim.schedule.microbatches} micro-batches; the exercise asks for 2 and 2.")
    for rank in answer:
        kinds = [a.kind for step in range(sim.steps) for a in sim.schedule.actions(rank, step)]
        if "F" in kinds[kinds.index("B"):]:
            return wrong(f"Rank {rank} runs a forward after a backward: that is 1F1B's order. "
                         f"GPipe runs all forwards first.")
    if slot_count(sim).doubled_slots:
        return wrong("A GPU runs one action per time step: a forward and a backward in the "
                     "same step take as long as one after the other, so such a step is two "
                     "steps of work (section 5 splits the book's doubled steps this way). Give "
                     "each entry at most one action.")
    best = _sim("gpipe", 2, 2).steps
    if sim.steps > best:
        return wrong(f"It is valid but takes {sim.steps} time steps; some action could start "
                     f"earlier. An action may run in the step after its input was made.")
    return right(f"A valid GPipe schedule in {sim.steps} time steps; the simulator counts "
                 f"{sim.bubble_fraction:.0%} of its slots idle.")
