"""What an estimate or a measurement returns, and the checked description of the job it is for.

Why this module exists: :mod:`parlab.memory.calculator` (the formulas for transformer configs
and MLPs), :mod:`parlab.memory.modules` (any ``torch.nn.Module``, traced) and
:mod:`parlab.memory.measurement` (a real step) all return a :class:`Breakdown` for a
:class:`Setup`; the three share these definitions from one module below them, so none of them
imports another in a circle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from numbers import Real
from typing import Any, Callable, NamedTuple

from parlab.hardware import GPU_MEMORY_GB
from parlab.memory.states import Precision
from parlab.units import GB, format_bytes

__all__ = ["ESTIMATED_SCHEDULES", "Breakdown", "Plan", "Setup", "check_capacity",
           "check_schedule", "describe_setup"]

#: The schedules whose activations the estimate counts. Micro-batches stage k holds at once:
#: GPipe all m, 1F1B min(pp - k, m), ZB-H1 (Qi et al. 2024; chapter 09) min(pp, m) on every
#: stage, its first stage's as 1F1B's, the later ones holding back W's whose activations
#: stay (counted whole, as chapter 09's executor keeps them until W). ZBV and DualPipeV put
#: two chunks on each rank in a V and are counted per rank (:mod:`parlab.memory.vshape`).
ESTIMATED_SCHEDULES = ("1f1b", "gpipe", "zb-h1", "zbv", "dualpipev")


@dataclass(frozen=True)
class Breakdown:
    """Bytes per part of what one GPU holds while training; ``total`` adds them up."""

    parameters: int
    gradients: int
    optimizer_state: int
    master_weights: int
    activations: int
    other: int = 0          # measured on a GPU only: the transient rest of the peak
    capacity: int = GPU_MEMORY_GB * GB
    label: str = ""

    @property
    def total(self) -> int:
        return sum(self.parts().values())

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def parts(self) -> dict[str, int]:
        """Part name -> bytes, in the order of a stacked bar."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("capacity", "label")}

    def table(self) -> str:
        """A fixed-width table: each part, its size and its share, the total and the capacity."""
        total = self.total or 1
        lines = [self.label] if self.label else []
        lines += [f"{name.replace('_', ' '):<16} {format_bytes(n):>10} {100 * n / total:5.1f} %"
                  for name, n in self.parts().items() if n or name != "other"]
        verdict = "fits" if self.fits else f"does not fit ({self.total / self.capacity:.3g}x)"
        lines += [f"{'total':<16} {format_bytes(self.total):>10}",
                  f"{'GPU capacity':<16} {format_bytes(self.capacity):>10}  {verdict}"]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


@dataclass(frozen=True)
class Plan:
    """The fewest GPUs found for a job: the split and what the busiest GPU then holds."""

    gpus: int
    dp: int
    tp: int
    pp: int
    breakdown: Breakdown
    ideal: int  # ceil(everything on one GPU / capacity): a lower bound no split can beat

    def __str__(self) -> str:
        gpus = "1 GPU" if self.gpus == 1 else f"{self.gpus} GPUs"
        return (f"at least {gpus} (data {self.dp} x tensor {self.tp} x pipeline "
                f"{self.pp}); a perfect even split would need {self.ideal}")


class Setup(NamedTuple):
    """One checked job. ``model`` is a TransformerConfig or LlamaConfig, a BookMLP or a
    torch.nn.Module; for a module, ``seq`` is 1, ``inputs`` the global batch's inputs
    (:mod:`parlab.memory.modules`), ``loss_fn`` the loss (None: the default) and
    ``split_points`` the pipeline's cuts."""

    model: Any
    batch: int
    seq: int
    precision: Precision
    optimizer: str
    dp: int
    tp: int
    pp: int
    microbatches: int
    schedule: str
    capacity: int
    zero: int = 0
    recompute: str | None = None
    inputs: tuple = ()
    loss_fn: Callable | None = None
    split_points: tuple[int, ...] | None = None
    ep: int = 1                  # expert parallelism: each MoE layer's experts over ep GPUs
    cp: int = 1                  # context parallelism: each sequence's tokens over cp GPUs
    cp_method: str = "ring"      # how attention sees the other ranks' tokens (CP_METHODS)
    sequence_parallel: bool = False  # Megatron's: the norm regions' tokens split over tp
    virtual_stages: int = 1      # interleaved 1F1B: model chunks per rank (1: plain 1F1B)
    stage_layers: tuple[int, ...] | None = None  # layers per stage (None: even, extra first)
    dropout: bool = False        # count a Megatron GPT's dropout activations (decoders.block_terms)

    @property
    def micro_batch(self) -> int:
        return self.batch // (self.dp * self.microbatches)

    def in_flight(self, stage: int) -> int:
        """Micro-batches pipeline ``stage`` holds at its peak (one stage per rank)."""
        if self.schedule in ("zbv", "dualpipev"):
            raise ValueError(f"schedule={self.schedule!r} holds two chunks per rank in a V: "
                             f"count them with parlab.memory.vshape.v_in_flight")
        if self.schedule == "gpipe":
            return self.microbatches
        if self.schedule == "zb-h1":
            return min(self.pp, self.microbatches)
        return min(self.pp - stage, self.microbatches)

    def held(self, stage: int) -> float:
        """Stages' worth of one micro-batch's activations ``stage`` holds at its peak: its
        :meth:`in_flight` micro-batches, or interleaved (:mod:`parlab.memory.interleaved`) its
        peak (chunk, micro-batch) pairs, 1/virtual_stages of a stage each."""
        if self.virtual_stages == 1:
            return self.in_flight(stage)
        from parlab.memory.interleaved import interleaved_peak
        return interleaved_peak(self.pp, self.microbatches, self.virtual_stages,
                                stage) / self.virtual_stages


def check_capacity(gpu_memory_gb) -> int:
    """Bytes of a GPU of ``gpu_memory_gb`` GB: a positive, finite number (not a string)."""
    if isinstance(gpu_memory_gb, bool) or not isinstance(gpu_memory_gb, Real) \
            or not math.isfinite(gpu_memory_gb) or not gpu_memory_gb > 0:
        raise ValueError(f"gpu_memory_gb must be positive: a finite number of GB such as 80, "
                         f"got {gpu_memory_gb!r}")
    return int(gpu_memory_gb * GB)


def check_schedule(schedule) -> str:
    """``schedule`` if it is one of :data:`ESTIMATED_SCHEDULES`, else a ValueError."""
    if not isinstance(schedule, str) or schedule not in ESTIMATED_SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of "
                         f"{list(ESTIMATED_SCHEDULES)}")
    return schedule


def _model_name(s: Setup) -> str:
    name = getattr(s.model, "name", None)
    if isinstance(name, str):  # a TransformerConfig or a LlamaConfig
        return name
    if s.inputs:  # a torch.nn.Module: its class, parameters and input shapes
        n = sum(p.numel() for p in s.model.parameters())
        shapes = ", ".join(str(tuple(i.shape)) for i in s.inputs)
        return f"{type(s.model).__name__} ({n:,} parameters), input {shapes}"
    return repr(s.model)


def describe_setup(s: Setup, what: str) -> str:
    """One line naming the model, batch, precision, optimizer and split of ``s``."""
    split = f", dp={s.dp} tp={s.tp} pp={s.pp}" if (s.dp, s.tp, s.pp) != (1, 1, 1) else ""
    split += f" ep={s.ep}" if s.ep > 1 else ""
    split += f" cp={s.cp} ({s.cp_method})" if s.cp > 1 else ""
    split += ", sequence parallel" if s.sequence_parallel else ""
    split += ", with dropout" if s.dropout else ""
    split += f", stage layers {list(s.stage_layers)}" if s.stage_layers else ""
    schedule = (f"interleaved {s.schedule}, {s.virtual_stages} chunks a rank"
                if s.virtual_stages > 1 else s.schedule)
    mb = f", {s.microbatches} micro-batches ({schedule})" if s.microbatches > 1 else ""
    zero = f", ZeRO-{s.zero}" if s.zero else ""
    zero += f", {s.recompute} recompute" if s.recompute else ""
    batch = "" if s.inputs else f", batch {s.batch}" + (f" x seq {s.seq}" if s.seq > 1 else "")
    return (f"{what}: {_model_name(s)}{batch}, {s.precision.name}, {s.optimizer}{split}{zero}"
            f"{mb}")
