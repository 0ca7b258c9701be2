"""Self-attention split across ranks three ways, each equal to :class:`SelfAttention` on one device.

Why three: the chapter (Figures 8-17 and 8-18) describes one way, Megatron-LM uses another,
and PyTorch ships a third as an API. Running all three on the same weights, and counting
what each moves, is the quickest way to see why frameworks settled where they did.

1. :class:`BookAttention`, the chapter's description made exact. A1 holds the embedding
   table and broadcasts the vectors X to A2. W_Q, W_K and W_V are split by output features
   (A1 the first half of Q's, K's and V's features, A2 the second). Each GPU computes its
   slices of Q, K and V, then all-gathers Q and K; V stays local. With the whole of Q and K
   a GPU can compute the attention probabilities softmax(Q K^T / sqrt(d_head)) of any head,
   and multiplies those of the heads its V columns belong to by its V slice, which gives
   its columns of the context. What "finishes the layer" is the output projection W_O,
   split by rows to match those context columns (a row-parallel layer), and one all-reduce
   of the partial outputs. Backward uses the chapter's collectives, on the tensors that
   need them: the chapter all-reduces the *weight* gradients, but each GPU alone computes
   the gradient of its weight shard; what must be summed are activation gradients. Q and
   K are all-gathered again (only the local slices were kept, saving activation memory),
   each GPU computes its contribution to the gradients of the whole Q and K, and an
   all-reduce sums the contributions before each GPU keeps its own slice; the partial
   gradients of X are reduced onto ``src``. Because Q and K are gathered, this
   split works for any number of heads, even one (the GPUs may split *inside* a head).
2. :class:`MegatronAttention`: split by whole heads. A head's scores need only that head's
   Q and K columns, so a GPU that owns whole heads already has everything it needs: no
   traffic before attention, one all-reduce after the row-parallel output projection in
   the forward pass, and one all-reduce of the input's gradient in the backward pass.
   W_Q, W_K, W_V are fused into one column-parallel weight arranged so that each rank's
   rows are its heads' Q, K and V, as Megatron does; then one input copy serves all three.
3. :func:`dtensor_attention`: the same split through ``torch.distributed.tensor.parallel``
   (``ColwiseParallel`` on q/k/v, ``RowwiseParallel`` on the output projection).

Each variant's :meth:`local_grads` returns ``{parameter name: (gradient, ShardSpec or None)}``
with the reference's parameter names, so a test can merge the ranks' pieces and compare
them with the single-device gradients.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.autograd import Function

from parlab.tensor_parallel.sharding import check_degree, shard_spec
from parlab.tensor_parallel.mappings import (
    all_gather_cat, broadcast_from, local_slice, reduce_scatter_slice
)
from parlab.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from parlab.checks import check_count

__all__ = ["SelfAttention", "attend", "BookAttention", "MegatronAttention", "dtensor_attention",
           "PROJECTIONS", "check_heads", "check_grad_sync"]

#: The reference's projections, in the book's letters.
PROJECTIONS = {"q_proj": "W_Q", "k_proj": "W_K", "v_proj": "W_V", "out_proj": "W_O"}


def check_heads(d_model, n_heads) -> None:
    """Raise ValueError unless ``n_heads`` heads of whole width split ``d_model`` features."""
    check_count("d_model", d_model)
    check_count("n_heads", n_heads)
    if d_model % n_heads:
        raise ValueError(f"n_heads={n_heads} does not divide d_model={d_model}")


def check_grad_sync(grad_sync) -> None:
    if grad_sync not in ("all_reduce", "reduce_scatter"):
        raise ValueError(f"grad_sync must be 'all_reduce' or 'reduce_scatter', got {grad_sync!r}")


def _heads(t: torch.Tensor, d_head: int) -> torch.Tensor:
    b, s, _ = t.shape
    return t.view(b, s, -1, d_head).transpose(1, 2)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, d_head: int,
           causal: bool = True) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d_head)) V for every head in ``q``'s columns, shape (b, s, width)."""
    q, k, v = (_heads(t, d_head) for t in (q, k, v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_head)
    if causal:
        future = torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    out = F.softmax(scores, dim=-1) @ v
    return out.transpose(1, 2).flatten(2)


class SelfAttention(nn.Module):
    """The single-device layer: Q = X W_Q^T + b_Q (and K, V), heads, softmax, output projection.

    Heads are found by ``d_head`` (``view(b, s, -1, d_head)``), so the same forward also runs
    on a rank that holds only some heads' columns (what PyTorch's API relies on).
    ``causal`` masks the future, as GPT does (and as :class:`parlab.models.Attention` does).
    """

    def __init__(self, d_model: int, n_heads: int, causal: bool = True, seed: int | None = 0):
        super().__init__()
        check_heads(d_model, n_heads)
        if seed is not None:
            torch.manual_seed(seed)
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.causal = causal
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            nn.Linear(d_model, d_model) for _ in range(4))

    @classmethod
    def from_module(cls, attn: nn.Module, causal: bool = True) -> "SelfAttention":
        """A copy of any module with ``n_heads`` and q/k/v/out_proj (e.g. ``models.Attention``)."""
        new = cls(attn.q_proj.in_features, attn.n_heads, causal, seed=None)
        new.to(attn.q_proj.weight.dtype)  # a float64 module stays float64
        new.load_state_dict({k: v for k, v in attn.state_dict().items()
                             if k.split(".")[0] in PROJECTIONS})
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        context = attend(self.q_proj(x), self.k_proj(x), self.v_proj(x), self.d_head, self.causal)
        return self.out_proj(context)


def _book_context(Q, K, v_local, start, d_head, causal):
    """This rank's context columns: each of its V columns weighted by its head's probabilities."""
    stop = start + v_local.shape[-1]
    pieces = []
    for h in range(start // d_head, -(-stop // d_head)):
        a, b = max(start, h * d_head), min(stop, (h + 1) * d_head)
        head = slice(h * d_head, (h + 1) * d_head)
        scores = Q[..., head] @ K[..., head].transpose(-2, -1) / math.sqrt(d_head)
        if causal:
            future = torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        pieces.append(F.softmax(scores, dim=-1) @ v_local[..., a - start:b - start])
    return torch.cat(pieces, dim=-1)


class _BookCore(Function):
    """All-gather Q and K, attend with the local V slice; backward: gather again, all-reduce."""

    @staticmethod
    def forward(ctx, q, k, v, start, d_head, causal, grad_sync, group):
        ctx.save_for_backward(q, k, v)  # only the local slices: the full Q, K are gathered again
        ctx.args = (start, d_head, causal, grad_sync, group)
        Q, K = all_gather_cat(q, -1, group), all_gather_cat(k, -1, group)
        return _book_context(Q, K, v, start, d_head, causal)

    @staticmethod
    def backward(ctx, grad):
        q, k, v = ctx.saved_tensors
        start, d_head, causal, grad_sync, group = ctx.args
        Q, K = all_gather_cat(q, -1, group), all_gather_cat(k, -1, group)
        with torch.enable_grad():
            Q, K, v = (t.detach().requires_grad_() for t in (Q, K, v))
            # <out, grad> has gradient grad through out; passing grad as grad_outputs would
            # be the same, but makes torch import its symbolic-shape machinery (seconds)
            dot = (_book_context(Q, K, v, start, d_head, causal) * grad).sum()
            dQ, dK, dv = torch.autograd.grad(dot, (Q, K, v))
        if grad_sync == "all_reduce":  # the chapter's choice; every rank gets the whole sum
            for g in (dQ, dK):
                dist.all_reduce(g, group=group)
            dq, dk = local_slice(dQ, -1, group), local_slice(dK, -1, group)
        else:  # each rank needs only its own slice of the sum
            dq, dk = (reduce_scatter_slice(g, -1, group) for g in (dQ, dK))
        return dq, dk, dv, None, None, None, None, None


def _local_linear(linear: nn.Linear, spec) -> nn.Linear:
    part = nn.Linear(linear.in_features, spec.stop - spec.start)
    with torch.no_grad():
        part.weight.copy_(spec.take(linear.weight))
        part.bias.copy_(linear.bias[spec.start:spec.stop])
    return part


class BookAttention(nn.Module):
    """Figures 8-17/8-18: Q, K, V split by features over the ranks; X broadcast from ``src``.

    ``grad_sync`` is how the partial gradients of the gathered Q and K (activation
    gradients; the weight gradients need no collective) are summed in the backward pass:
    ``"all_reduce"``, the collective the chapter names, or ``"reduce_scatter"``, which
    delivers to each rank only the slice it keeps (half the bytes).
    """

    def __init__(self, ref: SelfAttention, group=None, src: int = 0,
                 grad_sync: str = "all_reduce"):
        super().__init__()
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        check_degree(size, ref.d_model, "features of the hidden size (d_model)")
        check_grad_sync(grad_sync)
        self.group, self.src, self.grad_sync = group, src, grad_sync
        self.d_head, self.causal = ref.d_head, ref.causal
        self.specs = {name: shard_spec(letter, ref.q_proj.weight.shape, "rows", size)[rank]
                      for name, letter in PROJECTIONS.items() if name != "out_proj"}
        self.q_proj, self.k_proj, self.v_proj = (
            _local_linear(getattr(ref, n), self.specs[n]) for n in ("q_proj", "k_proj", "v_proj"))
        self.out_proj = RowParallelLinear.from_linear(ref.out_proj, input_is_parallel=True,
                                                      group=group, name="W_O")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` is the embeddings on ``src``; the other ranks pass a placeholder of its shape."""
        x = broadcast_from(x, self.src, self.group)
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        start = self.specs["v_proj"].start
        context = _BookCore.apply(q, k, v, start, self.d_head, self.causal, self.grad_sync,
                                  self.group)
        return self.out_proj(context)

    def local_grads(self) -> dict:
        out = {}
        for name in ("q_proj", "k_proj", "v_proj"):
            spec = self.specs[name]
            layer = getattr(self, name)
            out[f"{name}.weight"] = (layer.weight.grad, spec)
            out[f"{name}.bias"] = (layer.bias.grad, spec.bias(f"b{spec.name[1:]}"))
        out["out_proj.weight"] = (self.out_proj.weight.grad, self.out_proj.spec)
        out["out_proj.bias"] = (self.out_proj.bias.grad, None)
        return out


class MegatronAttention(nn.Module):
    """Megatron-LM: whole heads per rank; one all-reduce forward, one backward.

    ``qkv`` is one :class:`ColumnParallelLinear` over the fused weight [W_Q; W_K; W_V],
    its rows ordered rank by rank (Q, K, V rows of rank 0's heads, then rank 1's ...), so
    the input is copied into the parallel region once and its gradient all-reduced once.
    With ``sequence_parallel`` the input is this rank's tokens (dim 1), all-gathered before
    ``qkv``, and ``out_proj`` reduce-scatters the output back to this rank's tokens.
    """

    def __init__(self, ref: SelfAttention, group=None, sequence_parallel: bool = False):
        super().__init__()
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        check_degree(size, ref.n_heads, "attention heads")
        sp = {"sequence_parallel": sequence_parallel, "sequence_dim": 1}  # x is (b, s, d)
        self.group, self.d_head, self.causal = group, ref.d_head, ref.causal
        self.specs = {name: shard_spec(letter, ref.q_proj.weight.shape, "heads", size,
                                 n_heads=ref.n_heads)[rank]
                      for name, letter in PROJECTIONS.items() if name != "out_proj"}
        fused = nn.Linear(ref.d_model, 3 * ref.d_model, dtype=ref.q_proj.weight.dtype)
        with torch.no_grad():
            parts = [shard_spec("W", ref.q_proj.weight.shape, "heads", size, n_heads=ref.n_heads)[r]
                     for r in range(size)]
            fused.weight.copy_(torch.cat([s.take(getattr(ref, n).weight) for s in parts
                                          for n in ("q_proj", "k_proj", "v_proj")]))
            fused.bias.copy_(torch.cat([getattr(ref, n).bias[s.start:s.stop] for s in parts
                                        for n in ("q_proj", "k_proj", "v_proj")]))
        self.qkv = ColumnParallelLinear.from_linear(fused, gather_output=False, group=group,
                                                    name="W_QKV", **sp)
        self.out_proj = RowParallelLinear.from_linear(ref.out_proj, input_is_parallel=True,
                                                      group=group, name="W_O", **sp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` is replicated: every rank passes the same input (with ``sequence_parallel``,
        this rank's tokens, and the output is this rank's tokens too)."""
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.out_proj(attend(q, k, v, self.d_head, self.causal))

    def local_grads(self) -> dict:
        out = {}
        weights, biases = self.qkv.weight.grad.chunk(3), self.qkv.bias.grad.chunk(3)
        for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
            spec = self.specs[name]
            out[f"{name}.weight"] = (weights[i], spec)
            out[f"{name}.bias"] = (biases[i], spec.bias(f"b{spec.name[1:]}"))
        out["out_proj.weight"] = (self.out_proj.weight.grad, self.out_proj.spec)
        out["out_proj.bias"] = (self.out_proj.bias.grad, None)
        return out


def dtensor_attention(ref: SelfAttention, mesh=None, prepare_input: bool = True) -> nn.Module:
    """A copy of ``ref`` parallelized by ``torch.distributed.tensor.parallel`` over ``mesh``.

    ``ColwiseParallel`` shards q/k/v_proj by output features (whole heads, since the degree
    must divide the heads), ``RowwiseParallel`` shards out_proj by input features and
    all-reduces its output. With ``prepare_input`` the module's input is first declared
    replicated (``PrepareModuleInput``), so the three projections' partial input gradients
    are added up as one DTensor and all-reduced once, as Megatron's fused QKV does; without
    it each ColwiseParallel all-reduces its own input gradient (three all-reduces).
    ``mesh`` defaults to a 1-D mesh over every rank. Any backend whose groups have names
    works: gloo, nccl, and parlab's toy backend, whose log then holds the bytes DTensor moved.
    """
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, parallelize_module)
    from parlab.comm import default_mesh
    mesh = default_mesh() if mesh is None else mesh
    check_degree(mesh.size(), ref.n_heads, "attention heads")
    module = copy.deepcopy(ref)
    if prepare_input:
        parallelize_module(module, mesh, PrepareModuleInput(
            input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),),
            use_local_output=False))
    plan_ = {name: ColwiseParallel() for name in ("q_proj", "k_proj", "v_proj")}
    plan_["out_proj"] = RowwiseParallel()
    return parallelize_module(module, mesh, plan_)

