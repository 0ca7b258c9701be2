"""Chapter 06's experiment: every ZeRO stage and FSDP2 on 2 and 4 logged ranks, in one table,
and the chapter's figure recipes (run here, drawn by :mod:`parlab.viz.plots`).

Why a module of its own: the chapter asks three questions of the same runs (do they train
exactly like one process? what does each rank hold? what does each rank send?), so one
function runs each configuration once on the toy backend and returns a row per run with all
three answers beside their independent references: :func:`~parlab.sharded.zero_reference` for
the parameters, :func:`parlab.memory.model_state_bytes` for the memory and
:func:`~parlab.sharded.zero_bytes_per_rank` for the traffic.
"""

from __future__ import annotations

import functools

from parlab.memory import model_state_bytes
from parlab.sharded import (
    ShardRun, STATE_PARTS, train_stages, train_zero, zero_bytes_per_rank, zero_reference,
    zero_scaling, ZeroSpec
)
from parlab.viz import figure
from parlab.viz.plots import (
    zero3_timeline_figure, zero_memory_figure, zero_scaling_figure, zero_traffic_figure
)

__all__ = ["stage_table"]


def _row(name: str, run: ShardRun, ref) -> dict:
    spec, n, stage = run.spec, run.world_size, run.stage
    held = run.state_bytes()
    if any(h != held[0] for h in held):
        raise AssertionError(f"{name} on {n} ranks: ranks hold different bytes: {held}")
    formula = model_state_bytes(spec.parameters, spec.optimizer, "fp32", n, stage)
    parameter_bytes = 4 * spec.parameters
    return {"run": name, "ranks": n, "stage": stage,
            "max difference": run.max_difference(ref),
            **{part: held[0][part] for part in STATE_PARTS},
            "held": sum(held[0].values()), "formula": formula.total,
            "sent per step": run.bytes_sent_per_step(),
            "closed form": zero_bytes_per_rank(parameter_bytes, n, stage)}


def stage_table(world_sizes=(2, 4), spec: ZeroSpec = ZeroSpec(), *, fsdp: bool = True,
                progress: bool = False):
    """Run ZeRO stages 0-3 (and FSDP2) on each world size with the toy backend; one row each.

    Columns: the run, ranks, stage; the largest difference from one process over all steps;
    the bytes of parameters, gradients and optimizer state each rank held after the last
    backward (equal on every rank, checked) and the formula's total; the bytes each rank sent
    per step and the closed form. ``progress`` shows a tqdm bar.
    """
    import pandas as pd

    from parlab.progress import progress_bar

    ref = zero_reference(spec)
    zero_rows, fsdp_rows = [], []  # ZeRO's rows for every world size, then FSDP2's
    for n in progress_bar(world_sizes, desc="launches", unit="launch", disable=not progress):
        runs = train_stages(n, spec, fsdp=fsdp, backend="toy")  # stages 0-3, FSDP2: one launch
        zero_rows += [_row(f"ZeRO-{run.stage}", run, ref) for run in runs[:4]]
        fsdp_rows += [_row("FSDP2", run, ref) for run in runs[4:]]
    return pd.DataFrame(zero_rows + fsdp_rows)


# --------------------------------------------------------------------------- figure recipes


@functools.cache
def _table():
    """The chapter's runs, made once for both figures that draw them."""
    return stage_table()


@figure("fig-06-zero-memory", "Model states per rank under ZeRO 0-3 and FSDP2, measured vs formula")
def _memory():
    return zero_memory_figure(_table())


@figure("fig-06-zero-traffic", "Bytes per rank and step under ZeRO 0-3 and FSDP2 (toy backend)")
def _traffic():
    return zero_traffic_figure(_table())


@figure("fig-06-zero3-timeline", "One ZeRO-3 step, collective by collective and layer by layer")
def _timeline():
    spec = ZeroSpec(steps=1)
    return zero3_timeline_figure(train_zero(3, 2, spec, backend="toy").collectives(),
                                 len(spec.sizes) - 1)


@figure("fig-06-zero-scaling", "ZeRO from 8 to 1024 GPUs: memory, traffic and compute")
def _scaling():
    return zero_scaling_figure(zero_scaling(7.5e9), 7.5e9)
