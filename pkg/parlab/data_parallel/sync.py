"""Data parallelism (Figure 8-2): full replicas, split batch, averaged gradients.

Why this module exists: the chapter's recipe is short (every GPU holds the whole model and
works on its own micro-batches; the GPUs then add up their gradients, divide by their number
and all apply the same update), but the details decide whether the replicas really train the
same model as one GPU would. Here the recipe is code a reader can follow top to bottom:

1. :func:`split_batch` gives each rank its micro-batches, or says clearly why it cannot.
2. :func:`all_reduce_buckets` sums gradients with ``torch.distributed.all_reduce`` (gloo,
   nccl or the toy backend), packing small tensors into flat buckets as production
   frameworks do, and divides by the number of ranks. Under nccl, :func:`train` puts each
   replica on its rank's GPU (:func:`parlab.launch.rank_device`).
3. :func:`step` is one training step of any ``torch.nn.Module``; :class:`GradientExchange`
   plugs the same sync into the book-named :class:`parlab.models.BookMLP`.
4. :func:`train` (in :mod:`parlab.data_parallel.training`) runs
   many steps on N ranks through :func:`parlab.launch.run`, with the same loop driven by
   ``DistributedDataParallel`` for comparison, checkpoints, and an injected lost transfer;
   :func:`reference` is one process training on the whole batch.

Scaling of the loss: each rank weights every micro-batch's mean loss by
``samples_in_micro_batch * world_size / samples_in_batch``. After the sum over ranks and
the division by ``world_size`` that is exactly the mean loss over the whole batch, for even
and (with ``uneven=True``) uneven splits alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from parlab.launch import span
from parlab.models import BookMLP
from parlab.checks import check_count

__all__ = ["split_batch", "make_buckets", "bucket_bytes", "DDP_FIRST_BUCKET_BYTES",
           "DDP_BUCKET_CAP_BYTES", "all_reduce_buckets", "SyncStats", "step",
           "GradientExchange"]


# --------------------------------------------------------------------------- the batch


def split_batch(samples: int, micro_batches: int, world_size: int,
                uneven: bool = False) -> list[list[tuple[int, int]]]:
    """For each rank, the ``(start, stop)`` sample ranges of its micro-batches.

    Ranks get consecutive micro-batches (rank 0 the first ones), as A1 gets x1..x4 in
    Figure 8-2. By default the batch must split evenly: samples into micro-batches and
    micro-batches over ranks. ``uneven=True`` accepts any split (the first ranks get one
    more micro-batch or sample); the loss weighting of :func:`step` keeps it exact.
    """
    for name, value in (("samples", samples), ("micro_batches", micro_batches),
                        ("world_size", world_size)):
        check_count(name, value)
    if micro_batches > samples:
        raise ValueError(f"micro_batches={micro_batches} is more than the {samples} samples; "
                         f"use at most {samples} micro-batches")
    if micro_batches < world_size:
        raise ValueError(f"{micro_batches} micro-batch(es) cannot feed {world_size} ranks: every "
                         f"replica needs at least one; use micro_batches >= {world_size}")
    if not uneven and samples % micro_batches:
        raise ValueError(f"a batch of {samples} samples does not split into {micro_batches} equal "
                         f"micro-batches; use a multiple of {micro_batches} samples, or pass "
                         f"uneven=True (micro-batches then differ by one sample)")
    if not uneven and micro_batches % world_size:
        good = -(-micro_batches // world_size) * world_size
        raise ValueError(f"{micro_batches} micro-batches do not split evenly over {world_size} "
                         f"ranks; use a multiple of {world_size} (e.g. {good}), or pass "
                         f"uneven=True: the first {micro_batches % world_size} rank(s) then get "
                         f"one micro-batch more and each rank's gradient is weighted by its share "
                         f"of the samples")
    sizes = [len(c) for c in torch.arange(samples).tensor_split(micro_batches)]
    bounds = [(sum(sizes[:j]), sum(sizes[:j + 1])) for j in range(micro_batches)]
    owners = torch.arange(micro_batches).tensor_split(world_size)
    return [[bounds[j] for j in owned.tolist()] for owned in owners]


# --------------------------------------------------------------------------- gradient sync


@dataclass
class SyncStats:
    """What one gradient sync handed to ``all_reduce``: calls, and bytes per bucket."""

    calls: int = 0
    bucket_bytes: list[int] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(self.bucket_bytes)


#: DistributedDataParallel's default bucket caps (``torch.distributed``'s first-bucket
#: default and DDP's ``bucket_cap_mb=25``): when ``bucket_cap_mb`` is not set, the first
#: bucket (the last layers, whose gradients are ready first) holds about 1 MiB, the others
#: about 25 MiB. The tests hold both against a running DDP.
DDP_FIRST_BUCKET_BYTES = 2**20
DDP_BUCKET_CAP_BYTES = 25 * 2**20


def make_buckets(tensors, cap_bytes: int | None = None,
                 first_cap_bytes: int | None = None) -> list[list[int]]:
    """Indices of ``tensors`` packed into buckets the way DistributedDataParallel packs them.

    The walk goes from the last tensor back, because backward produces the last layer's
    gradients first. Each tensor joins the open bucket of its dtype and device whole; once
    that bucket holds ``cap_bytes`` or more it closes, and the next tensor opens a new one.
    So a bucket can exceed the cap (by less than its last tensor), and a tensor larger than
    the cap closes the bucket it joins. ``first_cap_bytes``, if given, is the cap of the
    first bucket (per dtype and device), as DDP's :data:`DDP_FIRST_BUCKET_BYTES`. Buckets
    are listed in the order of their first tensor. This is the rule of
    ``torch.distributed._compute_bucket_assignment_by_size``, which DDP applies in the order
    gradients became ready after its first iteration (the tests compare the two). ``None``
    means no bucketing: one all-reduce per tensor.
    """
    for name, value in (("bucket_cap_bytes", cap_bytes), ("first_cap_bytes", first_cap_bytes)):
        if value is not None:
            check_count(name, value, "bytes per bucket, or None")
    if cap_bytes is None and first_cap_bytes is not None:
        raise ValueError(f"first_cap_bytes={first_cap_bytes} needs a bucket_cap_bytes for the "
                         f"buckets after the first; got bucket_cap_bytes=None")
    order = list(reversed(range(len(tensors))))
    if cap_bytes is None:
        return [[i] for i in order]
    buckets: list[list[int]] = []
    open_buckets: dict[tuple, tuple[list[int], int]] = {}  # (dtype, device) -> (indices, bytes)
    closed_one: set[tuple] = set()  # keys whose first bucket has closed
    for i in order:
        t = tensors[i]
        key = (t.dtype, t.device)
        indices, size = open_buckets.pop(key, ([], 0))
        indices.append(i)
        size += t.numel() * t.element_size()
        first = first_cap_bytes is not None and key not in closed_one
        if size >= (first_cap_bytes if first else cap_bytes):
            buckets.append(indices)
            closed_one.add(key)
        else:
            open_buckets[key] = (indices, size)
    buckets.extend(indices for indices, _ in open_buckets.values())
    position = {i: k for k, i in enumerate(order)}
    return sorted(buckets, key=lambda b: position[b[0]])


def bucket_bytes(tensors, cap_bytes: int | None = None,
                 first_cap_bytes: int | None = None) -> list[int]:
    """Bytes in each bucket of :func:`make_buckets` (the size of each all-reduce)."""
    return [sum(tensors[i].numel() * tensors[i].element_size() for i in bucket)
            for bucket in make_buckets(tensors, cap_bytes, first_cap_bytes)]


def all_reduce_buckets(tensors, cap_bytes: int | None = None, average: bool = True,
                       inject: Callable[[int], None] | None = None, group=None) -> SyncStats:
    """Sum ``tensors`` (in place) over all ranks, one ``all_reduce`` per bucket; then divide.

    ``average=True`` divides by the number of ranks, as the chapter describes. ``inject``,
    if given, is called with each bucket's index before its all-reduce (a test's way to
    make a transfer fail at a chosen moment).
    """
    world = dist.get_world_size(group)
    stats = SyncStats()
    for k, bucket in enumerate(make_buckets(tensors, cap_bytes)):
        if inject is not None:
            inject(k)
        parts = [tensors[i] for i in bucket]
        flat = torch.cat([p.reshape(-1) for p in parts])
        with span(f"all_reduce bucket {k}", "communication", op="all_reduce", bucket=k,
                  bytes=flat.numel() * flat.element_size(), ranks=world):
            dist.all_reduce(flat, group=group)
        if average:
            flat /= world
        for p, piece in zip(parts, flat.split([p.numel() for p in parts])):
            p.copy_(piece.view_as(p))
        stats.calls += 1
        stats.bucket_bytes.append(flat.numel() * flat.element_size())
    return stats


def step(model: nn.Module, optimizer, loss_fn, micro_batches, samples: int, *,
         bucket_cap_bytes: int | None = None, inject=None, keep_local: bool = False):
    """One data-parallel step on this rank: local gradients, averaged over ranks, update.

    ``micro_batches`` are this rank's ``(x, target)`` pairs and ``samples`` the size of the
    whole batch over all ranks. Each micro-batch's mean loss is weighted by
    ``len(x) * world_size / samples`` (see the module docstring), its gradient accumulated.
    ``keep_local=True`` simulates a rank that lost what its peers sent: it still takes part
    in every all-reduce but updates with its own local gradient, so replicas drift apart
    silently. Returns ``(mean loss of this rank's samples, SyncStats)``. Forward, backward,
    each bucket's all-reduce and the update are timed as spans (:func:`parlab.launch.span`)
    when the caller records them.
    """
    world = dist.get_world_size()
    optimizer.zero_grad()
    total, count = 0.0, 0
    for j, (x, target) in enumerate(micro_batches):
        with span(f"forward {j}", "compute", microbatch=j):
            loss = loss_fn(model(x), target)
        with span(f"backward {j}", "compute", microbatch=j):
            (loss * (len(x) * world / samples)).backward()
        total, count = total + loss.item() * len(x), count + len(x)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    local = [g.clone() for g in grads] if keep_local else None
    stats = all_reduce_buckets(grads, bucket_cap_bytes, inject=inject)
    if keep_local:
        for g, mine in zip(grads, local):
            g.copy_(mine)
    with span("optimizer step", "compute"):
        optimizer.step()
    return total / count, stats


class GradientExchange:
    """``exchange`` for :meth:`BookMLP.step`: returns the sum of the peers' gradients.

    ``how="all_gather"``: every rank receives every peer's flat gradient, so on two ranks A1
    literally holds A2's gradient (kept in ``received[peer]``). ``how="all_reduce"``: one
    summed gradient comes back, and the "remote" part is that sum minus the local gradient,
    because an all-reduce never shows a peer's gradient on its own.
    """

    def __init__(self, how: str = "all_gather", bucket_cap_bytes: int | None = None):
        if how not in ("all_gather", "all_reduce"):
            raise ValueError(f"how must be 'all_gather' or 'all_reduce', got {how!r}")
        self.how, self.cap = how, bucket_cap_bytes
        self.received: dict[int, list[torch.Tensor]] = {}
        self.stats = SyncStats()

    def __call__(self, local: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.how == "all_reduce":
            summed = [g.clone() for g in local]
            self.stats = all_reduce_buckets(summed, self.cap, average=False)
            return [s - g for s, g in zip(summed, local)]
        flat = torch.cat([g.reshape(-1) for g in local])
        pieces = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
        dist.all_gather(pieces, flat)
        self.stats = SyncStats(1, [flat.numel() * flat.element_size()])
        sizes = [g.numel() for g in local]
        me = dist.get_rank()
        self.received = {peer: [p.view_as(g) for p, g in zip(piece.split(sizes), local)]
                         for peer, piece in enumerate(pieces) if peer != me}
        peers = list(self.received.values())
        return [sum(grads[i] for grads in peers) for i in range(len(local))]
