"""The planner's verdict in words: what a layout is, where it runs, what fills its step, and
why the alternatives lost.

Why a module of its own: a table of step times says *which* layout wins; a reader wants to
know *why*, in the terms of the chapter (NVLink, rails, bubbles, memory). Every number in the
text is read from the layout or from the search that produced it, never typed in.
"""

from __future__ import annotations

from parlab.units import format_bytes
from parlab import memory

__all__ = ["explain", "LINK_WORDS", "PART_WORDS"]

#: How the text names each link type.
LINK_WORDS = {"nvlink": "NVLink inside a server", "rail": "a single rail switch",
              "spine": "the spine (rail -> spine -> rail)"}


def _seconds(x: float) -> str:
    return f"{x:.3g} s"


def _plural(n: int, word: str, suffix: str = "s") -> str:
    return f"{n:,} {word}{suffix if n != 1 else ''}"


def _layers(counts) -> str:
    """``[2, 2, 1]`` as "1 to 2 layers"; equal counts as "2 layers"."""
    low, high = min(counts), max(counts)
    return _plural(high, "layer") if low == high else f"{low} to {high} layers"


def _shape(lay) -> str:
    parts = []
    a = lay.assumptions
    if lay.pp > 1:
        per_rank = memory.rank_layers(lay.config.n_layers, lay.pp, a.schedule,
                                      a.virtual_stages, a.stage_layers)
    if lay.pp > 1 and a.schedule in memory.V_SCHEDULES:
        parts.append(f"cut into {2 * lay.pp} chunks in a V over {lay.pp} pipeline ranks, "
                     f"{_layers(per_rank)} per rank")
    elif lay.pp > 1:
        parts.append(f"cut into {lay.pp} pipeline stages of {_layers(per_rank)}")
    if lay.tp > 1:
        parts.append(f"with every layer's matrices split over {lay.tp} GPUs")
    copies = f"{lay.dp} replicas of {lay.config.name}" if lay.dp > 1 else lay.config.name
    each = ", each " if lay.dp > 1 else ", "
    how = each + " and ".join(parts) if parts else each + "whole on one GPU"
    return (f"{lay.name}: {copies}{how}; every replica runs "
            f"{_plural(lay.microbatches, 'micro-batch', 'es')} of "
            f"{_plural(lay.micro_batch, 'sequence')}.")


def _placement(lay) -> str:
    links = lay.links
    parts = []
    if links["tensor"]:
        parts.append(f"each tensor-parallel group of {lay.tp} sits in one server, so the four "
                     f"all-reduces per block and micro-batch use {LINK_WORDS[links['tensor']]}")
    if links["pipeline"] == "nvlink":
        parts.append("consecutive stages share a server, so activations and their gradients "
                     "move over NVLink")
    elif links["pipeline"]:
        parts.append(f"consecutive stages sit on consecutive servers at the same GPU position, "
                     f"so activations and their gradients cross (at worst) "
                     f"{LINK_WORDS[links['pipeline']]}")
    if links["data"]:
        who = f"{lay.dp} copies of a stage" if lay.pp > 1 else f"{lay.dp} replicas"
        parts.append(f"the {who} all-reduce their gradients through (at worst) "
                     f"{LINK_WORDS[links['data']]}")
    return ("Placement: " + "; ".join(parts) + ".") if parts else "Placement: one GPU."


def _memory(lay) -> str:
    m = lay.memory
    state = m.parameters + m.gradients + m.optimizer_state + m.master_weights
    schedule = lay.assumptions.schedule
    flight = _plural(lay.microbatches if schedule == "gpipe" else min(lay.pp, lay.microbatches),
                     "micro-batch", "es")
    if schedule in memory.V_SCHEDULES:  # rank 0's two chunks, counted in (chunk, micro-batch)
        pairs = max(d + u for d, u in memory.v_in_flight(schedule, lay.pp, lay.microbatches, 0))
        flight = f"{pairs} (chunk, micro-batch) pairs"
    kept = f" ({lay.recompute} recomputation)" if lay.recompute else ""
    return (f"Memory: the busiest GPU holds {format_bytes(m.total)} of "
            f"{format_bytes(m.capacity)} ({100 * m.total / m.capacity:.0f} %): "
            f"{format_bytes(state)} of weights, gradients and optimizer state, and "
            f"{format_bytes(m.activations)} of activations for "
            f"{flight} in flight{kept}.")


#: How the text names each part of a step.
PART_WORDS = {"compute": "compute", "recompute": "recomputation", "bubble": "pipeline bubble",
              "tensor": "tensor-parallel all-reduces", "pipeline": "pipeline sends",
              "data": "gradient all-reduce"}


def _time(lay) -> str:
    t, total = lay.times, lay.step_time_s
    parts = [f"{PART_WORDS[k]} {_seconds(v)} ({100 * v / total:.0f} %)" for k, v in t.items()
             if v > 0]
    formula = ("(pp-1)/(m+pp-1)" if lay.assumptions.schedule in ("1f1b", "gpipe")
               else f"{lay.assumptions.schedule}'s, with F = B = W,")
    bubble = (f" The bubble fraction is {formula} = {lay.bubble_fraction:.3f}."
              if lay.pp > 1 else "")
    tokens = lay.micro_batch * lay.assumptions.sequence(lay.config)
    roofline = (f" A micro-batch of {tokens:,} tokens runs the weight products at "
                f"{100 * lay.efficiency:.0f} % of their compute-bound speed (roofline).")
    return (f"Time: a step takes {_seconds(total)}: " + ", ".join(parts) + "." + bubble
            + roofline + f" The GPUs reach {100 * lay.achieved_mfu:.1f} % of their peak.")


def _runner_up(lay, search) -> str:
    best = search.best_per_degrees()
    others = [o for key, o in best.items() if key != (lay.dp, lay.tp, lay.pp)]
    if not others:
        return "No other choice of degrees fits."
    other = others[0]
    diff = {k: other.times[k] - lay.times[k] for k in lay.times}
    worst = max(diff, key=diff.get)
    slower = other.step_time_s - lay.step_time_s
    if slower <= 0:
        return f"The next degrees, {other.name}, are as fast ({_seconds(other.step_time_s)})."
    return (f"The best other degrees, {other.name}, take {_seconds(other.step_time_s)} "
            f"({100 * slower / lay.step_time_s:+.1f} %), mostly in {worst} time: "
            f"{_seconds(other.times[worst])} against {_seconds(lay.times[worst])}.")


def _less_model_parallel(lay, search) -> str:
    width = lay.tp * lay.pp
    fitting = [o for o in search.ranked if o.tp * o.pp < width]
    if fitting:
        o = fitting[0]
        return (f"Fewer GPUs per model copy would fit ({o.name}) but be slower: "
                f"{_seconds(o.step_time_s)}.")
    tried = [o.memory for o in search.layouts if o.tp * o.pp < width]
    tried += [r.memory for r in search.rejected if r.memory is not None and r.tp * r.pp < width]
    if not tried:
        return ""
    smallest = min(tried, key=lambda b: b.total)
    pure = [r for r in search.rejected if r.tp == r.pp == 1 and r.memory is not None]
    text = (f"Nothing with fewer than {width} GPUs per model copy fits: the smallest footprint "
            f"among them is {format_bytes(smallest.total)} per GPU.")
    if pure:
        text += (f" Pure data parallelism would need {format_bytes(pure[0].memory.total)} on "
                 f"every GPU.")
    return text


def explain(lay) -> str:
    """A few sentences on ``lay`` (a :class:`parlab.planner.Layout`)."""
    if not all(hasattr(lay, a) for a in ("pp", "memory", "times", "fits")):
        raise TypeError(f"lay must be a Layout (from parlab.hybrid.plan or evaluate), "
                        f"got {type(lay).__name__}")
    lines = [_shape(lay), _placement(lay), _memory(lay), _time(lay)]
    if not lay.fits:
        lines.append("It does not fit, so the planner does not rank it.")
    search = lay.context
    if search is not None and lay.fits:
        lines.append(_runner_up(lay, search))
        less = _less_model_parallel(lay, search)
        if less:
            lines.append(less)
    return "\n".join(lines)
