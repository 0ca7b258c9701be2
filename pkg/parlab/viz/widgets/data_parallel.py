"""Chapter 02 explorers: data-parallel traffic at cluster scale.

The Figure 8-2 explorer starts ranks, so it is chapter 02's experiment
(:func:`parlab.experiments.book_step_explorer`).
"""

from __future__ import annotations

from parlab.hardware import NIC_GBPS
from parlab.viz.explorer import Explorer, explore

__all__ = ["draw_scaling", "scaling_explorer"]


def draw_scaling(model: str, gpus: int, gbps: int, algorithm: str, dtype: str):
    """The scaling figure for a model of :data:`parlab.models.CONFIGS` on ``gpus`` replicas."""
    from parlab.data_parallel import sync_scaling
    from parlab.models import count_parameters
    from parlab.viz.plots.data_parallel import scaling_figure

    params = count_parameters(model)["total"]
    scaling = sync_scaling(params, gpus, gbps, algorithm, {"fp32": 4, "bf16": 2}[dtype])
    return scaling_figure(scaling, label=f"{model} ({params / 1e9:.3g} B parameters)")


def scaling_explorer(model: str = "GPT-3 175B", gpus: int = 1024, gbps: int = NIC_GBPS,
                     algorithm: str = "ring", dtype: str = "bf16") -> Explorer:
    """Model, number of GPUs, NIC speed, all-reduce algorithm and gradient precision."""
    import ipywidgets as w

    from parlab.models import CONFIGS
    from parlab.data_parallel import SCALES
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
