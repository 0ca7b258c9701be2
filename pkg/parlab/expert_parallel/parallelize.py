"""``apply_expert_parallel``: give every MoE layer of a model its rank's experts.

As torchtitan's ``apply_*`` functions do, it changes the model in place and composes with
the other strategies: the router and any shared expert stay replicated (their gradients are
data-parallel gradients, summed over the ranks that hold them), while each routed expert
now exists on one rank of the expert-parallel group only, which is where every gradient of
it arrives through the all-to-all's backward pass.
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from parlab.expert_parallel.dispatch import AllToAllDispatcher
from parlab.models import MoE

__all__ = ["apply_expert_parallel", "local_experts", "global_parameter_names"]


def local_experts(n_experts: int, ep: int, rank: int) -> range:
    """The global ids of the experts rank ``rank`` of an ``ep``-rank group holds."""
    if n_experts % ep:
        raise ValueError(f"n_experts={n_experts} does not split over ep={ep} ranks; the "
                         f"expert-parallel degree must divide the number of experts")
    per = n_experts // ep
    return range(rank * per, (rank + 1) * per)


def apply_expert_parallel(model: nn.Module, group=None, layout: str = "uneven") -> nn.Module:
    """Keep, in every :class:`~parlab.models.MoE` of ``model``, only this rank's experts, and
    route through an all-to-all over ``group`` (None: every rank). Returns ``model``."""
    ep, rank = dist.get_world_size(group), dist.get_rank(group)
    layers = [m for m in model.modules() if isinstance(m, MoE)]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no MoE layer to parallelize")
    for layer in layers:
        ids = local_experts(layer.config.n_experts, ep, rank)
        layer.experts = nn.ModuleList(layer.experts[i] for i in ids)
        layer.dispatcher = AllToAllDispatcher(layer.config.n_experts, group, layout)
    return model


def global_parameter_names(model: nn.Module, group=None) -> dict[str, str]:
    """Each parameter's name in ``model`` (after :func:`apply_expert_parallel` over ``group``)
    mapped to its name in the unsplit model: a kept expert's local index becomes its global
    id (``experts.0.*`` on rank 1 of 2 with 4 experts is ``experts.2.*``); others keep theirs."""
    ep, rank = dist.get_world_size(group), dist.get_rank(group)
    names = {name: name for name, _ in model.named_parameters()}
    for prefix, layer in model.named_modules():
        if isinstance(layer, MoE):
            ids = local_experts(layer.config.n_experts, ep, rank)
            head = f"{prefix}." if prefix else ""
            for i, expert in enumerate(layer.experts):
                for name, _ in expert.named_parameters():
                    names[f"{head}experts.{i}.{name}"] = f"{head}experts.{ids[i]}.{name}"
    return names
