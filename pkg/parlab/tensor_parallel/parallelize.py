"""Apply tensor parallelism to a whole model: swap each block's layers for Megatron's.

Like torchtitan's ``parallelize_module`` step, :func:`parallelize` walks a
:class:`parlab.models.GPT` and replaces, inside every transformer block, the attention
with :class:`~parlab.tensor_parallel.attention.MegatronAttention` (whole heads per rank)
and the MLP with :class:`~parlab.tensor_parallel.layers.TensorParallelMLP` (fc1 by
columns, fc2 by rows), all over one process group: the ``tp`` dimension of a
``DeviceMesh``. LayerNorms, embeddings and the head stay replicated and get identical
gradients on every tensor rank. The model keeps its shape, so a pipeline cuts it and data
parallelism averages it exactly as it would the unsplit model: that is how the 3D job in
:mod:`parlab.hybrid` is composed.

:func:`shard_pieces` lists every parameter as ``(local piece, ShardSpec or None)`` under
the unsplit model's names, and :func:`parlab.tensor_parallel.merge_grads` glues the ranks' pieces back, so a run
can be compared with the one-device model name by name.
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from parlab.tensor_parallel.attention import MegatronAttention, SelfAttention
from parlab.tensor_parallel.layers import TensorParallelMLP

__all__ = ["TensorParallelBlock", "parallelize", "shard_pieces",
           "allreduce_sequence_parallel_grads"]


class TensorParallelBlock(nn.Module):
    """A :class:`parlab.models.Block` with Megatron attention and MLP over ``group``.

    ``sequence_parallel=True`` (Korthikanti et al., 2022): the block's input and output are
    this rank's share of the tokens (``(batch, S/t, d_model)``, contiguous), so the
    LayerNorms, the residual additions and their activations are split t ways instead of
    replicated; the attention and the MLP each all-gather the tokens on the way in and
    reduce-scatter them on the way out, where plain tensor parallelism all-reduces. The
    LayerNorms' and the row-parallel biases' gradients then cover this rank's tokens only:
    sum them over ``group`` with :func:`allreduce_sequence_parallel_grads` before a step.
    """

    def __init__(self, block: nn.Module, group, sequence_parallel: bool = False):
        super().__init__()
        self.ln1, self.ln2 = block.ln1, block.ln2
        self.attn = MegatronAttention(SelfAttention.from_module(block.attn), group=group,
                                      sequence_parallel=sequence_parallel)
        self.mlp = TensorParallelMLP.from_mlp(block.mlp, group=group,
                                              sequence_parallel=sequence_parallel,
                                              sequence_dim=1)
        if sequence_parallel:
            for p in (*self.ln1.parameters(), *self.ln2.parameters()):
                p.sequence_parallel = True

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))

    def pieces(self, prefix: str) -> dict:
        """``{unsplit name: (local tensor, ShardSpec or None)}`` of this rank's parameters."""
        out = {f"{prefix}.{n}": (p.detach(), None) for n, p in
               (*self.ln1.named_parameters("ln1"), *self.ln2.named_parameters("ln2"))}
        attn = self.attn
        weights, biases = attn.qkv.weight.detach().chunk(3), attn.qkv.bias.detach().chunk(3)
        for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
            spec = attn.specs[name]
            out[f"{prefix}.attn.{name}.weight"] = (weights[i], spec)
            out[f"{prefix}.attn.{name}.bias"] = (biases[i], spec.bias())
        out[f"{prefix}.attn.out_proj.weight"] = (attn.out_proj.weight.detach(), attn.out_proj.spec)
        out[f"{prefix}.attn.out_proj.bias"] = (attn.out_proj.bias.detach(), None)
        fc1, fc2 = self.mlp.fc1, self.mlp.fc2
        out[f"{prefix}.mlp.fc1.weight"] = (fc1.weight.detach(), fc1.spec)
        out[f"{prefix}.mlp.fc1.bias"] = (fc1.bias.detach(), fc1.spec.bias())
        out[f"{prefix}.mlp.fc2.weight"] = (fc2.weight.detach(), fc2.spec)
        out[f"{prefix}.mlp.fc2.bias"] = (fc2.bias.detach(), None)
        return out


def parallelize(model: nn.Module, group) -> nn.Module:
    """Split every block of ``model`` (a :class:`parlab.models.GPT`) over ``group``, in place.

    Returns the model. Each rank of ``group`` must call it on the same (same-seeded)
    model: each keeps its own slice of every split weight.
    """
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList):
        raise TypeError(f"parallelize needs a model with a ModuleList of transformer blocks "
                        f"(parlab.models.GPT), got {type(model).__name__}")
    for i, block in enumerate(blocks):
        blocks[i] = TensorParallelBlock(block, group)
    return model


def allreduce_sequence_parallel_grads(module: nn.Module, group=None) -> None:
    """Sum over ``group`` the gradients of the parameters marked ``sequence_parallel`` (what
    Megatron-LM does for them before the optimizer step): replicated weights that each rank
    applied to its own tokens only, so each rank holds a part of their gradient."""
    for p in module.parameters():
        if getattr(p, "sequence_parallel", False) and p.grad is not None \
                and dist.get_world_size(group) > 1:
            dist.all_reduce(p.grad, group=group)


def shard_pieces(module: nn.Module) -> dict:
    """``{unsplit name: (local tensor, ShardSpec or None)}`` for every parameter of
    ``module`` (any part of a model that :func:`parallelize` split): a split block's pieces
    come with their spec, every other parameter whole, under its name in the unsplit model."""
    out, inside = {}, set()
    for name, child in module.named_modules():
        if isinstance(child, TensorParallelBlock):
            out.update(child.pieces(name))
            inside |= {id(p) for p in child.parameters()}
    for name, p in module.named_parameters():
        if id(p) not in inside:
            out[name] = (p.detach(), None)
    return out
