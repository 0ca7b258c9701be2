"""Chapter 09's experiments: the split backward on one stage of chapter 03's network, the
zero-bubble schedules side by side in the event-driven simulator, F, B and W measured on this
machine, and the four schedules trained on real ranks with their measured timelines.

How the schedules describe the same model. Every schedule runs the same network cut the same
way: a one-stage-per-rank schedule (1F1B, ZB-H1) gives each of p ranks 1/p of the layers, a V
schedule (ZBV, DualPipeV) cuts them into 2p stages and gives each rank two, so one of its
stages holds half a rank's layers. So the durations are given per *rank's stage* (F, B and W
of 1/p of the model, on one micro-batch) and :meth:`parlab.pipeline.Durations.split` halves
them for a V schedule's stages (a transfer stays one transfer: the same activation crosses the
link).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from parlab.hybrid import plan
from parlab.memory import estimate_ranks
from parlab.pipeline import (
    Durations, execute_programs, Network, program, reference, SplitBackward, stage_layers,
    timeline
)
from parlab.viz import figure
from parlab.viz.plots import bubble_figure, schedules_figure

__all__ = ["ZB_SCHEDULES", "ZB_RANKS", "ZB_MICROBATCHES", "UNIT_PASSES", "WIDE_NET",
           "schedule_timelines", "schedules_chart", "speedups",
           "SplitDemo", "split_backward_demo", "measure_passes", "bubble_sweep", "bubble_chart",
           "BY_M", "BY_P", "SWEEP_MICROBATCHES", "memory_table", "RealRuns", "run_real",
           "PlannedSchedule", "plan_schedules"]

#: The schedules the chapter compares, and the comparison's ranks and micro-batches.
ZB_SCHEDULES = ("1f1b", "zb-h1", "zbv", "dualpipev")
ZB_RANKS, ZB_MICROBATCHES = 4, 8
#: The reference times of the charts: F, B and W of one rank's stage, one unit each.
UNIT_PASSES = Durations(1.0, 1.0, 1.0)
#: The network of the measurement and of the real run: chapter 03's kind of layer (Linear,
#: then a sigmoid) made wider, 8 layers of 128, so one rank's work is not lost in the time
#: a message takes, and small enough to run in a second or two on a laptop's shared cores.
#: 8 layers: 2 per rank on 4 ranks (1 per V stage), 4 per rank on 2 (2 per V stage).
WIDE_NET = Network(widths=(128,) * 9, samples=64)
#: The sweeps: micro-batches with p = ZB_RANKS, then ranks with SWEEP_MICROBATCHES
#: micro-batches (DualPipeV needs 2p of them).
BY_M = (8, 16, 32, 64)
BY_P = (2, 4, 6, 8)
SWEEP_MICROBATCHES = 16


def schedule_timelines(per_stage: Durations = UNIT_PASSES, ranks: int = ZB_RANKS,
                       microbatches: int = ZB_MICROBATCHES, names=ZB_SCHEDULES) -> dict:
    """``{name: Timeline}``: each schedule of the same model in the event-driven simulator."""
    progs = [program(name, ranks, microbatches) for name in names]
    return {prog.name: timeline(prog, per_stage.split(prog.chunks)) for prog in progs}


def speedups(timelines: dict, base: str = "1f1b") -> dict:
    """``{name: makespan of base / makespan of name - 1}``: the simulated gain over ``base``."""
    return {name: timelines[base].makespan / t.makespan - 1 for name, t in timelines.items()}


@figure("fig-09-schedules", "1F1B, ZB-H1, ZBV and DualPipeV on 4 ranks with 8 micro-batches, "
                            "one time axis, F = B = W")
def schedules_chart(per_stage: Durations | None = None):
    per_stage = per_stage or UNIT_PASSES
    return schedules_figure(schedule_timelines(per_stage), tuple(per_stage[:3]))


@dataclass
class SplitDemo:
    """One stage of chapter 03's network, backward split into B (input gradient) and W.

    ``saved``: what autograd keeps from the forward, ``(tensor, shape)``; ``input_error`` and
    ``weight_error``: the largest differences from autograd's full backward; ``untouched``:
    whether the weights had no gradient yet after B; ``kept_share``: the bytes W keeps after
    B (the layer's input and the gradient of its output) over the activations the forward saved.
    """

    saved: list
    b_needs: list
    w_needs: list
    input_error: float
    weight_error: float
    untouched: bool
    kept_share: float


def split_backward_demo(net: Network | None = None, stage: int = 1) -> SplitDemo:
    """Stage ``stage`` of chapter 03's network (one layer: Linear, then sigmoid) on its first
    micro-batch of 2 samples: autograd's full backward against B then W."""
    net = net or Network()
    layers, (x, target) = net.build(), net.batch()
    x, target = x[:2], target[:2]
    with torch.no_grad():
        h = x
        for j in range(stage):
            h = layers[j](h)
    layer = layers[stage]
    names = {layer[0].weight.data_ptr(): "the weight A"}
    inp = h.clone().requires_grad_()
    names[inp.data_ptr()] = "the stage's input x"
    saved = []
    pack = lambda t: saved.append(t) or t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = layer(inp)
    names[out.data_ptr()] = "the sigmoid's output y"
    rest = out
    for later in layers[stage + 1:]:
        rest = later(rest)
    grad_out, = torch.autograd.grad(net.loss(rest, target, net.samples), out)
    out.backward(grad_out.clone())  # the full backward, autograd's reference
    want_input, want = inp.grad.clone(), [q.grad.clone() for q in layer.parameters()]
    layer.zero_grad(set_to_none=True)
    passes = SplitBackward({stage: layer})
    inp2 = h.clone().requires_grad_()
    out2, noted = passes.forward(layer, inp2)
    input_grad, kept = passes.input_gradient(inp2, out2, grad_out, noted)
    untouched = all(q.grad is None for q in layer.parameters())
    passes.weight_gradient(kept)
    passes.close()
    weight_error = max(float((q.grad - w).abs().max()) for q, w in zip(layer.parameters(), want))
    listed = [(names.get(t.data_ptr(), "another tensor"), tuple(t.shape)) for t in saved]
    activations = sum(t.numel() for t in saved if t.data_ptr() != layer[0].weight.data_ptr())
    w_keeps = inp.numel() + sum(g.numel() for _, _, g in kept)  # x and dL/dz
    return SplitDemo(listed,
                     [("the gradient from the next stage dL/dy", tuple(grad_out.shape))]
                     + [item for item in listed if item[0] != "the stage's input x"],
                     [("the stage's input x", tuple(inp.shape))]
                     + [("the gradient dL/dz that B computed", tuple(g.shape)) for *_, g in kept],
                     float((input_grad - want_input).abs().max()), weight_error, untouched,
                     w_keeps / activations)


def measure_passes(net: Network | None = None, ranks: int = ZB_RANKS,
                   microbatches: int = ZB_MICROBATCHES, repeats: int = 7) -> Durations:
    """F, B and W of one rank's stage of ``net`` cut over ``ranks`` ranks, on one micro-batch,
    timed here (float64, the executor's): each the median of ``repeats`` rounds, in ms."""
    net = net or WIDE_NET
    layers = net.build()
    stage = min(1, ranks - 1)  # a stage whose input needs its gradient, as all but the first
    module = torch.nn.Sequential(*(layers[j] for j in stage_layers(net, ranks, stage))).double()
    rows = net.samples // microbatches
    g = torch.Generator().manual_seed(0)
    x = torch.rand(rows, net.widths[stage_layers(net, ranks, stage).start], generator=g,
                   dtype=torch.float64)
    grad = torch.rand(rows, net.widths[stage_layers(net, ranks, stage).stop], generator=g,
                      dtype=torch.float64)
    passes, times = SplitBackward({stage: module}), {"F": [], "B": [], "W": []}
    for n in range(repeats + 1):  # the first round warms up and is not counted
        inp = x.clone().requires_grad_()
        t0 = time.perf_counter()
        out, noted = passes.forward(module, inp)
        t1 = time.perf_counter()
        _, kept = passes.input_gradient(inp, out, grad, noted)
        t2 = time.perf_counter()
        passes.weight_gradient(kept)
        t3 = time.perf_counter()
        if n:
            for kind, seconds in zip("FBW", (t1 - t0, t2 - t1, t3 - t2)):
                times[kind].append(seconds * 1e3)
    passes.close()
    return Durations(*(round(statistics.median(times[kind]), 3) for kind in "FBW"))


def bubble_sweep(per_stage: Durations = UNIT_PASSES, names=ZB_SCHEDULES) -> dict:
    """Bubble fractions: ``{"m": {name: [...]}}`` at each of :data:`BY_M` on ``ZB_RANKS`` ranks,
    ``{"p": {name: [...]}}`` at each of :data:`BY_P` ranks with
    :data:`SWEEP_MICROBATCHES` micro-batches."""
    by_m = {name: [schedule_timelines(per_stage, ZB_RANKS, m, (name,))[name].bubble_fraction
                   for m in BY_M] for name in names}
    by_p = {name: [schedule_timelines(per_stage, p, SWEEP_MICROBATCHES, (name,))[name]
                   .bubble_fraction
                   for p in BY_P] for name in names}
    return {"m": by_m, "p": by_p}


@figure("fig-09-bubble", "Bubble fraction against micro-batches (4 ranks) and ranks "
                         "(16 micro-batches) for each schedule, F = B = W")
def bubble_chart(per_stage: Durations | None = None):
    per_stage = per_stage or UNIT_PASSES
    sweep = bubble_sweep(per_stage)
    return bubble_figure(sweep["m"], BY_M, sweep["p"], BY_P, ZB_RANKS, SWEEP_MICROBATCHES,
                         tuple(per_stage[:3]))


def memory_table(kept_share: float, ranks: int = ZB_RANKS, microbatches: int = ZB_MICROBATCHES,
                 names=ZB_SCHEDULES) -> list[dict]:
    """Per schedule and rank: the peak activations held at once, in units of one rank's stage
    on one micro-batch (a V stage counts 1/2), with a share ``kept_share`` of a forward's
    activations kept from B to W; and the share of the model's parameters each rank holds."""
    rows = []
    for name, t in schedule_timelines(UNIT_PASSES, ranks, microbatches, names).items():
        unit = 1 / t.program.chunks
        rows.append({"schedule": name,
                     **{f"rank {r}": round(a * unit, 2)
                        for r, a in enumerate(t.peak_activations(kept_share))},
                     "parameters per rank": f"1/{round(1 / t.parameters[0])}",
                     "copies": t.parameter_copies})
    return rows


@dataclass
class PlannedSchedule:
    """Chapter 05's planner run with one schedule: its fastest layout, and every pipeline
    rank's memory in that layout (per stage, or per rank of a V), in GB."""

    layout: object
    rank_gb: list


def plan_schedules(model: str = "GPT-3 175B", gpus: int = 1024,
                   names=ZB_SCHEDULES) -> dict[str, PlannedSchedule]:
    """For each schedule of ``names``, :func:`parlab.hybrid.plan`'s fastest layout of
    ``model`` on ``gpus`` GPUs (chapter 05's cluster and assumptions) and its memory per rank
    (:func:`parlab.memory.estimate_ranks`)."""
    out = {}
    for name in names:
        lay = plan(model, gpus, schedule=name)[0]
        a = lay.assumptions
        ranks = estimate_ranks(lay.config, (a.global_batch, a.sequence(lay.config)),
                               a.optimizer, a.precision, lay.dp, lay.tp, lay.pp,
                               lay.microbatches, name, zero=a.zero, recompute=lay.recompute,
                               sequence_parallel=a.sequence_parallel)
        out[name] = PlannedSchedule(lay, [b.total / 1e9 for b in ranks])
    return out


@dataclass
class RealRuns:
    """The four schedules trained one step on real ranks: per schedule its
    :class:`parlab.pipeline.ProgramRun`, its largest gradient difference from one process, and
    whether each rank's log is the simulator's order."""

    runs: dict
    errors: dict
    same_order: dict


def run_real(ranks: int = 2, microbatches: int = ZB_MICROBATCHES, net: Network | None = None,
             names=ZB_SCHEDULES) -> RealRuns:
    """Every schedule of ``names`` on ``ranks`` gloo ranks in one launch (one SGD step each,
    float32), each against one process's gradients and the simulator's order."""
    net = net or WIDE_NET
    progs = [program(name, ranks, microbatches) for name in names]
    done = execute_programs(progs, net, iterations=1, dtype=torch.float32)
    want, _ = reference(net)
    runs = dict(zip(names, done))
    errors = {name: max(float((a - b).abs().max()) for j in want
                        for a, b in zip(run.grads[0][j], want[j])) for name, run in runs.items()}
    same = {name: run.order(0) == timeline(run.program).order() for name, run in runs.items()}
    return RealRuns(runs, errors, same)
