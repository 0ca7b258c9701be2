"""Chapter 00's experiments: collectives on real ranks, the toy backend's log, and an explorer.

:func:`collective_explorer` follows :func:`parlab.viz.explore`. Each setting (collective,
algorithm, ranks, tensor size) launches real ranks on the toy backend, checks every rank's
answer against the sum or copy it must hold, and draws the logged messages one panel per
step. The reader sees the ring's 2(n-1) small steps, the naive root's two big ones, and the
tree's log2(n) rounds grow or shrink as the ranks change, instead of taking the formulas on
trust. The figure recipes run ranks here and hand the results to :mod:`parlab.viz.plots`.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from parlab.checks import check_count
from parlab.comm import ALGORITHMS, COLLECTIVES, one_collective, run_with_traffic
from parlab.launch import run
from parlab.units import format_bytes
from parlab.viz import Explorer, explore, figure
from parlab.viz.plots import before_after, bytes_per_rank_figure, steps_figure

__all__ = ["draw_collective", "collective_explorer"]


def draw_collective(collective: str = "all_gather", algorithm: str = "ring", ranks: int = 4,
                    elements: int = 16):
    """Run the collective on ``ranks`` toy-backend ranks; print the totals; draw each step."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; choose one of {list(COLLECTIVES)}")
    check_count("ranks", ranks, "toy-backend ranks")
    check_count("elements", elements, "each rank's tensor length")
    results, log = run_with_traffic(one_collective, ranks, collective, elements,
                                    algorithm=algorithm)
    unit = 4 * elements
    what = {"all_reduce": f"one {unit}-byte tensor per rank",
            "all_gather": f"one {unit}-byte piece from each rank",
            "reduce_scatter": f"{ranks} pieces of {unit} bytes on each rank",
            "broadcast": f"one {unit}-byte tensor from rank 0"}[collective]
    sent = log.per_rank()["sent"].reindex(range(ranks), fill_value=0)
    steps = len(log.per_step())
    plural = lambda k, word: f"{k} {word}{'' if k == 1 else 's'}"
    print(f"{collective} ({algorithm}) on {ranks} ranks, {what}: {COLLECTIVES[collective]}")
    print(f"every rank's result is right: {all(results)}")
    print(f"{plural(steps, 'step')}, {plural(len(log), 'message')}, "
          f"{format_bytes(log.total_bytes())} in all; the busiest rank sends "
          f"{format_bytes(sent.max())} ({sent.max() / unit:.2f} x {unit} B), "
          f"the idlest {format_bytes(sent.min())}")
    return steps_figure(log, n=ranks, columns=min(steps, 5),
                        title=f"{collective} ({algorithm}) on {ranks} ranks, {what}")


def collective_explorer(collective: str = "all_gather", algorithm: str = "ring",
                        ranks: int = 4, elements: int = 16) -> Explorer:
    """Collective, algorithm, number of ranks and tensor size over the messages sent."""
    import ipywidgets as w

    controls = {
        "collective": w.Dropdown(options=list(COLLECTIVES), value=collective,
                                 description="collective"),
        "algorithm": w.Dropdown(options=list(ALGORITHMS), value=algorithm,
                                description="algorithm"),
        "ranks": w.IntSlider(value=ranks, min=2, max=8, description="ranks",
                             continuous_update=False),
        "elements": w.IntSlider(value=elements, min=4, max=64, step=4,
                                description="floats", continuous_update=False),
    }
    return explore(draw_collective, controls, "collective explorer (collective, algorithm, "
                   "ranks, tensor size): real ranks on the toy backend, each step's messages")


# --------------------------------------------------------------------------- figure recipes


def _demo_all_reduce():
    import torch.distributed as dist
    x = torch.arange(3.0) + 10 * dist.get_rank()
    before = x.clone()
    dist.all_reduce(x)
    return before, x


@figure("fig-00-all-reduce", "Getting started: four ranks before and after all_reduce(SUM)")
def _all_reduce_figure():
    return before_after(run(_demo_all_reduce, 4, backend="gloo"), "all_reduce (SUM) on 4 ranks")


def _all_reduce_16_floats():
    dist.all_reduce(torch.ones(16))


@functools.cache  # two figures draw the same two runs
def _demo_logs():
    return {name: run_with_traffic(_all_reduce_16_floats, 4, algorithm=name)[1]
            for name in ("ring", "naive")}


@figure("fig-00-toy-ring-traffic",
        "Getting started: a ring all_reduce of 64 bytes on 4 ranks, step by step")
def _ring_figure():
    ring = _demo_logs()["ring"]
    return steps_figure(ring, title="ring all_reduce of 16 float32 (64 B) on 4 ranks", columns=3)


@figure("fig-00-ring-vs-naive-bytes",
        "Getting started: bytes each rank sends, ring vs naive all_reduce")
def _ring_vs_naive_figure():
    return bytes_per_rank_figure(_demo_logs(),
                                 "all_reduce of 64 B on 4 ranks: bytes each rank sends")
