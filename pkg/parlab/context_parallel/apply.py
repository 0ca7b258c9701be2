"""Context parallelism applied to a whole model: every attention layer's core swapped in place.

Why this module exists: ring, all-gather and Ulysses attention are functions of one rank's
q, k and v. A training script wants them inside its model, the way torchtitan's ``apply_cp``
puts PyTorch's ``context_parallel`` into a Llama: :func:`apply_context_parallel` replaces
the attention core (``core(q, k, v)``) of each :class:`parlab.models.Attention` (GPT) and
:class:`parlab.models.LlamaAttention` in a module, and whatever depends on a token's position
(a Llama's rotary tables, a GPT's position embeddings) with the positions of this rank's
shard. Everything else in a block works token by token, so it runs unchanged on the shard:
each rank then takes ``(batch, S/p)`` token ids (or ``(batch, S/p, d)`` activations for a
block) cut by :func:`parlab.context_parallel.shard` with the same layout, and returns its
rows of the output.

The weights stay whole on every rank, so their gradients are partial sums over the shards:
average them over the context-parallel ranks as over data-parallel replicas (each rank's loss
is the mean over its own tokens, so with equal shards the average of the ranks' losses is the
whole sequence's). What each rank keeps for the backward pass then depends on the method
(:func:`parlab.memory.block_activations` with ``cp`` and ``cp_method``, measured in the
tests): per token, everything a block keeps for its own S/p tokens, and for the attention
core: ring, our own Function, this rank's q, k, v, output and one log-sum-exp per row; all-gather,
the gathered keys and values of the whole sequence; Ulysses, the full sequence for H/p heads.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from torch import nn

from parlab.checks import check_choice
from parlab.context_parallel.allgather import all_gather_attention
from parlab.context_parallel.layouts import LAYOUTS, positions
from parlab.context_parallel.ring import ring_attention
from parlab.context_parallel.ulysses import ulysses_attention
from parlab.models import Attention, GPT, LlamaAttention, rotary_cos_sin

__all__ = ["CP_METHODS", "apply_context_parallel"]

#: The context-parallel attention methods, by the name ``apply_context_parallel`` takes.
CP_METHODS = {"ring": ring_attention, "all-gather": all_gather_attention,
              "ulysses": ulysses_attention}


def _shard_positions(t: int, device, group, layout: str) -> torch.Tensor:
    """The global positions of this rank's ``t`` tokens (the whole sequence is t x p)."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    return positions(t * world, rank, world, layout).to(device)


def _core(q, k, v, *, attention, group, layout):
    return attention(q, k, v, causal=True, layout=layout, group=group)


def _rotary(t, device, dtype, *, module, group, layout):
    return rotary_cos_sin(t, module.d_head, module.rope_theta, device, dtype,
                          _shard_positions(t, device, group, layout))


def apply_context_parallel(model: nn.Module, group=None, *, method: str = "ring",
                           layout: str = "contiguous") -> nn.Module:
    """Make ``model`` (in place, and returned) take this rank's shard of each sequence.

    ``method``: one of :data:`CP_METHODS`; ``layout``: one of
    :data:`parlab.context_parallel.LAYOUTS`; ``group``: the context-parallel ranks (default
    the world). Every rank calls the model with the same shapes, its shard cut with
    ``layout``. A model with no attention layer is refused: there would be nothing to split.
    """
    check_choice("method", method, tuple(CP_METHODS))
    check_choice("layout", layout, LAYOUTS)
    swapped = 0
    for module in model.modules():
        if isinstance(module, (Attention, LlamaAttention)):
            module.core = functools.partial(_core, attention=CP_METHODS[method], group=group,
                                            layout=layout)
            swapped += 1
        if isinstance(module, LlamaAttention):
            module.rotary = functools.partial(_rotary, module=module, group=group,
                                              layout=layout)
        if isinstance(module, GPT):
            module.positions = functools.partial(_shard_positions, group=group, layout=layout)
    if not swapped:
        raise ValueError(f"{type(model).__name__} has no parlab.models.Attention or "
                         f"LlamaAttention layer for context parallelism to split")
    return model
