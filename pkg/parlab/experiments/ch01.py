"""Chapter 01's figure recipes: a real training step, the memory calculator against 80 GB, the
fewest GPUs for GPT-3, and the cost of failures.

Each recipe runs or computes here and hands the result to :mod:`parlab.viz.plots`, which
only draws.
"""

from __future__ import annotations

from parlab.memory import estimate, min_gpus, training_cost
from parlab.models import CONFIGS
from parlab.viz import figure
from parlab.viz.plots import (
    checkpoint_curve, figure_8_1, figure_8_1_step, memory_bars, memory_split
)

__all__ = ["model_sizes_figure", "gpt3_split_figure"]


@figure("fig-8-01-gpu-memory", "Figure 8-1: what one GPU keeps during a real training step")
def _figure_8_1():
    """Figure 8-1 for GPU A1 of two data-parallel replicas."""
    return figure_8_1(figure_8_1_step())


@figure("fig-01-memory-bar", "Training memory per GPU: GPT-2 and GPT-3 sizes against 80 GB")
def model_sizes_figure(shape: tuple[int, int] = (8, 1024)):
    """Six model sizes in fp32 with Adam, ``shape`` = (sequences, tokens) each, each on one
    GPU, against 80 GB."""
    names = ["GPT-2 small", "GPT-2 medium", "GPT-2 large", "GPT-2 XL", "GPT-3 2.7B",
             "GPT-3 6.7B"]
    bars = [estimate(CONFIGS[n], shape, "adam", "fp32") for n in names]
    return memory_bars(names, bars, f"fp32, Adam, batch {shape[0]} x {shape[1]} tokens, all on "
                       "one GPU")


@figure("fig-01-gpt3-split", "GPT-3 175B: one GPU against the fewest GPUs that hold it")
def gpt3_split_figure():
    """GPT-3 175B on one GPU, beside the busiest GPU of the fewest-GPU split."""
    one = estimate(CONFIGS["GPT-3 175B"], (8, 2048), "adam", "bf16")
    plan = min_gpus(CONFIGS["GPT-3 175B"], (8, 2048), "adam", "bf16")
    return memory_split(one, plan.breakdown, f"{plan.gpus} GPUs\n(tp {plan.tp} x pp {plan.pp})",
                        "GPT-3 175B, bf16 + Adam, batch 8 x 2048")


@figure("fig-01-checkpoint-cost", "Expected cost of failures against the checkpoint interval")
def _checkpoint_cost():
    """The book's run with failures every 8 hours and 10-minute checkpoints."""
    run = training_cost(gpus=50_000, watts_per_gpu=350, days=60, usd_per_kwh=0.10)
    return checkpoint_curve(run, mtbf_hours=8)
