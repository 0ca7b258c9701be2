"""Ring attention: queries stay, key/value blocks travel round the ring of ranks.

Each of the ``p`` ranks holds ``S/p`` tokens of Q, K and V (a :mod:`layout
<parlab.context_parallel.layouts>`). In ``p`` steps every rank attends its own queries to
every rank's key/value block: at step t rank r holds the block of rank ``r - t`` (mod p),
computes with it while sending it on to rank ``r + 1`` and receiving the next one from
``r - 1`` (the transfer is posted before the block's arithmetic, so the two overlap where the
backend moves bytes in the background), and merges the block's result by log-sum-exp
(:mod:`parlab.context_parallel.blocks`). With a causal mask only the rectangle of query rows
and key columns that see each other is computed: a block wholly in the future costs
nothing, which is the load imbalance of the contiguous layout (rank r computes r + 1
blocks), and the zigzag layout's off-diagonal steps cost half a block each, so every rank
computes (p + 1)/2 blocks. The striped layout balances the unmasked pairs but leaves no
rectangle to cut: every step computes (nearly) a whole block, about half of it masked.

Backward: the queries stay, so dQ adds up where it is. The key/value blocks go round again,
each with the dK and dV gathered so far; after its last step a rank sends the dK, dV it holds
on to their owner, which is its next rank. Per rank, with ``b`` the bytes of one K (or V)
shard: forward ``(p - 1) 2b``, backward ``(p - 1) 2b`` for K, V and ``p 2b`` for dK, dV.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.autograd import Function

from parlab.context_parallel.blocks import block_backward, block_forward, check_qkv, merge
from parlab.context_parallel.layouts import positions

__all__ = ["ring_attention", "ring_bytes", "ring_schedule"]

_KV_TAG, _GRAD_TAG = 1, 2


def _exchange(tensor, group, tag):
    """Send ``tensor`` to the next rank and receive the previous rank's into a new buffer;
    returns (buffer, requests) without waiting."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    peer = (lambda i: i) if group is None else (lambda i: dist.get_global_rank(group, i))
    received = torch.empty_like(tensor)
    requests = [dist.isend(tensor, peer((r + 1) % n), group=group, tag=tag),
                dist.irecv(received, peer((r - 1) % n), group=group, tag=tag)]
    return received, requests


def _wait(requests):
    for request in requests:
        request.wait()


def _heads(kv, q):
    """Grouped-query attention: each key/value head serves H/H_kv query heads (after the
    transfer: only the H_kv heads travel)."""
    return kv if kv.shape[1] == q.shape[1] else kv.repeat_interleave(q.shape[1] // kv.shape[1], 1)


def _fold(grad, kv):
    """The gradient of the repeated heads, summed back onto each key/value head."""
    b, h, t, d = grad.shape
    return grad if h == kv.shape[1] else grad.view(b, kv.shape[1], h // kv.shape[1], t, d).sum(2)


def _visible(q_pos, k_pos, causal):
    """The query rows that see some key of the block and the key columns that some query
    sees (index tensors): only that rectangle is computed. Without a mask, all of both; with
    a causal one, nothing when the block lies wholly in the future, and half a block for
    each off-diagonal step of the zigzag layout (its early chunk sees one half, its late
    chunk the other)."""
    if not causal:
        return torch.arange(len(q_pos)), torch.arange(len(k_pos))
    return ((q_pos >= k_pos.min()).nonzero().flatten(),
            (k_pos <= q_pos.max()).nonzero().flatten())


def _rectangle(q, kv, q_pos, k_pos, causal):
    """(rows, cols, k, v) of the block held at this step: the visible rectangle
    (:func:`_visible`) and its key/value columns, heads repeated for grouped-query
    attention; None when no query sees any key of the block."""
    rows, cols = _visible(q_pos, k_pos, causal)
    if not (len(rows) and len(cols)):
        return None
    return rows, cols, _heads(kv[0][..., cols, :], q), _heads(kv[1][..., cols, :], q)


class _RingAttention(Function):
    @staticmethod
    def forward(ctx, q, k, v, layout, causal, scale, group):
        n, r = dist.get_world_size(group), dist.get_rank(group)
        seq = q.shape[-2] * n
        owners = [positions(seq, s, n, layout) for s in range(n)]
        q_pos = owners[r]
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
        kv = torch.stack([k, v]).contiguous()
        for step in range(n):
            if step < n - 1:
                incoming, requests = _exchange(kv, group, _KV_TAG)
            k_pos = owners[(r - step) % n]
            block = _rectangle(q, kv, q_pos, k_pos, causal)
            if block:
                rows, cols, k_block, v_block = block
                part = block_forward(q[..., rows, :], k_block, v_block, q_pos[rows],
                                     k_pos[cols], causal, scale)
                o, l = merge(out[..., rows, :], lse[..., rows], *part)
                out, lse = out.index_copy(-2, rows, o), lse.index_copy(-1, rows, l)
            if step < n - 1:
                _wait(requests)
                kv = incoming
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.layout, ctx.causal, ctx.scale, ctx.group = layout, causal, scale, group
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        group, causal, scale = ctx.group, ctx.causal, ctx.scale
        n, r = dist.get_world_size(group), dist.get_rank(group)
        owners = [positions(q.shape[-2] * n, s, n, ctx.layout) for s in range(n)]
        q_pos, grad_out = owners[r], grad_out.contiguous()
        delta = (grad_out * out).sum(-1)
        grad_q = torch.zeros_like(q)
        kv = torch.stack([k, v]).contiguous()
        grad_kv = torch.zeros_like(kv)
        for step in range(n):
            if step < n - 1:
                incoming, requests = _exchange(kv, group, _KV_TAG)
            k_pos = owners[(r - step) % n]
            block = _rectangle(q, kv, q_pos, k_pos, causal)
            if block:
                rows, cols, k_block, v_block = block
                dq, dk, dv = block_backward(q[..., rows, :], k_block, v_block, q_pos[rows],
                                            k_pos[cols], causal, scale, grad_out[..., rows, :],
                                            lse[..., rows], delta[..., rows])
                grad_q.index_add_(-2, rows, dq)
                grad_kv[0].index_add_(-2, cols, _fold(dk, k))
                grad_kv[1].index_add_(-2, cols, _fold(dv, k))
            if n == 1:
                break
            # the block's gradients travel with it; after the last step, home to its owner
            grad_incoming, grad_requests = _exchange(grad_kv, group, _GRAD_TAG)
            _wait(grad_requests + (requests if step < n - 1 else []))
            grad_kv = grad_incoming
            if step < n - 1:
                kv = incoming
        return grad_q, grad_kv[0], grad_kv[1], None, None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True,
                   layout: str = "contiguous", group=None,
                   scale: float | None = None) -> torch.Tensor:
    """Attention of this rank's queries to the whole sequence's keys, by ring attention.

    ``q``: this rank's shard, ``(batch, H, S/p, d_head)``; ``k``, ``v``: ``(batch, H_kv, S/p,
    d_head)`` with ``H_kv`` dividing ``H`` (grouped-query attention: only the key/value heads
    travel), cut by ``layout``
    (:func:`parlab.context_parallel.shard`); every rank of ``group`` calls it with the same
    shapes. Returns this rank's rows of the output, in the same layout; equal to
    ``scaled_dot_product_attention`` on the whole sequence, forward and backward.
    """
    check_qkv("ring_attention", q, k, v, group)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return _RingAttention.apply(q, k, v, layout, causal, scale, group)


def ring_bytes(shard_bytes: int, world: int) -> dict:
    """Bytes one rank sends in ring attention, per pass, from the bytes of one K (or V) shard."""
    return {"forward": (world - 1) * 2 * shard_bytes,
            "backward": (world - 1) * 2 * shard_bytes + world * 2 * shard_bytes}


def ring_schedule(seq: int, world: int, layout: str = "contiguous",
                  causal: bool = True) -> list[list[float]]:
    """``share[r][t]``: the part of an ``S/p x S/p`` block rank r computes at step t, when it
    holds rank ``r - t``'s keys and values (1 whole, 0 skipped; the rectangle of rows and
    columns that see each other, as :func:`ring_attention` computes it)."""
    owners = [positions(seq, s, world, layout) for s in range(world)]
    chunk = seq // world
    shares = []
    for r in range(world):
        row = []
        for t in range(world):
            rows, cols = _visible(owners[r], owners[(r - t) % world], causal)
            row.append(len(rows) * len(cols) / chunk ** 2)
        shares.append(row)
    return shares
