"""DeepSpeed-Ulysses: trade the sequence split for a head split, attend, trade back.

Each of the ``p`` ranks holds ``S/p`` tokens (a :mod:`layout
<parlab.context_parallel.layouts>`) of all ``H`` query heads and ``H_kv`` key/value heads.
Attention heads are independent, so (Jacobs et al., 2023):

1. an all-to-all sends head group j of this rank's tokens to rank j: rank j ends with all
   ``S`` tokens of query heads ``[j H/p, (j+1) H/p)`` and key/value heads
   ``[j H_kv/p, (j+1) H_kv/p)`` (grouped-query attention keeps its pairing: query head h
   uses key/value head ``h // (H/H_kv)``, which lands on the same rank);
2. every rank runs ordinary attention over the whole sequence for its heads;
3. a second all-to-all, the inverse, brings the output back to ``S/p`` tokens of all heads.

After step 1 the tokens are in rank order of the shards (rank 0's, then rank 1's, ...), which
is sequence order only for the contiguous layout. For a causal mask the other layouts are put
into sequence order first (and the output back into rank order), so attention runs with
its causal flag, as a FlashAttention kernel does: no T x T mask is built or kept for the
backward pass (a boolean mask would become an additive T x T tensor that
``scaled_dot_product_attention`` keeps, ``e T^2`` bytes per layer: 34 GB at 128K tokens in
bf16). The backward pass is the same two all-to-alls in reverse (the gradient of a row goes
back where the row came from), and attention's own backward in between.

Here Q, K and V travel in one all-to-all (DeepSpeed's ``DistributedAttention`` issues one per
tensor: the same bytes, a third of the messages). Heads are the unit, so ``p`` must divide
``H_kv`` (and so ``H``): at most ``H_kv`` ranks. Megatron-Core / Transformer Engine call it
``cp_comm_type="a2a"``; ``"a2a+p2p"`` nests it inside ring attention to go past that limit.

Why its bytes per link stay constant when the sequence and the GPUs grow together: an
all-to-all of ``m`` bytes per rank sends ``m (p-1)/p`` of them, ``m/p`` to each other rank;
here ``m`` is this rank's Q, K, V or O shard, proportional to ``S/p``. So each rank (and its
link to the switch) sends under ``4 (S/p) H d_head`` elements per sequence and layer, forward
(multi-head attention; DeepSpeed's ``4Nh/P``): constant when ``S/p`` is. Double the sequence
and the ranks, and the bytes per link stay put. Ring and all-gather attention send
``(p - 1) 2b`` per rank, ``b`` the K shard (also proportional to ``S/p``): about
``2 S H_kv d_head`` elements, growing with the sequence. See :func:`ulysses_bytes`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from parlab.checks import check_count, check_index
from parlab.comm import all_to_all
from parlab.context_parallel.blocks import check_qkv
from parlab.context_parallel.layouts import positions

__all__ = ["ulysses_attention", "ulysses_bytes"]


def _check_heads(kv_heads: int, world: int) -> None:
    if kv_heads % world:
        raise ValueError(f"ulysses_attention gives each rank whole heads: {kv_heads} key/value "
                         f"heads do not split evenly over {world} ranks; use a number of ranks "
                         f"that divides {kv_heads} (at most {kv_heads}, the number of key/value "
                         f"heads), or ring or all-gather attention, which split the sequence")


def _blocks(x: torch.Tensor, n: int) -> torch.Tensor:
    """(batch, h, t, d) -> (n, batch, h/n, t, d): head group j first, for rank j."""
    b, h, t, d = x.shape
    return x.reshape(b, n, h // n, t, d).movedim(1, 0)


def _exchange(x: torch.Tensor, group) -> torch.Tensor:
    """Block j of dim 0 to rank j; block s of the result came from rank s."""
    n = x.shape[0]
    return all_to_all(x.contiguous(), [1] * n, [1] * n, group)


def _sequence_to_heads(q, k, v, group):
    """All heads of S/p tokens -> all S tokens (in rank order of the shards) of H/p heads."""
    n = dist.get_world_size(group)
    sizes = [q.shape[1] // n, k.shape[1] // n, v.shape[1] // n]
    got = _exchange(torch.cat([_blocks(q, n), _blocks(k, n), _blocks(v, n)], dim=2), group)
    # (n, batch, heads, t, d): block s holds rank s's tokens -> (batch, heads, n t, d)
    b, t, d = got.shape[1], got.shape[3], got.shape[4]
    whole = got.movedim(0, 2).reshape(b, sum(sizes), n * t, d)
    return whole.split(sizes, dim=1)


def _heads_to_sequence(o, group):
    """All S tokens of H/p heads -> S/p tokens (this rank's) of all H heads."""
    n = dist.get_world_size(group)
    b, h, s, d = o.shape
    back = _exchange(o.reshape(b, h, n, s // n, d).movedim(2, 0), group)
    # block j: head group j of this rank's tokens -> (batch, n h, t, d)
    return back.movedim(0, 1).reshape(b, n * h, s // n, d)


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True,
                      layout: str = "contiguous", group=None,
                      scale: float | None = None) -> torch.Tensor:
    """Attention over the whole sequence by DeepSpeed-Ulysses' two all-to-alls.

    ``q``: this rank's shard ``(batch, H, S/p, d_head)``; ``k``, ``v``: ``(batch, H_kv, S/p,
    d_head)``, cut by ``layout`` (:func:`parlab.context_parallel.shard`); ``H_kv`` divides
    ``H`` (grouped-query attention) and the ``p`` ranks of ``group`` divide ``H_kv``
    (ValueError otherwise, before any transfer). Returns this rank's rows of the output, in
    the same layout; equal to ``scaled_dot_product_attention`` on the whole sequence, forward
    and backward (gradients flow to this rank's q, k and v).
    """
    check_qkv("ulysses_attention", q, k, v, group)
    n = dist.get_world_size(group)
    _check_heads(k.shape[1], n)
    order = torch.cat([positions(q.shape[-2] * n, s, n, layout) for s in range(n)])
    qh, kh, vh = _sequence_to_heads(q, k, v, group)
    shuffled = causal and layout != "contiguous"
    if shuffled:  # into sequence order: row i of the sorted tensors is position i
        by_position = torch.argsort(order).to(q.device)
        qh, kh, vh = (x.index_select(-2, by_position) for x in (qh, kh, vh))
    out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal, scale=scale,
                                         enable_gqa=q.shape[1] != k.shape[1])
    if shuffled:  # back into rank order: row j is position order[j]
        out = out.index_select(-2, order.to(q.device))
    return _heads_to_sequence(out, group)


def ulysses_bytes(shard_bytes: int, world: int, kv_shard_bytes: int | None = None) -> dict:
    """Bytes one rank sends in Ulysses attention, per pass.

    ``shard_bytes`` = ``b_q``: bytes of this rank's Q shard, ``batch * H * S/p * d_head *
    bytes per element`` (its output shard is as big); ``kv_shard_bytes`` = ``b_kv``: of its K
    shard (the same for V; default ``b_q``, multi-head attention). An all-to-all sends all
    but the ``1/p`` that stays home:

    - forward: Q, K, V out (``b_q + 2 b_kv``) and O back (``b_q``):
      ``(p - 1)/p (2 b_q + 2 b_kv)`` bytes;
    - backward: dO out (``b_q``), then dQ, dK, dV back (``b_q + 2 b_kv``): the same.

    With ``b_q`` proportional to ``S/p``, constant when the sequence and the ranks grow
    together (DeepSpeed-Ulysses' ``4Nh/P`` per link, forward, for multi-head attention).
    """
    check_index("shard_bytes", shard_bytes, "bytes")
    check_count("world", world, "ranks")
    kv = shard_bytes if kv_shard_bytes is None else check_index("kv_shard_bytes",
                                                                kv_shard_bytes, "bytes")
    sent = (world - 1) * (2 * shard_bytes + 2 * kv)
    per_pass = sent // world if sent % world == 0 else sent / world
    return {"forward": per_pass, "backward": per_pass}
