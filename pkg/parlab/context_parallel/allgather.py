"""All-gather context parallelism (Llama 3): every rank gathers the whole sequence's K and V.

Each of the ``p`` ranks holds ``S/p`` tokens of Q, K and V (a :mod:`layout
<parlab.context_parallel.layouts>`; Llama 3 uses zigzag, two chunks per rank). Forward:

    K_all = all_gather(K_r),  V_all = all_gather(V_r)        (rank order of the shards)
    O_r = softmax(Q_r K_all^T scale + M_r) V_all,   M_r[i, j] = 0 if pos_j <= pos_i else -inf

with ``pos`` the global positions: ``pos_i`` of this rank's queries, ``pos_j`` of the gathered
keys, rank s's shard after rank s-1's (``positions`` of every rank, concatenated). Nothing is
merged across ranks: each rank's queries meet every key at once, and the result is exact
softmax attention (any mask works the same way, a document mask too).

Backward: ``dQ_r`` and the rank's share of ``dK_all``, ``dV_all`` come from its own
attention. The key of position j got a gradient from every rank's queries, so

    dK_s = sum over ranks r of dK_all^(r)[rows of rank s]      (same for V)

which is a reduce-scatter (sum) of the gathered gradient: the backward of an all-gather. K and
V travel together (stacked), one all-gather forward and one reduce-scatter backward.

Why Llama 3 (Dubey et al., 2024, section 3.3.2) chose it over ring attention: with grouped-query
attention K and V are small next to Q (Llama 3 405B: 8 key/value heads for 128 query heads),
so the exposed all-gather is short, and any mask is easy. The price: each rank holds the
whole sequence's K and V (``p`` times a shard) for the attention and its backward. In
Megatron-Core / Transformer Engine this is ``cp_comm_type="all_gather"`` (ring attention is
``"p2p"``, Ulysses ``"a2a"``).

Bytes per rank, ring algorithms (the toy backend's default, and NCCL's): see
:func:`all_gather_bytes`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.autograd import Function

from parlab.checks import check_count, check_index
from parlab.context_parallel.blocks import check_qkv, visible
from parlab.context_parallel.layouts import positions

__all__ = ["all_gather_attention", "all_gather_bytes"]


def _all_gather(output, tensor, group):
    # torch 2.13 names it all_gather_single (all_gather_into_tensor warns); >= 2.11 the latter
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(
        output, tensor, group=group)


def _reduce_scatter(output, tensor, group):
    (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(
        output, tensor, op=dist.ReduceOp.SUM, group=group)


class _GatherRows(Function):
    """Every rank's rows (dim 0) stacked in rank order; backward: reduce-scatter of the sum.

    Contiguous in both directions: the collectives read a tensor's storage as it lies, and
    the gradient can arrive as a strided view.
    """

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        x = x.contiguous()
        out = x.new_empty((dist.get_world_size(group) * x.shape[0], *x.shape[1:]))
        _all_gather(out, x, group)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        out = grad.new_empty((grad.shape[0] // dist.get_world_size(ctx.group), *grad.shape[1:]))
        _reduce_scatter(out, grad, ctx.group)
        return out, None


def all_gather_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                         causal: bool = True, layout: str = "contiguous", group=None,
                         scale: float | None = None) -> torch.Tensor:
    """Attention of this rank's queries to the whole sequence's keys, by all-gathering K and V.

    ``q``: this rank's shard ``(batch, H, S/p, d_head)``; ``k``, ``v``: ``(batch, H_kv, S/p,
    d_head)`` with ``H_kv`` dividing ``H`` (grouped-query attention), cut by ``layout``
    (:func:`parlab.context_parallel.shard`); every rank of ``group`` calls it with the same
    shapes. Returns this rank's rows of the output, in the same layout; equal to
    ``scaled_dot_product_attention`` on the whole sequence, forward and backward (gradients
    flow to this rank's q, k and v).
    """
    check_qkv("all_gather_attention", q, k, v, group)
    n, r = dist.get_world_size(group), dist.get_rank(group)
    owners = [positions(q.shape[-2] * n, s, n, layout) for s in range(n)]
    # tokens first, so rank s's block lands at rows [s S/p, (s+1) S/p) of the gathered tensor
    kv = _GatherRows.apply(torch.stack([k, v]).movedim(-2, 0), group).movedim(0, -2)
    mask = visible(owners[r], torch.cat(owners), causal)
    return F.scaled_dot_product_attention(
        q, kv[0], kv[1], attn_mask=None if mask is None else mask.to(q.device), scale=scale,
        enable_gqa=q.shape[1] != k.shape[1])


def all_gather_bytes(shard_bytes: int, world: int) -> dict:
    """Bytes one rank sends in all-gather attention, per pass, with ring collectives.

    ``shard_bytes`` = ``b``: bytes of this rank's K shard (the same for V), ``batch * H_kv *
    S/p * d_head * bytes per element``. K and V travel stacked, ``2b`` per rank.

    - forward, ring all-gather of ``2b`` per rank: ``p - 1`` steps, each sending one rank's
      ``2b`` to the next: ``(p - 1) 2b`` bytes;
    - backward, ring reduce-scatter of the ``2pb`` gathered gradient: ``p - 1`` steps of one
      chunk of ``2b``: ``(p - 1) 2b`` bytes.

    Ring attention sends the same forward and ``(2p - 1) 2b`` backward (K and V go round
    again with dK, dV): all-gather saves that by keeping the gathered K and V in memory.
    Per rank ``(p - 1) 2b`` with ``b`` proportional to ``S/p``: about ``2 S/p (p-1)`` tokens'
    K and V, which grows with ``S`` when sequence and ranks grow together.
    """
    check_index("shard_bytes", shard_bytes, "bytes")
    check_count("world", world, "ranks")
    return {"forward": (world - 1) * 2 * shard_bytes, "backward": (world - 1) * 2 * shard_bytes}
