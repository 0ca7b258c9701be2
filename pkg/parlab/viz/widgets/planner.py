"""Chapter 05 explorer: the 3D-parallel planner over model, GPUs, GPU memory and link speeds.

Follows :func:`parlab.viz.explore`: the figure at the default setting (GPT-3 175B on
1,024 GPUs of 80 GB, 400 Gb/s NICs, NVLink 450 GB/s) first, then live controls. Each redraw
prints how the search narrowed the candidates, the best layouts and why the winner wins.
"""

from __future__ import annotations

from parlab.hardware import GPU_MEMORY_GB, NIC_GBPS, NVLINK_GB_PER_S
from parlab.viz.explorer import Explorer, explore

__all__ = ["draw_plan", "planner_explorer"]


def draw_plan(model: str, gpus: int, gpu_gb: float, nic_gbps: float, nvlink_gbs: float,
              top: int = 5):
    """Print the search summary, the top layouts and the winner's explanation; draw them."""
    from parlab.hybrid import cluster, search, table
    from parlab.viz.plots.planner import layouts_figure
    from parlab.comm import LinkSpec, NVLINK

    try:
        nvlink = LinkSpec("nvlink", NVLINK.alpha, nvlink_gbs * 1e9)
        found = search(model, gpus, gpu_gb, topology=cluster(gpus, 8, nic_gbps, nvlink=nvlink))
    except ValueError as err:
        print(f"This setting does not work: {err}")
        return None
    print(found.summary())
    if not found.ranked:
        print("No layout fits: more GPUs or more memory per GPU are needed.")
        return layouts_figure(found) if found.layouts else None
    print()
    print(table(found.ranked, top))
    print()
    print(found.ranked[0].explain())
    return layouts_figure(found)


def planner_explorer(model: str = "GPT-3 175B", gpus: int = 1024, gpu_gb: float = GPU_MEMORY_GB,
                     nic_gbps: float = NIC_GBPS,
                     nvlink_gbs: float = NVLINK_GB_PER_S) -> Explorer:
    """Model, GPU count, GPU memory, NIC speed and NVLink speed over the planner's verdict."""
    import ipywidgets as w

    from parlab.models import CONFIGS, DENSE_HF_CONFIGS

    pick = lambda name, options, value: w.Dropdown(options=options, value=value,
                                                   description=name)
    controls = {
        "model": pick("model", [n for n in (*CONFIGS, *DENSE_HF_CONFIGS) if n != "tiny"], model),
        "gpus": pick("GPUs", [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096], gpus),
        "gpu_gb": pick("GPU GB", [24, 40, 80, 94, 141, 192], gpu_gb),
        "nic_gbps": pick("NIC Gb/s", [100, 200, 400, 800], nic_gbps),
        "nvlink_gbs": pick("NVLink GB/s", [150, 300, 450, 900], nvlink_gbs),
    }
    return explore(draw_plan, controls, "3D-parallel planner (model, GPUs, GPU memory, NIC and "
                   "NVLink speed): search summary, best layouts, the winner explained")
