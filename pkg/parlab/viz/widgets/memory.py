"""Chapter 01 explorers: the training-memory calculator and the cost of a run and its failures."""

from __future__ import annotations

from parlab.hardware import GPU_MEMORY_GB
from parlab.memory import expected_waste, failure_cost, training_cost, waste_curve, young_interval
from parlab.memory import OPTIMIZERS, PRECISIONS, estimate, min_gpus
from parlab.models import CONFIGS, DENSE_HF_CONFIGS, get_config
from parlab.viz.explorer import Explorer, explore

__all__ = ["draw_memory", "memory_explorer", "draw_energy", "energy_explorer"]


def draw_memory(model: str, precision: str, optimizer: str, batch: int, seq: int,
                gpu_gb: float, tp: int, pp: int):
    """Print the per-GPU table and the fewest GPUs, and draw one GPU against the split.

    A setting the model cannot take (more stages than layers, a tensor split that does not
    divide the heads, a sequence longer than the context) prints why and draws nothing.
    """
    from parlab.viz.plots.memory import memory_split

    config = get_config(model)
    try:
        one = estimate(config, (batch, seq), optimizer, precision, gpu_memory_gb=gpu_gb)
        split = estimate(config, (batch, seq), optimizer, precision, tp=tp, pp=pp,
                         gpu_memory_gb=gpu_gb)
        plan = min_gpus(config, (batch, seq), optimizer, precision, gpu_memory_gb=gpu_gb)
    except ValueError as err:
        print(f"This setting does not work: {err}")
        return None
    print(split.table())
    print(plan)
    return memory_split(one, split, f"tp {tp} x pp {pp}\n({tp * pp} GPUs)",
                        f"{model}, {precision} + {optimizer}, batch {batch} x {seq}")


def memory_explorer(model: str = "GPT-2 small", precision: str = "fp32",
                    optimizer: str = "adam", batch: int = 8, seq: int = 1024,
                    gpu_gb: float = GPU_MEMORY_GB, tp: int = 1, pp: int = 1) -> Explorer:
    """The calculator: model, precision, optimizer, batch, sequence, GPU size and split."""
    import ipywidgets as w

    pick = lambda name, options, value: w.Dropdown(options=options, value=value,
                                                   description=name)
    controls = {
        "model": pick("model", list(CONFIGS) + list(DENSE_HF_CONFIGS), model),
        "precision": pick("precision", list(PRECISIONS), precision),
        "optimizer": pick("optimizer", list(OPTIMIZERS), optimizer),
        "batch": pick("batch", [1, 2, 4, 8, 16, 32, 64], batch),
        "seq": pick("sequence", [16, 128, 256, 512, 1024, 2048, 4096, 8192], seq),
        "gpu_gb": pick("GPU GB", [16, 24, 40, 48, 80, 94, 141, 192], gpu_gb),
        "tp": pick("tensor", [1, 2, 4, 8], tp),
        "pp": pick("pipeline", [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96], pp),
    }
    return explore(draw_memory, controls, "training-memory calculator (model, precision, "
                   "optimizer, batch, sequence, GPU size, tensor and pipeline split)")


def draw_energy(gpus: int, watts: float, days: float, usd_per_kwh: float, mtbf_hours: float,
                checkpoint_minutes: float):
    """Print the run's bill and what failures cost it; draw the cost against the interval."""
    from parlab.viz.plots.memory import checkpoint_curve

    run = training_cost(gpus=gpus, watts_per_gpu=watts, days=days, usd_per_kwh=usd_per_kwh)
    best = young_interval(mtbf_hours, checkpoint_minutes)
    waste = expected_waste(run, mtbf_hours, best, checkpoint_minutes)
    print(run)
    print(f"one failure at the very end, no checkpoint: ${failure_cost(run, run.hours):,.0f} lost")
    print(f"checkpoint every {best:.2f} h (Young): about {waste.failures:,.0f} failures, "
          f"${waste.wasted_usd:,.0f} wasted ({100 * waste.overhead:.1f} % of the run)")
    return checkpoint_curve(waste_curve(run, mtbf_hours, checkpoint_minutes))


def energy_explorer(gpus: int = 50_000, watts: float = 350, days: float = 60,
                    usd_per_kwh: float = 0.10, mtbf_hours: float = 8,
                    checkpoint_minutes: float = 10) -> Explorer:
    """The power bill of a run, and the price of failures with and without checkpoints."""
    import ipywidgets as w

    controls = {
        "gpus": w.Dropdown(options=[1024, 4096, 16384, 25000, 50000, 100000], value=gpus,
                           description="GPUs"),
        "watts": w.IntSlider(value=watts, min=100, max=1200, step=50, description="W per GPU"),
        "days": w.IntSlider(value=days, min=1, max=180, description="days"),
        "usd_per_kwh": w.FloatSlider(value=usd_per_kwh, min=0.02, max=0.40, step=0.01,
                                     description="$ per kWh"),
        "mtbf_hours": w.Dropdown(options=[1, 2, 4, 8, 24, 72, 168], value=mtbf_hours,
                                 description="MTBF h"),
        "checkpoint_minutes": w.Dropdown(options=[1, 2, 5, 10, 20, 30], value=checkpoint_minutes,
                                         description="ckpt min"),
    }
    return explore(draw_energy, controls, "power and cost of a run (GPUs, watts, days, price, "
                   "time between failures, checkpoint time)")
