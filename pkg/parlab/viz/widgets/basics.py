"""Chapter 00 explorer: one collective on real ranks, every message it sends, step by step.

Follows :func:`parlab.viz.explore`. Each setting (collective, algorithm, ranks, tensor
size) launches real ranks on the toy backend, checks every rank's answer against the sum or
copy it must hold, and draws the logged messages one panel per step. The reader sees the
ring's 2(n-1) small steps, the naive root's two big ones, and the tree's log2(n) rounds grow
or shrink as the ranks change, instead of taking the formulas on trust.
"""

from __future__ import annotations

from parlab.comm import COLLECTIVES, one_collective
from parlab.viz.explorer import Explorer, explore

__all__ = ["draw_collective", "collective_explorer"]

def draw_collective(collective: str = "all_gather", algorithm: str = "ring", ranks: int = 4,
                    elements: int = 16):
    """Run the collective on ``ranks`` toy-backend ranks; print the totals; draw each step."""
    from parlab.viz.plots.traffic import steps_figure
    from parlab.units import format_bytes
    from parlab.comm import run_with_traffic

    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; choose one of {list(COLLECTIVES)}")
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
          f"{format_bytes(log.total_bytes)} in all; the busiest rank sends "
          f"{format_bytes(sent.max())} ({sent.max() / unit:.2f} x {unit} B), "
          f"the idlest {format_bytes(sent.min())}")
    return steps_figure(log, n=ranks, columns=min(steps, 5),
                        title=f"{collective} ({algorithm}) on {ranks} ranks, {what}")


def collective_explorer(collective: str = "all_gather", algorithm: str = "ring",
                        ranks: int = 4, elements: int = 16) -> Explorer:
    """Collective, algorithm, number of ranks and tensor size over the messages sent."""
    import ipywidgets as w

    from parlab.comm import ALGORITHMS

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
