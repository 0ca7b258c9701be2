"""ZeRO stages 0 to 3 by hand: who keeps what, and which collective moves it, step by step.

Why this module exists: data parallelism (chapter 02) keeps a whole copy of everything on
every rank: parameters Ψ, gradients Ψ and optimizer state KΨ. ZeRO (Rajbhandari et al.,
2020) removes the copies one kind at a time. Each layer's parameters form a
:class:`~parlab.sharded.flat.FlatShard`; rank r owns slice r of it and keeps the optimizer
state only for that slice. With N ranks and Ψ parameter elements:

========  ==========================  ==========================================  ==============
stage     kept per rank               collectives of one step                     elements sent
========  ==========================  ==========================================  ==============
0 (DDP)   Ψ params, Ψ grads, KΨ opt   all-reduce of the gradients                 2(N-1)/N Ψ
1         Ψ params, Ψ grads, KΨ/N     reduce-scatter grads, all-gather params     2(N-1)/N Ψ
2         Ψ params, Ψ/N grads, KΨ/N   the same, each layer's reduce-scatter       2(N-1)/N Ψ
                                      during backward (its full grads then freed)
3         Ψ/N of all three            all-gather before each layer's forward      3(N-1)/N Ψ
                                      and backward, reduce-scatter of its grads
========  ==========================  ==========================================  ==============

A ring all-reduce *is* a reduce-scatter followed by an all-gather, so stages 1 and 2 cost
the same bytes as plain data parallelism; stage 3 adds one all-gather, 1.5 times the bytes.
The update is exact: Adam and SGD act element by element, so updating each slice with the
averaged gradient of that slice gives the same numbers as updating the whole tensor.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from parlab.memory import check_optimizer, ZERO_STAGES
from parlab.sharded.flat import FlatShard, parameter_layers
from parlab.checks import check_choice

__all__ = ["Zero", "STATE_PARTS", "check_stage", "optimizer_by_name"]

#: The model states a rank holds (the keys of :meth:`Zero.state_bytes`), in the order of a
#: stacked bar.
STATE_PARTS = ("parameters", "gradients", "optimizer_state")


def check_stage(stage) -> int:
    return check_choice("ZeRO stage", stage, ZERO_STAGES)


def optimizer_by_name(name: str, params, lr: float):
    """``torch.optim`` for one of :data:`parlab.memory.OPTIMIZERS` ("momentum" is 0.9)."""
    check_optimizer(name)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    return torch.optim.SGD(params, lr=lr, momentum=0.9 if name == "momentum" else 0.0)


def _unique_bytes(tensors) -> int:
    storages = {}
    for t in tensors:
        if t is not None and t.dim() > 0:   # optimizers' scalar step counters are not counted
            s = t.untyped_storage()
            storages[s.data_ptr()] = s.nbytes()
    return sum(storages.values())


class Zero:
    """Data parallelism over ``group`` (default: every rank) with ZeRO ``stage`` for ``model``.

    The layers are ``model``'s children that have parameters (an ``nn.Sequential`` of layers,
    as in the chapter); each becomes a :class:`FlatShard`. Use it like an optimizer::

        zero = Zero(model, stage=3, optimizer="adam", lr=1e-2)
        loss_fn(model(x_of_this_rank), y_of_this_rank).backward()
        zero.step()

    ``events`` lists ``(collective, phase, layer)`` in the order this rank called them, so the
    n-th entry names the n-th collective of the traffic log.

    ``group`` is the data-parallel dimension of a larger job (``mesh["dp"]``'s group): the
    copies that ZeRO shards across. ``model`` may itself be split by another strategy on
    another dimension (tensor-parallel layers): ZeRO then shards each rank's local pieces.
    """

    def __init__(self, model: nn.Module, stage: int, optimizer: str = "adam", lr: float = 1e-2,
                 group=None):
        self.stage = check_stage(stage)
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        layers = parameter_layers(model)
        covered = sum(p.numel() for m in layers for p in m.parameters())
        if not layers or covered != sum(p.numel() for p in model.parameters()):
            layers = [model]          # parameters outside the children: one unit for all
        self.model, self.world_size = model, world
        self.units = [FlatShard(m, rank, world, own_shard=stage == 3, group=group)
                      for m in layers]
        params = (list(model.parameters()) if stage == 0 else [u.shard for u in self.units])
        self.optimizer = optimizer_by_name(optimizer, params, lr)
        self.events: list[tuple[str, str, int]] = []
        self._ready = [0] * len(self.units)
        if stage >= 2:
            for i, unit in enumerate(self.units):
                for p in unit.params:
                    p.register_post_accumulate_grad_hook(lambda p, i=i: self._grad_ready(i))
        if stage == 3:
            for i, unit in enumerate(self.units):
                unit.free()
                unit.module.register_forward_pre_hook(lambda m, args, i=i: self._gather(i, "forward"))
                unit.module.register_forward_hook(lambda m, args, out, i=i: self._after_forward(i, out))

    # ------------------------------------------------------------------ hooks (stages 2, 3)

    def _gather(self, i: int, phase: str) -> None:
        self.events.append(("all_gather", phase, i))
        self.units[i].gather()

    def _after_forward(self, i: int, output):
        self.units[i].free()
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda grad: self._gather(i, "backward"))

    def _grad_ready(self, i: int) -> None:
        self._ready[i] += 1
        if self._ready[i] == len(self.units[i].params):     # the whole layer's gradient is in
            self._ready[i] = 0
            self.events.append(("reduce_scatter", "backward", i))
            self.units[i].reduce_scatter_grad()
            if self.stage == 3:
                self.units[i].free()

    # ------------------------------------------------------------------ the step

    def step(self) -> None:
        """Finish the gradient exchange, update this rank's slice, share the new parameters."""
        backward_order = range(len(self.units) - 1, -1, -1)
        if self.stage in (0, 1):
            for i in backward_order:
                if self.stage == 0:
                    self.events.append(("all_reduce", "backward", i))
                    self.units[i].all_reduce_grad()
                else:
                    self.events.append(("reduce_scatter", "backward", i))
                    self.units[i].reduce_scatter_grad()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.stage in (1, 2):
            for i, unit in enumerate(self.units):
                self.events.append(("all_gather", "update", i))
                unit.gather()

    def state_bytes(self) -> dict[str, int]:
        """Bytes this rank holds now: parameters, gradients, optimizer state (distinct storages).

        Called after ``backward`` and before :meth:`step`, this is the peak of the model states
        (gradients all present, optimizer state from earlier steps). A freed layer counts 0.
        """
        params = [p for u in self.units for p in u.params] + [u.shard for u in self.units]
        grads = [t.grad for t in params]
        state = [v for s in self.optimizer.state.values() for v in s.values()
                 if isinstance(v, torch.Tensor)]
        return {"parameters": _unique_bytes(params), "gradients": _unique_bytes(grads),
                "optimizer_state": _unique_bytes(state)}

    def shard_values(self) -> list[torch.Tensor]:
        """This rank's slice of every layer (unpadded), to rebuild the parameters outside."""
        return [u.values() for u in self.units]
