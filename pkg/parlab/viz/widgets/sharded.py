"""Chapter 06 explorer: memory per GPU and bytes per step for any preset, GPU count and ZeRO stage."""

from __future__ import annotations

from parlab.hardware import GPU_MEMORY_GB, NIC_GBPS
from parlab.comm import nic
from parlab.memory import estimate, recompute_flops
from parlab.models import CONFIGS, compute_seconds, count_parameters
from parlab.sharded import zero_bytes_per_rank
from parlab.units import format_bytes
from parlab.viz.explorer import Explorer, explore

__all__ = ["draw_zero", "zero_explorer", "SEQ"]

#: One sequence of this many tokens per GPU and step in the explorer.
SEQ = 2048


def draw_zero(model: str, gpus: int, stage: int, recompute: str, gpu_gb: float):
    """Bars for stages 0-3 (the chosen one marked), and the chosen stage's traffic and compute.

    ``recompute`` is "none", "selective" or "full" (activation recomputation, chapter 06).
    """
    from parlab.viz.plots.memory import memory_bars

    config = CONFIGS[model]
    seq = min(SEQ, config.context)
    again = None if recompute == "none" else recompute
    try:
        bars = [estimate(config, (gpus, seq), "adam", "bf16", dp=gpus, zero=k,
                         gpu_memory_gb=gpu_gb, recompute=again) for k in range(4)]
    except ValueError as err:
        print(f"This setting does not work: {err}")
        return None
    params = count_parameters(config)["total"]
    sent = zero_bytes_per_rank(2 * params, gpus, stage)
    chosen = bars[stage]
    print(f"{model}: {params / 1e9:.3g} B parameters, bf16 + Adam, {gpus} GPUs, one sequence "
          f"of {seq} tokens per GPU")
    compute = compute_seconds(params, seq) * (1 + recompute_flops(config, seq, again).fraction)
    print(f"stage {stage}, recompute {recompute}: {format_bytes(chosen.total)} per GPU "
          f"({'fits' if chosen.fits else 'does not fit'} in {gpu_gb:g} GB); each GPU sends "
          f"{format_bytes(sent)} per step, {sent / nic(NIC_GBPS).bandwidth:.3g} s at {NIC_GBPS} Gb/s, against "
          f"{compute:.3g} s of compute")
    labels = [f"stage {k}" + (" (chosen)" if k == stage else "") for k in range(4)]
    return memory_bars(labels, bars, f"{model} on {gpus} GPUs: model states and activations "
                                     f"per GPU")


def zero_explorer(model: str = "GPT-3 6.7B", gpus: int = 64, stage: int = 2,
                  recompute: str = "none", gpu_gb: float = GPU_MEMORY_GB) -> Explorer:
    """Model, data-parallel GPUs, ZeRO stage, recomputation and GPU size; memory per GPU."""
    import ipywidgets as w

    controls = {
        "model": w.Dropdown(options=list(CONFIGS), value=model, description="model"),
        "gpus": w.Dropdown(options=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024], value=gpus,
                           description="GPUs"),
        "stage": w.Dropdown(options=[0, 1, 2, 3], value=stage, description="ZeRO stage"),
        "recompute": w.Dropdown(options=["none", "selective", "full"], value=recompute,
                                description="recompute"),
        "gpu_gb": w.Dropdown(options=[16, 24, 40, 48, 80, 94, 141, 192], value=gpu_gb,
                             description="GPU GB"),
    }
    return explore(draw_zero, controls, "ZeRO explorer (model, data-parallel GPUs, ZeRO stage, "
                   "recomputation, GPU size)")
