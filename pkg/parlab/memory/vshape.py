"""Which layers and parameters a pipeline GPU holds; the V schedules' memory per rank.

Why this module exists: :func:`held_parameters` applies the estimate's rule for cutting a
model into pipeline stages (:mod:`parlab.memory.stages`: even as possible, or the user's
``stage_layers``). A V placement (Qi et al. 2024 §6; DeepSeek's
DualPipeV) cuts the model into 2 pp chunks and gives rank r two of them, r and 2 pp - 1 - r,
so rank 0 holds both ends of the model: the embedding (chunk 0) and the output layer with
the loss (chunk 2 pp - 1). A per-stage count (1F1B's stage k holds min(pp - k, m)
micro-batches) no longer describes a GPU; this module counts per rank, chunk by chunk, and
:func:`parlab.memory.estimate` prices every rank with it.

Layers go to chunks by the estimate's usual rule (as evenly as possible, the extra ones
first), so when pp divides the layers every rank holds the same number of blocks (chunk r
takes an extra one exactly when chunk 2 pp - 1 - r does not).

Release rule (as for ZB-H1): a (chunk, micro-batch) pair holds its whole activations from
its forward F until its weight gradient W (or until its full backward, where the schedule
runs B and W as one pass). Counted so, on m micro-batches, rank r holds at most

- **ZBV**: (min(2pp - 1 - r, m), min(r + 1, m)) pairs of its (first, second) chunk, or
  (min(2pp - r, m), min(r, m)): the peak of any weighted sum a d + b u of the two counts
  is at one of these two points; unweighted, 2 pp pairs from m = 2 pp - 1 on.
- **DualPipeV** (m >= 2 pp): (2pp - r, r + 1), one point: 2 pp + 1 pairs, the F of an
  F&B pair that runs before its backward frees a micro-batch (DeepSeek's "PP + 1", PP = 2 pp).

The tests hold these to the event-driven simulator, :func:`parlab.pipeline.timeline`, which
walks each rank's actions (``Timeline.peak_inflight`` and a chunk-weighted walk).
"""

from __future__ import annotations

from typing import Callable

from parlab.memory.breakdown import Breakdown, Setup
from parlab.memory.decoders import stage_parameters
from parlab.memory.stages import layer_counts, stage_layer_counts, V_SCHEDULES
from parlab.memory.states import model_state_bytes
from parlab.models import BookMLP

__all__ = ["V_SCHEDULES", "layer_counts", "held_parameters", "v_chunks", "v_parameters",
           "v_in_flight", "v_problem", "fewest_microbatches", "v_breakdowns"]



def held_parameters(s: Setup, stage: int) -> int:
    """Parameters one GPU of pipeline ``stage`` holds (Megatron's tensor-parallel layout)."""
    m, t, last = s.model, s.tp, stage == s.pp - 1
    if isinstance(m, BookMLP):
        counts = stage_layer_counts(len(m.layers), s.pp, s.stage_layers)
        first = sum(counts[:stage])
        layers = m.layers[first:first + counts[stage]]
        return sum(layer.W.numel() + layer.b.numel() for layer in layers)
    counts = stage_layer_counts(m.n_layers, s.pp, s.stage_layers)
    return stage_parameters(m, t, counts[stage], stage == 0, last, s.pp)


def v_parameters(s: Setup, rank: int) -> int:
    """Parameters one GPU of ``rank`` holds in a V: its two chunks of 2 pp. Rank 0 holds both
    ends, so a tied embedding is one tensor there (pp=1's rule), not a copy."""
    chunks = v_chunks(rank, s.pp)
    if isinstance(s.model, BookMLP):
        return sum(held_parameters(s._replace(pp=2 * s.pp), k) for k in chunks)
    counts = layer_counts(s.model.n_layers, 2 * s.pp)
    return stage_parameters(s.model, s.tp, sum(counts[k] for k in chunks), rank == 0, rank == 0,
                            1)


def v_chunks(rank: int, pp: int) -> tuple[int, int]:
    """The chunks (of 2 pp) that rank ``rank`` holds in a V: r and 2 pp - 1 - r."""
    return rank, 2 * pp - 1 - rank


def fewest_microbatches(schedule: str, pp: int) -> int:
    """The fewest micro-batches ``schedule`` runs on ``pp`` ranks: 2 pp for DualPipeV (its
    first phases start 2 pp forwards on the last rank), else 1."""
    return 2 * pp if schedule == "dualpipev" else 1


def v_problem(schedule: str, pp: int, microbatches: int, layers: int) -> str:
    """Why ``schedule`` cannot run a model of ``layers`` layers on ``pp`` ranks with
    ``microbatches`` micro-batches, or '' when it can (or is not a V schedule)."""
    if schedule not in V_SCHEDULES:
        return ""
    if 2 * pp > layers:
        return (f"schedule={schedule!r} cuts the model into 2 x pp = {2 * pp} chunks, more "
                f"than its {layers} layers; use pp <= {layers // 2}")
    fewest = fewest_microbatches(schedule, pp)
    if microbatches < fewest:
        return (f"schedule={schedule!r} needs at least 2 x pp = {fewest} micro-batches on "
                f"pp={pp} ranks, got microbatches={microbatches}")
    return ""


def v_in_flight(schedule: str, pp: int, microbatches: int, rank: int) -> list[tuple[int, int]]:
    """The (pairs of chunk r, pairs of chunk 2pp - 1 - r) that rank ``rank`` holds at the
    points where any weighted sum of the two counts peaks (module docstring): the rank's
    peak activations are the largest of a d + b u over them, a and b its chunks' bytes."""
    m, r = microbatches, rank
    if schedule == "zbv":
        return [(min(2 * pp - 1 - r, m), min(r + 1, m)), (min(2 * pp - r, m), min(r, m))]
    if schedule == "dualpipev":
        return [(2 * pp - r, r + 1)]
    raise ValueError(f"not a V schedule: {schedule!r}; choose one of {list(V_SCHEDULES)}")


def v_breakdowns(s: Setup, label: str, chunk: Callable[[int], tuple[int, int]],
                 parameters: Callable[[int], int]) -> list[Breakdown]:
    """Every rank's :class:`Breakdown` of job ``s`` (a V schedule), labelled with its rank
    and chunks: the model states of ``parameters(rank)`` and the peak of its two chunks'
    activations, ``chunk(k)`` giving chunk k's (kept, rebuilt) bytes per micro-batch (one
    layer rebuilt at a time, the larger of the two chunks')."""
    out = []
    for r in range(s.pp):
        first, second = (chunk(k) for k in v_chunks(r, s.pp))
        held = max(d * first[0] + u * second[0]
                   for d, u in v_in_flight(s.schedule, s.pp, s.microbatches, r))
        states = model_state_bytes(parameters(r), s.optimizer, s.precision.name, s.dp * s.cp,
                                   s.zero)
        out.append(Breakdown(**states.parts(), activations=held + max(first[1], second[1]),
                             capacity=s.capacity,
                             label=f"{label}, rank {r} (chunks {r} and {2 * s.pp - 1 - r})"))
    return out
