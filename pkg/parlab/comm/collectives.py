"""The four collectives of chapter 00, run on a rank and checked against their definition.

:func:`one_collective` is what chapter 00's explorer and exercise run on every rank: each
rank fills a tensor with its rank + 1, calls the collective, and says whether what it got
equals what the collective must produce, computed locally without any communication.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from parlab.checks import check_count

__all__ = ["COLLECTIVES", "one_collective"]

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
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; choose one of {list(COLLECTIVES)}")
    check_count("elements", elements, "the tensor's length")
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
