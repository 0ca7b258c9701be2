"""Chapter 02 explorers: Figure 8-2 on real ranks, and data-parallel traffic at cluster scale."""

from __future__ import annotations

from parlab.viz.plots.data_parallel import FIGURE_8_2, figure_8_2, run_figure_8_2
from parlab.viz.explorer import Explorer, explore

__all__ = ["draw_book_step", "book_step_explorer", "draw_scaling", "scaling_explorer"]


def draw_book_step(ranks: int, how: str, steps: int):
    """Run Figure 8-2's step on ``ranks`` real ranks (gloo), print the table, draw the figure."""
    result = run_figure_8_2(FIGURE_8_2.replace(steps=steps), world_size=ranks, how=how)
    print(result.table())
    print(f"replicas equal one process (to 1e-6): {result.max_difference() < 1e-6}; "
          f"replicas bit-for-bit identical: {result.replicas_identical()}")
    return figure_8_2(result)


def book_step_explorer(ranks: int = 2, how: str = "all_gather",
                       steps: int = FIGURE_8_2.steps) -> Explorer:
    """Replicas (1, 2, 4), the exchange (all_gather or all_reduce), and training steps.

    The defaults are :func:`run_figure_8_2`'s, so the explorer opens on the step the chapter
    draws just above it.
    """
    import ipywidgets as w

    controls = {
        "ranks": w.Dropdown(options=[1, 2, 4], value=ranks, description="replicas"),
        "how": w.Dropdown(options=["all_gather", "all_reduce"], value=how,
                          description="exchange"),
        "steps": w.IntSlider(value=steps, min=1, max=10, description="steps"),
    }
    return explore(draw_book_step, controls, "Figure 8-2 on real ranks (replicas, exchange, steps)")


def draw_scaling(model: str, gpus: int, gbps: int, algorithm: str, dtype: str):
    """The scaling figure for a model of :data:`parlab.models.CONFIGS` on ``gpus`` replicas."""
    from parlab.models import count_parameters
    from parlab.viz.plots.data_parallel import scaling_figure

    params = count_parameters(model)["total"]
    return scaling_figure(params, gpus, gbps, algorithm, {"fp32": 4, "bf16": 2}[dtype],
                          label=f"{model} ({params / 1e9:.3g} B parameters)")


def scaling_explorer(model: str = "GPT-3 175B", gpus: int = 1024, gbps: int = 400,
                     algorithm: str = "ring", dtype: str = "bf16") -> Explorer:
    """Model, number of GPUs, NIC speed, all-reduce algorithm and gradient precision."""
    import ipywidgets as w

    from parlab.models import CONFIGS
    from parlab.viz.plots.data_parallel import SCALES
    from parlab.comm import ALGORITHMS
    from parlab.hardware import NIC_SPEEDS_GBPS

    controls = {
        "model": w.Dropdown(options=[m for m in CONFIGS if m != "tiny"], value=model,
                            description="model"),
        "gpus": w.SelectionSlider(options=SCALES, value=gpus, description="GPUs"),
        "gbps": w.Dropdown(options=list(NIC_SPEEDS_GBPS), value=gbps, description="NIC Gb/s"),
        "algorithm": w.Dropdown(options=list(ALGORITHMS), value=algorithm,
                                description="all-reduce"),
        "dtype": w.Dropdown(options=["bf16", "fp32"], value=dtype, description="gradients"),
    }
    return explore(draw_scaling, controls, "data-parallel traffic at cluster scale (model, "
                   "GPUs, NIC speed, algorithm, gradient precision)")
