"""How many GPUs one copy of a model needs: why chapter 01 says 64 for GPT-3 and chapter 05 128.

Why this module exists: chapter 01's :func:`parlab.memory.min_gpus` fits GPT-3 175B on 64
GPUs; chapter 05's planner finds nothing under 128 GPUs per model copy. Both are right under
their own assumptions, and :func:`copy_sizes` lines the two up, changing one assumption at a
time:

1. chapter 01's job: a batch of 8 sequences as *one* micro-batch, the fewest GPUs;
2. chapter 05's step (1,536 sequences in micro-batches of one) on that same split: 1F1B keeps
   pp micro-batches in flight on the first stage, so its activations grow, and it no longer
   fits, though its pipeline idles far less;
3. the fewest GPUs for chapter 05's step, any stage count (stages may hold unequal numbers of
   layers);
4. the same with full activation recomputation (chapter 06);
5. the narrowest copy chapter 05's planner accepts, where copies must divide the cluster and
   stages hold equal numbers of layers.

Every row is computed by :func:`parlab.memory.min_gpus`, :func:`parlab.memory.estimate` or
:func:`parlab.hybrid.plan`; nothing is typed in. :func:`depth_table` shows the parts of the
busiest GPU's memory as the pipeline deepens (the answer to exercise 05.1).
"""

from __future__ import annotations

from dataclasses import dataclass

from parlab.hardware import GPU_MEMORY_GB
from parlab import memory
from parlab.hybrid import bubble_fraction, plan
from parlab.models import get_config
from parlab.checks import check_count

__all__ = ["CopySize", "copy_sizes", "copy_table", "depth_table"]


@dataclass(frozen=True)
class CopySize:
    """One way to size a model copy: its split, what the busiest GPU holds, its bubble."""

    label: str
    tp: int
    pp: int
    microbatches: int
    micro_batch: int          # sequences per micro-batch
    memory: memory.Breakdown

    @property
    def gpus(self) -> int:
        """GPUs per model copy."""
        return self.tp * self.pp

    @property
    def sequences(self) -> int:
        """Sequences per step: micro-batches x sequences per micro-batch."""
        return self.microbatches * self.micro_batch

    @property
    def bubble(self) -> float:
        return bubble_fraction(self.pp, self.microbatches)

    def row(self) -> str:
        return (f"{self.label:<58}{self.gpus:>5}  tp {self.tp} x pp {self.pp:<3}"
                f"{self.memory.total / 1e9:>7.1f} GB  {'fits' if self.memory.fits else 'no':<5}"
                f"{self.bubble:>7.1%}")


def copy_sizes(model="GPT-3 175B", small_batch: int = 8, global_batch: int = 1536,
               gpus: int = 1024, gpu_memory_gb: float = GPU_MEMORY_GB) -> list[CopySize]:
    """The five rows of the module docstring, for ``model`` in bf16 with Adam."""
    config = get_config(model)
    seq = config.context
    job = dict(optimizer="adam", precision="bf16", gpu_memory_gb=gpu_memory_gb)
    few = memory.min_gpus(config, (small_batch, seq), microbatches=1, **job)
    rows = [CopySize(f"{small_batch} sequences as one micro-batch (chapter 01)", few.tp, few.pp,
                     1, small_batch, few.breakdown)]
    step = (global_batch, seq)
    same = memory.estimate(config, step, tp=few.tp, pp=few.pp, microbatches=global_batch, **job)
    rows.append(CopySize(f"{global_batch:,} sequences, micro-batches of 1, same split",
                         few.tp, few.pp, global_batch, 1, same))
    for recompute, label in ((None, "fewest GPUs for that step, any stage count"),
                             ("full", "the same with full recomputation")):
        p = memory.min_gpus(config, step, microbatches=global_batch, recompute=recompute, **job)
        rows.append(CopySize(label, p.tp, p.pp, global_batch, 1, p.breakdown))
    layouts = plan(config, gpus, gpu_memory_gb, global_batch=global_batch)
    if layouts:
        narrow = min(layouts, key=lambda lay: (lay.tp * lay.pp, lay.step_time_s))
        rows.append(CopySize(f"chapter 05's planner, {gpus:,} GPUs: narrowest copy", narrow.tp,
                             narrow.pp, narrow.microbatches, narrow.micro_batch, narrow.memory))
    return rows


def copy_table(rows: list[CopySize]) -> str:
    """The rows of :func:`copy_sizes` under one header, as chapters 01 and 05 print them."""
    header = (f"{'job':<58}{'GPUs':>5}  {'split':<15}{'busiest GPU':>10}  {'fits':<5}"
              f"{'bubble':>7}")
    return "\n".join([header] + [row.row() for row in rows])


def depth_table(model="GPT-3 175B", tp: int = 8, depths=(8, 16, 32), gpus: int = 1024,
                global_batch: int = 1536, gpu_memory_gb: float = GPU_MEMORY_GB) -> str:
    """Each part of the busiest GPU's memory for pipelines of ``depths`` stages: ``tp``-way
    tensor parallelism, the rest of ``gpus`` as replicas, micro-batches of one sequence, 1F1B,
    bf16 with Adam (as the planner counts them)."""
    config = get_config(model)
    for name, value in (("tp", tp), ("gpus", gpus), ("global_batch", global_batch)):
        check_count(name, value)
    if not depths:
        raise ValueError("depths must hold one or more pipeline depths, got ()")
    for pp in depths:
        if check_count("pp", pp, "a pipeline depth in depths") * tp > gpus:
            raise ValueError(f"tp={tp} x pp={pp} is more than gpus={gpus}: no GPU is left for "
                             f"a replica; use depths of at most {gpus // tp}")
    columns = {}
    for pp in depths:
        dp = gpus // (tp * pp)
        columns[pp] = memory.estimate(config, (global_batch, config.context), "adam", "bf16",
                                      dp, tp, pp, global_batch // dp, "1f1b", gpu_memory_gb)
    lines = [f"{'busiest GPU (GB)':<18}" + "".join(f"{f'pp {pp}':>9}" for pp in depths)]
    names = [n for n in columns[depths[0]].parts() if n != "other"]
    for name in names + ["total"]:
        values = [b.total if name == "total" else b.parts()[name] for b in columns.values()]
        lines.append(f"{name.replace('_', ' '):<18}" + "".join(f"{v / 1e9:>9.1f}"
                                                              for v in values))
    return "\n".join(lines)
