"""Chapter 00 explorer: one collective on real ranks, every message it sends, step by step.

Follows :func:`parlab.widgets.explore`. Each setting (collective, algorithm, ranks, tensor
size) launches real ranks on the toy backend, checks every rank's answer against the sum or
copy it must hold, and draws the logged messages one panel per step. The reader sees the
ring's 2(n-1) small steps, the naive root's two big ones, and the tree's log2(n) rounds grow
or shrink as the ranks change, instead of taking the formulas on trust.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import Explorer, explore

__all__ = ["COLLECTIVES", "one_collective", "draw_collective", "collective_explorer"]

#: The collectives the explorer runs, and what each rank holds afterwards.
COLLECTIVES = {
    "all_reduce": "every rank holds the sum of all tensors",
    "all_gather": "every rank holds every rank's tensor, in rank order",
    "reduce_scatter": "rank r holds the sum of everyone's piece r",
    "broadcast": "every rank holds rank 0's tensor",
}


def one_collective(collective: str, elements: int) -> bool:
    """On each rank: run ``collective`` on float32 tensors filled with rank + 1; is it right?

    ``elements`` is the tensor's length, or each rank's share of it for all_gather (the
    input) and reduce_scatter (the output). Returns whether this rank's result equals what
    the collective must produce, computed here without any communication.
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    mine = torch.full((elements,), float(rank + 1))
    total = n * (n + 1) / 2  # 1 + 2 + ... + n
    if collective == "all_reduce":
        dist.all_reduce(mine)
        return bool(torch.all(mine == total))
    if collective == "all_gather":
        pieces = [torch.empty(elements) for _ in range(n)]
        dist.all_gather(pieces, mine)
        return all(bool(torch.all(p == r + 1)) for r, p in enumerate(pieces))
    if collective == "reduce_scatter":
        out = torch.empty(elements)
        dist.reduce_scatter(out, [mine.clone() for _ in range(n)])
        return bool(torch.all(out == total))
    if collective == "broadcast":
        dist.broadcast(mine, src=0)
        return bool(torch.all(mine == 1))
    raise ValueError(f"unknown collective {collective!r}; choose one of {list(COLLECTIVES)}")


def draw_collective(collective: str = "all_gather", algorithm: str = "ring", ranks: int = 4,
                    elements: int = 16):
    """Run the collective on ``ranks`` toy-backend ranks; print the totals; draw each step."""
    from ..plots.traffic import steps_figure
    from ..traffic import format_bytes, run_with_traffic

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

    from ..toy_checks import ALGORITHMS

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
