"""Chapter 07 explorer: how routing, capacity and the number of ranks shape the all-to-all."""

from __future__ import annotations

import torch

from parlab.expert_parallel import dispatch_bytes, local_experts, routed_bytes
from parlab.models import MoE, MoEConfig
from parlab.viz.explorer import Explorer, explore

__all__ = ["draw_experts", "expert_explorer"]

#: The explorer's layer width and tokens per rank (the chapter's example sizes).
D_MODEL, TOKENS = 8, 8


def draw_experts(experts: int, top_k: int, capacity_factor: float, ranks: int, skew: float):
    """Route ``TOKENS`` tokens on each of ``ranks`` ranks (in this process; capacity per rank),
    print what was dropped and padded, and draw the dispatch byte matrix.

    The tokens and the layer are chapter 07's (seed 1, seed 0), so at ``skew`` 0 with the
    chapter's sizes this is section 4's even run. ``skew`` > 0 draws positive inputs instead
    and raises expert 0's router row by ``skew``, so that larger values send more tokens to
    expert 0. ``capacity_factor`` 0 keeps every token.
    """
    import matplotlib.pyplot as plt

    from parlab.viz.plots.experts import matrix_panel

    try:
        local_experts(experts, ranks, 0)
        config = MoEConfig(D_MODEL, 16, experts, top_k, capacity_factor=capacity_factor or None)
    except ValueError as err:
        print(f"This setting does not work: {err}")
        return None
    moe = MoE(config, seed=0)
    g = torch.Generator().manual_seed(1)
    shape = (ranks * TOKENS, D_MODEL)
    x = torch.rand(shape, generator=g) if skew else torch.randn(shape, generator=g)
    with torch.no_grad():
        moe.router.gate.weight[0] += skew
        matrix, load, dropped = [], torch.zeros(experts, dtype=torch.long), 0
        for part in x.split(TOKENS):
            moe(part)
            stats = moe.last
            matrix.append(routed_bytes(stats.routing.experts, stats.kept, experts, ranks, D_MODEL))
            load += stats.load
            dropped += stats.dropped
    assignments = ranks * TOKENS * top_k
    line = f"{dropped} of {assignments} assignments dropped ({100 * dropped / assignments:.0f} %)"
    if stats.capacity is not None:
        slots = ranks * experts * stats.capacity
        line += (f"; capacity {stats.capacity} per expert and rank, so fixed buffers would "
                 f"carry {100 * (1 - (assignments - dropped) / slots):.0f} % padding")
    print(line)
    fig, ax = plt.subplots(figsize=(5.6, 4.8))
    vmax = max(max(row) for row in matrix) or 1
    matrix_panel(ax, matrix, load.tolist(), dispatch_bytes(TOKENS, top_k, D_MODEL, ranks),
                 f"skew {skew:g}", vmax)
    fig.tight_layout()
    return fig


def expert_explorer(experts: int = 4, top_k: int = 2, capacity_factor: float = 1.0,
                    ranks: int = 4, skew: float = 0.0) -> Explorer:
    """Experts, top-k, capacity factor, ranks and router skew; the dispatch's bytes."""
    import ipywidgets as w

    controls = {
        "experts": w.Dropdown(options=[2, 4, 8, 16], value=experts, description="experts"),
        "top_k": w.Dropdown(options=[1, 2, 4], value=top_k, description="top-k"),
        "capacity_factor": w.FloatSlider(value=capacity_factor, min=0.0, max=2.0, step=0.25,
                                         description="capacity"),
        "ranks": w.Dropdown(options=[2, 4, 8], value=ranks, description="ranks"),
        "skew": w.FloatSlider(value=skew, min=0.0, max=2.0, step=0.25, description="skew"),
    }
    return explore(draw_experts, controls, "Expert-parallel dispatch explorer (experts, top-k, "
                   "capacity factor (0: no limit), ranks, router skew)")
