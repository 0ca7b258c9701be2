"""The communication of tensor parallelism, as autograd functions that know their backward.

Why this module exists: a collective in a forward pass always has a partner in the backward
pass, and getting that partner wrong gives gradients that are silently off by a factor of
the number of ranks (or missing a rank's share). Megatron-LM names the pairs, and so do we:

================================  ========================  ==================================
function                          forward                   backward
================================  ========================  ==================================
:func:`copy_to_region`            identity                  all-reduce (sum)
:func:`reduce_from_region`        all-reduce (sum)          identity
:func:`gather_from_region`        all-gather along ``dim``  keep this rank's slice
:func:`scatter_to_region`         keep this rank's slice    all-gather along ``dim``
:func:`gather_for_use`            all-gather along ``dim``  reduce-scatter (sum) along ``dim``
:func:`reduce_scatter_to_region`  reduce-scatter (sum)      all-gather along ``dim``
:func:`broadcast_from`            broadcast from ``src``    reduce (sum) to ``src``
================================  ========================  ==================================

The rule behind the table: a tensor that every rank holds in full ("replicated") carries,
in this package, the *same* full gradient on every rank, as in Megatron. When ranks start
using a replicated tensor in different ways (each multiplies it by its own slice of a
weight), each rank's gradient is only a part of the true one, so the parts must be summed:
that is the all-reduce in the backward of ``copy_to_region``. ``gather_for_use`` is the
same idea for a gathered tensor that each rank then uses differently: each rank's gradient
for *its* slice is the sum of what every rank computed for that slice (the book's Q and K
follow this rule; :mod:`parlab.tensor_parallel.attention` gathers them again in the backward pass, as
the chapter says, instead of keeping them). ``broadcast_from`` is ``copy_to_region`` for a
tensor that starts on one rank only (the book's embedding vectors on A1).

Sequence parallelism (Korthikanti et al., 2022) uses the last two rows along the sequence
dimension: ``gather_for_use`` is its ``g`` (Megatron-LM's
``gather_from_sequence_parallel_region``: all-gather the sequence shards before a
column-parallel layer) and ``reduce_scatter_to_region`` its ``g-bar``
(``reduce_scatter_to_sequence_parallel_region``: sum a row-parallel layer's partial outputs
and keep only this rank's tokens). Together they move the bytes of the one all-reduce they
replace: a ring all-reduce is a reduce-scatter followed by an all-gather.

All functions take a process ``group`` (None: every rank) and work on any backend: gloo,
NCCL, or the traffic-logging "toy" backend, which is how the chapter counts their bytes.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.autograd import Function

__all__ = ["copy_to_region", "reduce_from_region", "gather_from_region", "scatter_to_region",
           "gather_for_use", "reduce_scatter_to_region", "broadcast_from", "all_gather_cat",
           "local_slice", "reduce_scatter_slice"]


def _size_rank(group) -> tuple[int, int]:
    return dist.get_world_size(group), dist.get_rank(group)


def all_gather_cat(x: torch.Tensor, dim: int = -1, group=None) -> torch.Tensor:
    """Every rank's ``x`` concatenated along ``dim`` in rank order (equal shapes required)."""
    size, _ = _size_rank(group)
    if size == 1:
        return x
    pieces = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(pieces, x.contiguous(), group=group)
    return torch.cat(pieces, dim=dim)


def local_slice(x: torch.Tensor, dim: int = -1, group=None) -> torch.Tensor:
    """This rank's equal slice of ``x`` along ``dim``."""
    size, rank = _size_rank(group)
    if x.shape[dim] % size:
        raise ValueError(f"dim {dim} of size {x.shape[dim]} does not split into {size} equal "
                         f"slices; valid numbers of ranks divide {x.shape[dim]}")
    return x.chunk(size, dim=dim)[rank].contiguous()


def reduce_scatter_slice(x: torch.Tensor, dim: int = -1, group=None) -> torch.Tensor:
    """This rank's equal slice along ``dim`` of the sum of every rank's ``x`` (reduce-scatter)."""
    size, rank = _size_rank(group)
    if size == 1:
        return x
    inputs = [c.contiguous() for c in x.chunk(size, dim=dim)]
    out = torch.empty_like(inputs[rank])
    dist.reduce_scatter(out, inputs, group=group)
    return out


def _all_reduce(x: torch.Tensor, group) -> torch.Tensor:
    if dist.get_world_size(group) > 1:
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
    return x


def _conjugate(name: str, forward, backward):
    """An autograd Function ``(x, dim, group)`` running ``forward`` now and ``backward`` later."""

    def fwd(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return forward(x, dim, group)

    def bwd(ctx, grad):
        return backward(grad, ctx.dim, ctx.group), None, None

    return type(name, (Function,), {"forward": staticmethod(fwd), "backward": staticmethod(bwd)})


def _identity(x, dim, group):
    return x.view_as(x)


def _sum(x, dim, group):
    return _all_reduce(x, group)


# The table of the module docstring, row by row: (forward, backward).
_CopyToRegion = _conjugate("_CopyToRegion", _identity, _sum)
_ReduceFromRegion = _conjugate("_ReduceFromRegion", _sum, _identity)
_GatherFromRegion = _conjugate("_GatherFromRegion", all_gather_cat, local_slice)
_ScatterToRegion = _conjugate("_ScatterToRegion", local_slice, all_gather_cat)
_GatherForUse = _conjugate("_GatherForUse", all_gather_cat, reduce_scatter_slice)
_ReduceScatterToRegion = _conjugate("_ReduceScatterToRegion", reduce_scatter_slice,
                                    all_gather_cat)


class _BroadcastFrom(Function):
    @staticmethod
    def forward(ctx, x, src, group):
        ctx.src, ctx.group = src, group
        out = x.detach().clone().contiguous()
        if dist.get_world_size(group) > 1:
            dist.broadcast(out, src=dist.get_global_rank(group, src) if group else src,
                           group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        if dist.get_world_size(ctx.group) > 1:
            dst = dist.get_global_rank(ctx.group, ctx.src) if ctx.group else ctx.src
            dist.reduce(grad, dst=dst, group=ctx.group)
            if dist.get_rank(ctx.group) != ctx.src:
                grad = torch.zeros_like(grad)  # this rank had no input; nothing flows back
        return grad, None, None


def copy_to_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """Megatron's ``f``: pass a replicated tensor into per-rank work; all-reduce its gradient."""
    return _CopyToRegion.apply(x, None, group)


def reduce_from_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """Megatron's ``g``: sum the ranks' partial results (all-reduce); the gradient passes as is."""
    return _ReduceFromRegion.apply(x, None, group)


def gather_from_region(x: torch.Tensor, dim: int = -1, group=None) -> torch.Tensor:
    """All-gather slices into a replicated tensor; backward keeps this rank's gradient slice.

    Right when what follows is replicated (every rank computes the same thing from it).
    """
    return _GatherFromRegion.apply(x, dim, group)


def scatter_to_region(x: torch.Tensor, dim: int = -1, group=None) -> torch.Tensor:
    """Keep this rank's slice of a replicated tensor; backward all-gathers the gradient."""
    return _ScatterToRegion.apply(x, dim, group)


def gather_for_use(x: torch.Tensor, dim: int = -1, group=None) -> torch.Tensor:
    """All-gather slices that each rank then uses *differently*; backward reduce-scatters.

    Each rank's gradient of the gathered tensor is partial, so the slice a rank owns gets
    the sum over ranks (a reduce-scatter moves half the bytes of an all-reduce to do it).
    """
    return _GatherForUse.apply(x, dim, group)


def reduce_scatter_to_region(x: torch.Tensor, dim: int = -1, group=None) -> torch.Tensor:
    """Sum every rank's partial ``x`` and keep this rank's slice along ``dim``; backward
    all-gathers the gradient (each rank's slice of the sum depended on every rank's ``x``)."""
    return _ReduceScatterToRegion.apply(x, dim, group)


def broadcast_from(x: torch.Tensor, src: int = 0, group=None) -> torch.Tensor:
    """Send ``src``'s tensor to every rank (others pass a placeholder of the same shape).

    Backward sums the ranks' gradients onto ``src`` (a reduce); the other ranks get zeros,
    since their placeholder was never an input. Every rank must call this, and each rank's
    placeholder must require grad if ``src``'s does, so that every rank joins the backward.
    """
    return _BroadcastFrom.apply(x, src, group)
