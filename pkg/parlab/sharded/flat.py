"""One layer's parameters as a flat buffer cut into N equal shards: the unit ZeRO and FSDP move.

Why this module exists: sharding is bookkeeping before it is communication. A layer's
weight and bias (any number of tensors, any shapes) are laid end to end in one flat buffer of
``numel`` elements, padded with zeros to ``padded = N * ceil(numel / N)`` so that every
rank owns the same number of elements, ``shard_numel = padded / N``: rank r owns elements
``[r * shard_numel, (r + 1) * shard_numel)``. Equal shards are what the single-tensor
collectives need (``all_gather_into_tensor`` puts rank r's shard at offset ``r * shard_numel``
of the output; ``reduce_scatter_tensor`` hands rank r that slice of the sum). FSDP pads the
same way; ZeRO's paper pads the whole model's flat buffer once.

The layer's parameters become views into the flat buffer ``full``, so one collective fills
them all. To free the gathered parameters (ZeRO stage 3 between uses) the buffer's storage is
resized to zero bytes and later back: views, and the copies autograd saved for the backward
pass, share that storage, so they see the gathered values again after the next gather.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["FlatShard", "all_gather_into", "reduce_scatter_into", "parameter_layers"]


def parameter_layers(model: nn.Module) -> list[nn.Module]:
    """``model``'s children that have parameters: the layers that are sharded one by one."""
    return [m for m in model.children() if any(True for _ in m.parameters())]


def all_gather_into(output: torch.Tensor, shard: torch.Tensor, group=None) -> None:
    """``output[r * len(shard):(r + 1) * len(shard)] = shard of rank r``, for every rank r."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(output, shard, group=group)


def reduce_scatter_into(output: torch.Tensor, full: torch.Tensor, group=None) -> None:
    """``output = (sum over ranks of full)[r * len(output):(r + 1) * len(output)]`` on rank r."""
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    scatter(output, full, group=group)


class FlatShard:
    """The parameters of ``module`` (its own and its children's) as one flat, sharded buffer.

    ``full`` holds all ``numel`` values (plus padding) when gathered; ``shard`` is this rank's
    ``shard_numel`` of them as a leaf ``nn.Parameter``, the tensor the optimizer updates.
    With ``own_shard=False`` the shard is a view into ``full`` (ZeRO stages 1 and 2 keep every
    parameter, so the owned slice costs nothing extra); with ``own_shard=True`` it has its own
    storage, so ``full`` can be freed (stage 3).
    """

    def __init__(self, module: nn.Module, rank: int, world_size: int, own_shard: bool,
                 group=None):
        self.module, self.rank, self.world_size, self.group = module, rank, world_size, group
        self.params = [p for p in module.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError(f"{type(module).__name__} has no trainable parameters to shard")
        self.numel = sum(p.numel() for p in self.params)
        self.shard_numel = -(-self.numel // world_size)
        self.padded = self.shard_numel * world_size
        first = self.params[0]
        self.full = torch.zeros(self.padded, dtype=first.dtype, device=first.device)
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                self.full[offset:offset + n].copy_(p.reshape(-1))
                p.data = self.full[offset:offset + n].view_as(p)
                offset += n
        lo = rank * self.shard_numel
        owned = self.full[lo:lo + self.shard_numel]
        self.shard = nn.Parameter(owned.clone() if own_shard else owned)
        self.gathered = True

    # ------------------------------------------------------------------ parameters

    @torch.no_grad()
    def gather(self) -> None:
        """All-gather every rank's shard into ``full`` (re-allocating it if it was freed)."""
        storage = self.full.untyped_storage()
        if storage.nbytes() == 0:
            storage.resize_(self.padded * self.full.element_size())
        all_gather_into(self.full, self.shard.detach().clone(), self.group)
        self.gathered = True

    def free(self) -> None:
        """Release the gathered parameters' memory; the shard stays."""
        self.full.untyped_storage().resize_(0)
        self.gathered = False

    # ------------------------------------------------------------------ gradients

    def flat_grad(self) -> torch.Tensor:
        """The layer's local gradients end to end, zero-padded to ``padded`` elements."""
        flat = torch.zeros(self.padded, dtype=self.full.dtype, device=self.full.device)
        offset = 0
        for p in self.params:
            n = p.numel()
            if p.grad is not None:
                flat[offset:offset + n].copy_(p.grad.reshape(-1))
            offset += n
        return flat

    def reduce_scatter_grad(self) -> None:
        """``shard.grad`` = this rank's slice of the gradient averaged over ranks; the full
        per-parameter gradients are dropped (ZeRO stage 2 and 3: only the shard is kept)."""
        grad = torch.empty(self.shard_numel, dtype=self.full.dtype, device=self.full.device)
        reduce_scatter_into(grad, self.flat_grad(), self.group)
        grad /= self.world_size
        self.shard.grad = grad
        for p in self.params:
            p.grad = None

    def all_reduce_grad(self) -> None:
        """Stage 0 (plain data parallelism): every parameter's gradient averaged over ranks."""
        flat = self.flat_grad()
        dist.all_reduce(flat, group=self.group)
        flat /= self.world_size
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad = flat[offset:offset + n].view_as(p).clone()
            offset += n

    def values(self) -> torch.Tensor:
        """This rank's shard without padding beyond ``numel`` (for comparing with a reference)."""
        lo = self.rank * self.shard_numel
        keep = max(0, min(self.shard_numel, self.numel - lo))
        return self.shard.detach()[:keep].cpu().clone()
