"""Tensor-parallel layers under Megatron-LM's names: column- and row-parallel linear layers,
the Megatron MLP built from them, and two ways to hold a word-embedding table.

Why these four: the slides split a linear layer Y = X A two ways. *Partition output*
(:class:`ColumnParallelLinear`) gives each rank some columns of A, so each rank computes
some output features from the whole input. *Reduce output* (:class:`RowParallelLinear`)
gives each rank some rows of A and the matching input features, so each rank computes a
partial sum of every output feature. Chained (column first, row second) they make the
Megatron MLP (:class:`TensorParallelMLP`): the column layer's output slices are exactly the
row layer's input slices, so nothing moves between them, and one all-reduce finishes the
layer. (In ``nn.Linear`` the weight is stored as A^T, so "columns of A" are the *rows* of
``weight``: see :mod:`parlab.tensor_parallel.sharding`.)

For the embedding the chapter's default is :class:`BroadcastEmbedding` (the table on one
GPU, which looks up and broadcasts the vectors); :class:`VocabParallelEmbedding` is the
row-wise sharding the chapter mentions for very large models, each rank owning a range
of token ids.

Every layer is built from a full single-device layer (``from_linear``, ``from_mlp``,
``from_embedding``) so that a test can compare the two; the communication is in
:mod:`parlab.tensor_parallel.mappings`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from parlab.tensor_parallel.sharding import ShardSpec, shard_spec
from parlab.tensor_parallel.mappings import (
    all_gather_cat, broadcast_from, copy_to_region, gather_from_region, reduce_from_region,
    reduce_scatter_slice, reduce_scatter_to_region, scatter_to_region
)

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "TensorParallelMLP",
           "VocabParallelEmbedding", "BroadcastEmbedding"]


def _param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.detach().clone())


def _size_rank(group) -> tuple[int, int]:
    return dist.get_world_size(group), dist.get_rank(group)


class _ParallelLinear(nn.Module):
    """This rank's piece of a linear layer: weight (and bias) slices, their spec, the group."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, spec: ShardSpec, group):
        super().__init__()
        self.weight = _param(weight)
        self.bias = _param(bias) if bias is not None else None
        self.spec, self.group = spec, group


class _GatheredLinear(torch.autograd.Function):
    """y = all_gather(x) A_i + b_i, keeping only the local x: the backward pass gathers x
    again for dA_i, and reduce-scatters dX (each rank's rows get every rank's share)."""

    @staticmethod
    def forward(ctx, x, weight, bias, dim, group):
        ctx.save_for_backward(x, weight)
        ctx.dim, ctx.group, ctx.has_bias = dim, group, bias is not None
        return F.linear(all_gather_cat(x, dim, group), weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        full = all_gather_cat(x, ctx.dim, ctx.group)  # again: it was not kept
        grad_x = reduce_scatter_slice(grad @ weight, ctx.dim, ctx.group)
        grad_weight = grad.flatten(0, -2).T @ full.flatten(0, -2)
        grad_bias = grad.flatten(0, -2).sum(0) if ctx.has_bias else None
        return grad_x, grad_weight, grad_bias, None, None


class ColumnParallelLinear(_ParallelLinear):
    """Y = X A with A's columns (the output features) split across the ranks.

    Forward: the replicated input enters through ``copy_to_region`` (no traffic) and each
    rank computes its slice of Y. With ``gather_output=True`` the slices are all-gathered
    into the full Y; with ``False`` each rank keeps its slice (what a following
    :class:`RowParallelLinear` wants). Backward: the input's gradient is the sum of every
    rank's contribution, so ``copy_to_region`` all-reduces it.

    ``sequence_parallel=True`` (Megatron's flag): the input arrives *split* along
    ``sequence_dim`` (the sequence in Megatron; the batch in the slides' CNN), each rank
    holding its own rows; they are all-gathered in forward (Megatron's ``g``) and the
    input's gradient is reduce-scattered in backward, so each rank gets the summed gradient
    of its own rows. As in Megatron, only this rank's rows are kept for the backward pass,
    which all-gathers them again to form the weight's gradient: the activation memory stays
    split t ways, for one more all-gather per backward pass.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, gather_output: bool,
                 spec: ShardSpec, group=None, sequence_parallel: bool = False,
                 sequence_dim: int = 0):
        super().__init__(weight, bias, spec, group)
        self.gather_output, self.sequence_parallel = gather_output, sequence_parallel
        self.sequence_dim = sequence_dim

    @classmethod
    def from_linear(cls, linear: nn.Linear, gather_output: bool = True, group=None,
                    name: str = "A", sequence_parallel: bool = False,
                    sequence_dim: int = 0) -> "ColumnParallelLinear":
        """This rank's share of ``linear`` (every rank passes the same full layer)."""
        size, rank = _size_rank(group)
        spec = shard_spec(name, linear.weight.shape, "rows", size)[rank]
        bias = linear.bias[spec.start:spec.stop] if linear.bias is not None else None
        return cls(spec.take(linear.weight.data), bias, gather_output, spec, group,
                   sequence_parallel, sequence_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:
            y = _GatheredLinear.apply(x, self.weight, self.bias, self.sequence_dim, self.group)
        else:
            y = F.linear(copy_to_region(x, self.group), self.weight, self.bias)
        return gather_from_region(y, -1, self.group) if self.gather_output else y

    def extra_repr(self) -> str:
        return (f"local weight {tuple(self.weight.shape)}, gather_output={self.gather_output}"
                + (", sequence_parallel=True" if self.sequence_parallel else ""))


class RowParallelLinear(_ParallelLinear):
    """Y = X A with A's rows (the input features) split across the ranks.

    Forward: each rank multiplies its slice of the input features (``input_is_parallel``:
    the input already arrives sliced; otherwise ``scatter_to_region`` cuts the slice out
    locally) by its rows of A, giving a partial sum of every output; ``reduce_from_region``
    all-reduces the partial sums, then the bias is added once. Backward: the output
    gradient is replicated, so each rank computes its input slice's gradient alone.

    ``sequence_parallel=True``: the partial sums are reduce-scattered along ``sequence_dim``
    instead (:func:`reduce_scatter_to_region`), each rank keeping the finished rows of its
    own tokens, and the bias is added to those rows only; so the bias's gradient on a rank
    covers its tokens only, and the ranks' gradients must be summed
    (:func:`parlab.tensor_parallel.allreduce_sequence_parallel_grads`: the bias is marked
    ``sequence_parallel``, as in Megatron).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, input_is_parallel: bool,
                 spec: ShardSpec, group=None, sequence_parallel: bool = False,
                 sequence_dim: int = 0):
        super().__init__(weight, bias, spec, group)
        self.input_is_parallel = input_is_parallel
        self.sequence_parallel, self.sequence_dim = sequence_parallel, sequence_dim
        if sequence_parallel and self.bias is not None:
            self.bias.sequence_parallel = True

    @classmethod
    def from_linear(cls, linear: nn.Linear, input_is_parallel: bool = False, group=None,
                    name: str = "B", sequence_parallel: bool = False,
                    sequence_dim: int = 0) -> "RowParallelLinear":
        """This rank's share of ``linear`` (every rank passes the same full layer)."""
        size, rank = _size_rank(group)
        spec = shard_spec(name, linear.weight.shape, "columns", size)[rank]
        return cls(spec.take(linear.weight.data), linear.bias, input_is_parallel, spec, group,
                   sequence_parallel, sequence_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = scatter_to_region(x, -1, self.group)
        partial = F.linear(x, self.weight)
        y = (reduce_scatter_to_region(partial, self.sequence_dim, self.group)
             if self.sequence_parallel else reduce_from_region(partial, self.group))
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return (f"local weight {tuple(self.weight.shape)}, "
                f"input_is_parallel={self.input_is_parallel}")


class TensorParallelMLP(nn.Module):
    """Megatron's MLP: Z = GeLU(X A) B, A column-parallel, B row-parallel.

    One all-reduce in the forward pass (after B) and one in the backward pass (the
    input's gradient, before A); nothing moves between A and B, because A's output slice
    on a rank is exactly the slice of B's input that the rank's rows of B need.
    """

    def __init__(self, fc1: ColumnParallelLinear, fc2: RowParallelLinear):
        super().__init__()
        self.fc1, self.fc2 = fc1, fc2

    @classmethod
    def from_mlp(cls, mlp: nn.Module, group=None, sequence_parallel: bool = False,
                 sequence_dim: int = 0) -> "TensorParallelMLP":
        """Shard a single-device MLP with ``fc1`` and ``fc2`` (e.g. ``parlab.models.MLP``)."""
        sp = {"sequence_parallel": sequence_parallel, "sequence_dim": sequence_dim}
        return cls(ColumnParallelLinear.from_linear(mlp.fc1, gather_output=False, group=group,
                                                    **sp),
                   RowParallelLinear.from_linear(mlp.fc2, input_is_parallel=True, group=group,
                                                 **sp))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class VocabParallelEmbedding(nn.Module):
    """An embedding table split by token id: each rank owns a contiguous range of the vocabulary.

    A rank looks up the ids it owns and writes zeros for the others; an all-reduce sums the
    ranks' answers, and since exactly one rank owns each id, the sum is the vector. The
    backward pass adds no traffic of its own: each rank's rows get the gradient of its own
    ids, from the full gradient of the vectors that every rank is handed. When the next
    layer is tensor parallel, summing its ranks' partial gradients into that full one is
    the all-reduce of its input's ``f`` (:func:`copy_to_region`), a collective too.
    """

    def __init__(self, weight: torch.Tensor, spec: ShardSpec, group=None):
        super().__init__()
        self.weight = _param(weight)
        self.spec, self.group = spec, group
        self.vocab_start, self.vocab_end = spec.start, spec.stop

    @classmethod
    def from_embedding(cls, embedding: nn.Embedding, group=None,
                       name: str = "E") -> "VocabParallelEmbedding":
        """This rank's range of ``embedding``'s rows (every rank passes the same table)."""
        size, rank = _size_rank(group)
        spec = shard_spec(name, embedding.weight.shape, "vocab", size)[rank]
        return cls(spec.take(embedding.weight.data), spec, group)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # an id no rank owns would come out as a zero vector: fail as nn.Embedding does, on
        # every rank alike (they all see the same ids), before the all-reduce
        vocab = self.spec.shape[0]
        if ids.numel():
            low, high = torch.stack(torch.aminmax(ids)).tolist()  # one sync for both ends
            if low < 0 or high >= vocab:
                raise IndexError(f"token id {low if low < 0 else high} is out of range for a "
                                 f"vocabulary of {vocab} ids (valid ids: 0 to {vocab - 1})")
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local = torch.where(outside, torch.zeros_like(ids), ids - self.vocab_start)
        vectors = F.embedding(local, self.weight) * (~outside).unsqueeze(-1)
        return reduce_from_region(vectors, self.group)


class BroadcastEmbedding(nn.Module):
    """The book's default: the whole table on one GPU (``src``), its vectors broadcast to the rest.

    Only ``src`` holds ``weight``; the other ranks hold nothing but know the width. The
    backward pass sums the ranks' gradients of the vectors onto ``src`` (a reduce), which
    is right when the ranks go on to use the vectors differently, as the tensor-parallel
    Q, K and V projections of Figure 8-18 do.
    """

    def __init__(self, weight: torch.Tensor | None, dim: int, src: int = 0, group=None):
        super().__init__()
        self.weight = _param(weight) if weight is not None else None
        self.dim, self.src, self.group = dim, src, group

    @classmethod
    def from_embedding(cls, embedding: nn.Embedding, src: int = 0,
                       group=None) -> "BroadcastEmbedding":
        """Keep ``embedding``'s table on ``src`` only."""
        mine = dist.get_rank(group) == src
        return cls(embedding.weight.data if mine else None, embedding.embedding_dim, src, group)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.weight is not None:
            vectors = F.embedding(ids, self.weight)
        else:
            vectors = torch.zeros(*ids.shape, self.dim, requires_grad=torch.is_grad_enabled())
        return broadcast_from(vectors, self.src, self.group)
