"""An all-to-all that autograd can go through, with uneven splits.

Forward: rank r sends rows ``input_splits[s]`` of its input to rank s and receives
``output_splits[s]`` rows from rank s, stacked in rank order. Backward: the same exchange
the other way round (the gradient of a row goes back to where the row came from), so the
splits swap. Written as our own Function instead of ``torch.distributed.nn.all_to_all_single``:
inputs and gradients are made contiguous here, since gloo reads a tensor's storage as it
lies, and a gradient arriving as a strided view (an ``expand`` or a transpose upstream)
would otherwise be sent in the wrong order.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.autograd import Function

__all__ = ["all_to_all"]


def _exchange(x: torch.Tensor, output_splits, input_splits, group) -> torch.Tensor:
    x = x.contiguous()
    out = x.new_empty((sum(output_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x, list(output_splits), list(input_splits), group=group)
    return out


class _AllToAll(Function):
    @staticmethod
    def forward(ctx, x, output_splits, input_splits, group):
        ctx.splits, ctx.group = (tuple(output_splits), tuple(input_splits)), group
        return _exchange(x, output_splits, input_splits, group)

    @staticmethod
    def backward(ctx, grad):
        output_splits, input_splits = ctx.splits
        return _exchange(grad, input_splits, output_splits, ctx.group), None, None, None


def all_to_all(x: torch.Tensor, output_splits, input_splits, group=None) -> torch.Tensor:
    """Rows of ``x`` (split by ``input_splits``, one block per rank) exchanged with every rank
    of ``group``; returns the blocks received (``output_splits`` rows from each rank)."""
    n = dist.get_world_size(group)
    if len(output_splits) != n or len(input_splits) != n:
        raise ValueError(f"all_to_all needs one split per rank ({n}), got "
                         f"{len(output_splits)} output and {len(input_splits)} input splits")
    if sum(input_splits) != x.shape[0]:
        raise ValueError(f"input_splits {list(input_splits)} add up to {sum(input_splits)} "
                         f"rows, but x has {x.shape[0]}")
    return _AllToAll.apply(x, output_splits, input_splits, group)
