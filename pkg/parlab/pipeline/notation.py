"""The chapter's words for a schedule: the labels of its steps, actions and transfers.

Why: the notebook shows each time step the way Figures 8-3 to 8-13 do (GPU names A1,
A2, B1, B2; micro-batches x1..x4 counted from 1; activations y_i, errors E_i, gradients
G_i), while the package counts from 0 like PyTorch. The labels are made here, in one
place. The short code of an action (:func:`action_code`) is ``F1`` for the forward pass of
x1 and ``E1`` for its backward pass (error E1 and gradient G1): never ``B1``, which is a
GPU's name. PyTorch's stage-qualified strings (``2F0``, ``2B0``) stay as they are.

The chapter's own step lists, and the slips found in them, are chapter 03's experiment
(:mod:`parlab.experiments`).
"""

from __future__ import annotations

__all__ = ["action_code", "ACTION_CODES", "compute_label", "transfer_label", "describe_step"]


def _chunk(sim, stage: int) -> str:
    return f" (chunk {stage // sim.schedule.stages + 1})" if sim.schedule.chunks > 1 else ""


#: The letter of each action kind in the short code: F forward, E backward (the book's
#: backward step computes the error E_i and the gradient G_i). Not B: B1 is a GPU. A split
#: backward (chapter 09, whose ranks have no GPU names) is Qi et al.'s B (the input gradient,
#: PyTorch's code "I") and W (the weight gradient): B1 + W1 is E1.
ACTION_CODES = {"F": "F", "B": "E", "I": "B", "W": "W"}


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
