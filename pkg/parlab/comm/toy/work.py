"""Small pieces of the toy backend: finished work, CUDA staging, tensor and reduce-op helpers.

The toy collectives run to completion inside the call (simple to follow, and never out of
order), so they return work that is already done; a point-to-point message returns work that
waits for it. CUDA tensors take NCCL when every rank has a GPU; otherwise they are staged
through CPU copies over the CPU road (shared memory, or gloo, which cannot read GPU memory
for point-to-point messages).
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future
from torch.utils import _pytree as pytree

__all__ = ["done", "StagedRecvWork", "MessageWork", "as_work", "collective", "nccl_usable",
           "flat_view", "split_rows", "reduce_op_name", "combiner", "average", "relay_blocks"]


def done(result) -> dist.Work:
    """A work object that is already complete, with ``result`` as its future's value."""
    future = Future()
    future.set_result(result)
    return _create_work_from_future(future)


def nccl_usable() -> bool:
    """NCCL can carry CUDA tensors: it is built in and every rank has a GPU of its own."""
    return (dist.is_nccl_available() and torch.cuda.is_available()
            and torch.cuda.device_count() >= dist.get_world_size())


class StagedRecvWork(dist._Work):
    """A receive into a CPU staging tensor that copies to the GPU tensor when waited on."""

    def __init__(self, work, staging: torch.Tensor, target: torch.Tensor):
        super().__init__()
        self._work, self._staging, self._target = work, staging, target

    def wait(self, timeout=None) -> bool:
        self._work.wait()
        self._target.copy_(self._staging)
        return True

    def is_completed(self) -> bool:
        return self._work.is_completed()


class MessageWork(dist._Work):
    """A point-to-point message of the toy's own wire, as the work object torch expects."""

    def __init__(self, message):
        super().__init__()
        self._message = message

    def wait(self, timeout=None) -> bool:
        self._message.wait()
        return True

    def is_completed(self) -> bool:
        return self._message.is_completed()

    def _source_rank(self) -> int:  # dist.recv without a source asks who sent
        return self._message.peer


def as_work(work) -> dist.Work:
    """Gloo's and NCCL's works as they are; a message of the toy's own wire wrapped for torch."""
    return work if isinstance(work, dist.Work) else MessageWork(work)


def collective(method):
    """Wrap a ProcessGroup collective: outside autograd, and GPU tensors staged when needed.

    Like gloo and NCCL, a collective writes its tensors in place whatever autograd thinks of
    them (a parameter that requires grad can be broadcast). GPU tensors run on CPU copies,
    copied back afterwards, unless NCCL can carry them.
    """
    @functools.wraps(method)
    @torch.no_grad()
    def wrapper(self, *args, **kwargs):
        leaves = pytree.tree_leaves((args, kwargs))
        on_gpu = any(isinstance(x, torch.Tensor) and x.device.type != "cpu" for x in leaves)
        if not on_gpu or nccl_usable():
            return method(self, *args, **kwargs)
        pairs = []

        def to_cpu(x):
            if isinstance(x, torch.Tensor) and x.device.type != "cpu":
                pairs.append((x, x.detach().cpu()))
                return pairs[-1][1]
            return x
        args, kwargs = pytree.tree_map(to_cpu, (args, kwargs))
        work = method(self, *args, **kwargs)
        for original, copy in pairs:
            original.copy_(copy)
        return work
    return wrapper


def flat_view(tensor: torch.Tensor):
    """A 1-D contiguous view of ``tensor`` (or a copy), and how to write a copy back."""
    if tensor.is_contiguous():
        return tensor.view(-1), lambda: None
    copy = tensor.contiguous().view(-1)
    return copy, lambda: tensor.copy_(copy.view_as(tensor))


def split_rows(tensor, splits, n):
    """all_to_all_single's blocks: rows of dim 0 per peer (equal when no splits are given)."""
    if splits:
        return list(tensor.split(list(splits)))
    rows = tensor.shape[0] if tensor.dim() else tensor.numel()
    return list(tensor.split(rows // n)) if rows % n == 0 else []


def reduce_op_name(op) -> str:
    """"SUM", "MAX", ... from a ReduceOp (which wraps a RedOpType) or a RedOpType."""
    op = getattr(op, "op", op)
    return getattr(op, "name", str(op))


_COMBINE = {
    "SUM": torch.add, "AVG": torch.add, "PRODUCT": torch.mul, "MIN": torch.minimum,
    "MAX": torch.maximum, "BAND": torch.bitwise_and, "BOR": torch.bitwise_or,
    "BXOR": torch.bitwise_xor,
}


def combiner(name: str):
    """``combine(a, b, out)``: out = a (op) b, element-wise; ``out`` may be ``a`` or ``b``."""
    fn = _COMBINE[name]
    return lambda a, b, out: fn(a, b, out=out)


def average(op: str, tensor: torch.Tensor, n: int) -> None:
    """AVG is SUM followed by a division by the number of ranks (done once, by the owner)."""
    if op == "AVG" and n > 1:
        tensor.div_(n)


def relay_blocks(given, mine, rows, rank: int, field: str, used: str):
    """The per-rank blocks of a gather/scatter.

    The root has its list (``given``). Any other rank holds only its own block (``mine``),
    plus, in a tree, room for the blocks of the subtree it relays (sizes from the headers
    in ``rows``).
    """
    if given:
        return given
    blocks = [torch.empty(row[field], dtype=mine.dtype, device=mine.device)
              if used == "tree" else None for row in rows]
    blocks[rank] = mine
    return blocks
