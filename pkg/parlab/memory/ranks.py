"""Every pipeline rank's memory, not only the busiest one's.

Why this module exists: :func:`parlab.memory.estimate` returns the busiest GPU, which is
what decides whether a job fits; a chapter comparing schedules also wants to see where the
memory sits, for instance on rank 0 of a V, which holds both ends of the model.
"""

from __future__ import annotations

from parlab.hardware import GPU_MEMORY_GB
from parlab.memory.breakdown import Breakdown, describe_setup
from parlab.memory.calculator import rank_breakdowns
from parlab.memory.setup import resolve_setup
from parlab.memory.decoders import DECODERS
from parlab.models import BookMLP

__all__ = ["estimate_ranks"]


def estimate_ranks(model, input_shape, optimizer: str = "adam", precision: str = "fp32",
                   dp: int = 1, tp: int = 1, pp: int = 1, microbatches: int = 1,
                   schedule: str = "1f1b", gpu_memory_gb: float = GPU_MEMORY_GB,
                   zero: int = 0, recompute: str | None = None, *, cp: int = 1,
                   cp_method: str = "ring", sequence_parallel: bool = False,
                   stage_layers=None) -> list[Breakdown]:
    """:func:`parlab.memory.estimate`'s breakdown for every pipeline rank, in rank order: per
    stage (labelled ", stage k"), or for ZBV and DualPipeV per rank of the V (labelled
    ", rank r (chunks r and 2pp-1-r)"). A transformer config or a BookMLP; the busiest of
    them is what ``estimate`` returns. ``stage_layers``: the layers of each stage, as in
    :func:`parlab.memory.estimate`."""
    s = resolve_setup(model, input_shape, optimizer, precision, dp, tp, pp, microbatches,
                      schedule, gpu_memory_gb, zero, recompute, cp=cp, cp_method=cp_method,
                      sequence_parallel=sequence_parallel, stage_layers=stage_layers)
    if not isinstance(s.model, (*DECODERS, BookMLP)):
        raise ValueError(f"estimate_ranks prices a transformer config or a BookMLP, got "
                         f"{type(s.model).__name__}; estimate() takes a torch.nn.Module")
    return rank_breakdowns(s, describe_setup(s, "estimate per GPU"))
