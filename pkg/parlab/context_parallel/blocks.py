"""Attention one key/value block at a time: partial results merged by their log-sum-exp.

For one query row, softmax attention over keys split into blocks ``K_1, K_2, ...`` is

    o = sum_j exp(s_j - L) v_j,   L = log sum_j exp(s_j)      (s_j = q.k_j / sqrt(d)).

Each block gives its own normalised output ``o_b`` and log-sum-exp ``L_b``; two blocks merge
exactly as ``L = log(exp(L_a) + exp(L_b))``, ``o = exp(L_a - L) o_a + exp(L_b - L) o_b``
(the online softmax of Milakov and Gimelshein, 2018, used by FlashAttention and ring
attention). So a rank can see the keys one block at a time and still end with the exact
softmax. Positions are global: a causal mask lets query i see key j only when j <= i. A row
that sees no key of a block has ``L_b = -inf`` and weight 0.

The backward pass of one block needs only the final ``L`` and ``D = rowsum(dO * O)`` of its
query rows (FlashAttention-2's recomputation): ``P = exp(S - L)``, ``dV = P^T dO``,
``dS = P * (dO V^T - D)``, ``dQ = dS K / sqrt(d)``, ``dK = dS^T Q / sqrt(d)``.
Tensors are ``(batch, heads, tokens, d_head)``; :func:`check_qkv` holds the three methods'
inputs to that shape.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["block_forward", "block_backward", "merge", "visible", "check_qkv"]


def visible(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool) -> torch.Tensor | None:
    """The (queries x keys) mask of pairs a causal query sees (None: every pair)."""
    return (k_pos[None, :] <= q_pos[:, None]) if causal else None


def _scores(q, k, q_pos, k_pos, causal, scale):
    s = (q @ k.transpose(-2, -1)) * scale
    mask = visible(q_pos, k_pos, causal)  # positions may stay on the CPU: the mask moves
    return s if mask is None else s.masked_fill(~mask.to(s.device), float("-inf"))


def _probabilities(s, lse):
    """exp(s - lse), with rows that see nothing (lse = -inf) all zero instead of NaN."""
    finite = torch.isfinite(lse)
    p = torch.exp(s - torch.where(finite, lse, torch.zeros_like(lse))[..., None])
    return torch.where(finite[..., None], p, torch.zeros_like(p))


def block_forward(q, k, v, q_pos, k_pos, causal: bool, scale: float):
    """One block's normalised output and log-sum-exp per query row: ``(o_b, L_b)``."""
    s = _scores(q, k, q_pos, k_pos, causal, scale)
    lse = torch.logsumexp(s, dim=-1)
    return _probabilities(s, lse) @ v, lse


def merge(out, lse, out_b, lse_b):
    """Two partial results of the same query rows as one: ``(o, L)``."""
    new = torch.logaddexp(lse, lse_b)
    finite = torch.isfinite(new)
    safe = torch.where(finite, new, torch.zeros_like(new))
    weight_a = torch.where(finite, torch.exp(lse - safe), torch.zeros_like(new))
    weight_b = torch.where(finite, torch.exp(lse_b - safe), torch.zeros_like(new))
    return out * weight_a[..., None] + out_b * weight_b[..., None], new


def block_backward(q, k, v, q_pos, k_pos, causal: bool, scale: float, grad_out, lse, delta):
    """One block's share of the gradients: ``(dQ, dK, dV)``, given the final log-sum-exp
    ``lse`` and ``delta = rowsum(grad_out * out)`` of the query rows."""
    p = _probabilities(_scores(q, k, q_pos, k_pos, causal, scale), lse)
    grad_v = p.transpose(-2, -1) @ grad_out
    grad_s = p * (grad_out @ v.transpose(-2, -1) - delta[..., None])
    return grad_s @ k * scale, grad_s.transpose(-2, -1) @ q * scale, grad_v


def check_qkv(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              group=None) -> None:
    """q ``(batch, H, tokens, d_head)``; k and v ``(batch, H_kv, tokens, d_head)`` with
    ``H_kv`` dividing ``H`` (grouped-query attention: query head h uses key/value head
    ``h // (H / H_kv)``, as ``repeat_interleave`` and SDPA's ``enable_gqa`` do). Inside ranks,
    every rank of ``group`` (None: the world) must pass the same shapes: checked by one
    small exchange on a gloo group beside it, outside the traffic the method is measured by."""
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4 or \
            (q.shape[0], q.shape[2], q.shape[3]) != (k.shape[0], k.shape[2], k.shape[3]):
        raise ValueError(f"{name} needs q of shape (batch, heads, tokens, d_head) and k, v of "
                         f"one shape (batch, kv_heads, tokens, d_head); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{name}: {k.shape[1]} key/value heads do not divide the "
                         f"{q.shape[1]} query heads (grouped-query attention needs H % H_kv == 0)")
    if dist.is_initialized():
        _check_same_shapes(name, q, k, group)


#: Per process group, a gloo group over the same ranks for the shape check (kept with the
#: group it serves, so a new group at a recycled address is not mistaken for it).
_SIDE_GROUPS: dict[int, tuple] = {}


def _side_group(group):
    """A gloo group over ``group``'s ranks: its messages are not in the toy backend's traffic
    log (the bytes each method sends stay exactly its own) and any backend carries them."""
    group = group or dist.group.WORLD
    cached = _SIDE_GROUPS.get(id(group))
    if cached is None or cached[0] is not group:
        ranks = dist.get_process_group_ranks(group)
        cached = _SIDE_GROUPS[id(group)] = (group, dist.new_group(
            ranks, backend="gloo", use_local_synchronization=True))
    return cached[1]


def _check_same_shapes(name: str, q: torch.Tensor, k: torch.Tensor, group) -> None:
    """A ValueError on every rank, naming each rank's shapes, unless all ranks of ``group``
    pass shards of one shape (a mismatch would otherwise fail deep inside a collective)."""
    side = _side_group(group)
    shapes = [None] * dist.get_world_size(side)
    dist.all_gather_object(shapes, (tuple(q.shape), tuple(k.shape)), group=side)
    if any(s != shapes[0] for s in shapes):
        listed = "; ".join(f"rank {r}: q {sq}, k and v {sk}" for r, (sq, sk) in enumerate(shapes))
        raise ValueError(f"{name}: every rank of the group must pass shards of the same shapes "
                         f"(the same batch, heads, tokens per rank and d_head); got {listed}")
