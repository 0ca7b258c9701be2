"""How many layers each pipeline stage holds: even as possible, or as the user says.

Why this module exists: a pipeline cannot always give every stage the same number of
layers. Llama-3-8B's 32 layers on 3 stages, or GPT-3's 96 on 5, do not divide; and real runs
move layers off the first and last stages on purpose, to leave room (and time) for the
embedding and the output layer: Megatron-LM's ``--decoder-first-pipeline-num-layers`` and
``--decoder-last-pipeline-num-layers`` (``megatron/training/arguments.py``) set the first and
last stage's counts and spread the rest evenly over the middle ones. The estimate
(:func:`parlab.memory.estimate`), the planner (:mod:`parlab.hybrid`) and the pipeline's own
split (:func:`parlab.pipeline.split_layers`) read one rule from here:

- ``stage_layers=None``: :func:`layer_counts`, as even as possible,
  the extra layers on the first stages (32 on 3: 11, 11, 10);
- ``stage_layers=(c_0, ..., c_{pp-1})``: stage k holds c_k consecutive transformer blocks
  (the embedding rides with stage 0, the head with the last, as Megatron places them); the
  counts must be pp positive integers summing to the model's layers
  (:func:`check_stage_layers`).

A pipeline runs at its slowest stage's pace: every micro-batch passes every stage, so in the
steady state a stage that holds more layers sets the time of each slot. :func:`rank_layers`
gives each pipeline rank's layers (in a V, a rank's two chunks together), and the planner's
step model prices a slot with the largest of them.
"""

from __future__ import annotations

__all__ = ["V_SCHEDULES", "layer_counts", "check_stage_layers", "stage_layer_counts",
           "rank_layers"]

#: The schedules that place two chunks per rank in a V (:mod:`parlab.memory.vshape`).
V_SCHEDULES = ("zbv", "dualpipev")


def layer_counts(n: int, parts: int) -> list[int]:
    """n layers over ``parts`` stages as evenly as possible, the extra ones first."""
    whole, extra = divmod(n, parts)
    return [whole + 1] * extra + [whole] * (parts - extra)


def check_stage_layers(stage_layers, layers: int, pp: int, what: str = "the model") -> tuple | None:
    """``stage_layers`` as a tuple if it splits ``layers`` layers over ``pp`` stages (pp
    positive ints summing to ``layers``), None if it is None; else a ValueError naming the
    values and what is valid."""
    if stage_layers is None:
        return None
    counts = tuple(stage_layers) if isinstance(stage_layers, (tuple, list)) else None
    if not counts or any(isinstance(c, bool) or not isinstance(c, int) for c in counts):
        raise ValueError(f"stage_layers must be a tuple of pp={pp} ints, the layers of each "
                         f"pipeline stage, got {stage_layers!r}")
    if len(counts) != pp:
        raise ValueError(f"stage_layers={list(counts)} gives {len(counts)} stage(s) but "
                         f"pp={pp}; give one count per stage")
    if min(counts) < 1:
        raise ValueError(f"stage_layers={list(counts)}: every stage needs at least one layer "
                         f"(counts >= 1)")
    if sum(counts) != layers:
        raise ValueError(f"stage_layers={list(counts)} sums to {sum(counts)}, but {what} "
                         f"has {layers} layers; the counts must add up to {layers}")
    return counts


def stage_layer_counts(layers: int, pp: int, stage_layers=None) -> list[int]:
    """Layers of each of ``pp`` stages: ``stage_layers`` (checked), or as even as possible
    with the extra layers first."""
    counts = check_stage_layers(stage_layers, layers, pp)
    return list(counts) if counts else layer_counts(layers, pp)


def rank_layers(layers: int, pp: int, schedule: str = "1f1b", virtual_stages: int = 1,
                stage_layers=None) -> list[int]:
    """The layers each of ``pp`` pipeline ranks runs per micro-batch: its stage's, or in a V
    (ZBV, DualPipeV: 2 pp chunks, rank r holding chunks r and 2 pp - 1 - r) its two chunks'
    together; interleaved 1F1B's v chunks per rank are equal (the layers divide by pp x v)."""
    if schedule in V_SCHEDULES:
        if stage_layers is not None:
            raise ValueError(f"stage_layers={stage_layers!r} sets one chunk per rank; "
                             f"schedule={schedule!r} cuts 2 x pp chunks (use stage_layers=None)")
        chunks = layer_counts(layers, 2 * pp)
        return [chunks[r] + chunks[2 * pp - 1 - r] for r in range(pp)]
    if virtual_stages != 1 and stage_layers is not None:
        raise ValueError(f"stage_layers={stage_layers!r} sets one chunk per rank; "
                         f"virtual_stages={virtual_stages} cuts each rank's layers into equal "
                         f"chunks (use stage_layers=None)")
    return stage_layer_counts(layers, pp, stage_layers)
