"""How a sequence is cut among the ranks of context parallelism, and the causal work each gets.

A sequence of ``S`` tokens on ``p`` ranks, three ways (each rank gets ``S/p`` tokens):

- ``"contiguous"``: rank r holds tokens ``[r S/p, (r+1) S/p)``;
- ``"zigzag"``: the sequence is cut into ``2p`` chunks and rank r holds chunks ``r`` and
  ``2p - 1 - r`` (one early, one late: Llama 3's context parallelism, and ring attention's
  usual load balance); ``S`` must divide by ``2p``;
- ``"striped"``: rank r holds tokens ``r, r + p, r + 2p, ...`` (Brandon et al., 2023).

Every token keeps its global position: the causal mask compares positions, not indices in the
shard, and :func:`unshard` puts outputs back in the original order.

Causal work is counted in unmasked query-key pairs (score elements), the unit of both matrix
products of attention (``QK^T`` and ``PV`` each cost ``2 d_head`` FLOPs per pair). Counted
in blocks of ``S/p`` by ``S/p`` with a diagonal block as half, the contiguous layout gives
rank r ``r + 1/2`` blocks: the last rank does ``2p - 1`` times the first.
"""

from __future__ import annotations

import torch

from parlab.checks import check_choice, check_count

__all__ = ["LAYOUTS", "positions", "shard", "unshard", "causal_pairs"]

LAYOUTS = ("contiguous", "zigzag", "striped")


def _check(seq: int, world: int, layout: str) -> None:
    check_choice("layout", layout, LAYOUTS)
    check_count("seq", seq)
    check_count("world", world)
    parts = 2 * world if layout == "zigzag" else world
    if seq % parts:
        what = "chunks of the zigzag layout (2 per rank)" if layout == "zigzag" else "ranks"
        raise ValueError(f"a sequence of {seq} tokens does not split evenly into the {parts} "
                         f"{what}: use a length that {parts} divides")


def positions(seq: int, rank: int, world: int, layout: str = "contiguous") -> torch.Tensor:
    """The global positions of the tokens rank ``rank`` holds, in the order it holds them."""
    _check(seq, world, layout)
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not one of the {world} ranks (0 to {world - 1})")
    if layout == "contiguous":
        size = seq // world
        return torch.arange(rank * size, (rank + 1) * size)
    if layout == "striped":
        return torch.arange(rank, seq, world)
    chunk = seq // (2 * world)
    return torch.cat([torch.arange(rank * chunk, (rank + 1) * chunk),
                      torch.arange((2 * world - 1 - rank) * chunk, (2 * world - rank) * chunk)])


def shard(x: torch.Tensor, rank: int, world: int, layout: str = "contiguous",
          dim: int = -2) -> torch.Tensor:
    """Rank ``rank``'s tokens of ``x`` along ``dim`` (the sequence dimension)."""
    index = positions(x.shape[dim], rank, world, layout).to(x.device)
    return x.index_select(dim, index)


def unshard(shards, layout: str = "contiguous", dim: int = -2) -> torch.Tensor:
    """The inverse of :func:`shard`: every rank's shard, in rank order, back in sequence order."""
    world = len(shards)
    seq = sum(s.shape[dim] for s in shards)
    order = torch.cat([positions(seq, r, world, layout) for r in range(world)])
    stacked = torch.cat(list(shards), dim=dim)
    return stacked.index_select(dim, torch.argsort(order).to(stacked.device))


def causal_pairs(seq: int, world: int, layout: str = "contiguous") -> list[int]:
    """Per rank, the unmasked (query, key) pairs of causal attention over the whole sequence:
    a query at position i sees keys 0..i, so i + 1 pairs."""
    return [int((positions(seq, r, world, layout) + 1).sum()) for r in range(world)]
