"""ZeRO across the copies, tensor parallelism inside each copy: two strategies, one DeviceMesh.

A dp x tp mesh (:meth:`parlab.comm.Mesh.build`). Inside each copy, a transformer MLP is
split Megatron's way over the ``tp`` sub-mesh
(:class:`parlab.tensor_parallel.TensorParallelMLP`: fc1 by columns, fc2 by rows). Across
the copies, ZeRO (:class:`parlab.sharded.Zero`) runs over the ``dp`` sub-mesh and shards
what each rank holds, its *local pieces* of fc1 and fc2, among the copies that hold the
same pieces: with tp = 2 and dp = 2 a rank keeps a quarter of the optimizer state (stage
1), and at stage 3 a quarter of the parameters between uses.

Neither strategy knows about the other; each only sees its own process group. On the toy
backend the log tells them apart: the MLP's all-reduces carry "tensor", ZeRO's
reduce-scatters and all-gathers carry "data". :func:`run_zero_tensor` compares every
parameter after one SGD step with one process training the unsplit MLP on the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from parlab.checks import check_choice, check_count
from parlab.comm import Mesh
from parlab.memory import ZERO_STAGES
from parlab.models import MLP
from parlab.sharded import Zero
from parlab.tensor_parallel import merge_grads, TensorParallelMLP

__all__ = ["ZeroTensorRun", "run_zero_tensor", "zero_tensor_rank"]

_D_MODEL, _D_FF = 8, 32


def _problem(batch: int, seed: int):
    torch.manual_seed(seed)
    mlp = MLP(_D_MODEL, _D_FF)
    g = torch.Generator().manual_seed(seed + 1)
    return mlp, torch.randn(batch, _D_MODEL, generator=g), torch.randn(batch, _D_MODEL, generator=g)


def _reference(batch: int, lr: float, seed: int) -> dict:
    mlp, x, y = _problem(batch, seed)
    ((mlp(x) - y) ** 2).mean().backward()
    with torch.no_grad():
        for p in mlp.parameters():
            p -= lr * p.grad
    return {n: p.detach().clone() for n, p in mlp.named_parameters()}


def zero_tensor_rank(dp: int, tp: int, stage: int, batch: int = 8, lr: float = 0.1,
                     seed: int = 0) -> dict:
    """One SGD step on this rank: Megatron's MLP over ``tp``, ZeRO ``stage`` over ``dp``.

    Returns ``{"pieces": {name: (local tensor, ShardSpec or None)}, "held": bytes of the
    model states this rank holds after backward}``.
    """
    mesh = Mesh(dp=dp, tp=tp)
    groups = mesh.groups(mesh.build())
    replica = mesh.coordinates(dist.get_rank()).replica
    mlp, x, y = _problem(batch, seed)
    model = TensorParallelMLP.from_mlp(mlp, group=groups["tensor"])            # tensor
    zero = Zero(model, stage, optimizer="sgd", lr=lr, group=groups["data"])    # data (ZeRO)
    mine = slice(replica * batch // dp, (replica + 1) * batch // dp)
    ((model(x[mine]) - y[mine]) ** 2).mean().backward()
    held = sum(zero.state_bytes().values())
    zero.step()
    for unit in zero.units:  # stage 3 frees the parameters between uses: gather to read them
        if not unit.gathered:
            unit.gather()
    fc1, fc2 = model.fc1, model.fc2
    pieces = {"fc1.weight": (fc1.weight.detach().clone(), fc1.spec),
              "fc1.bias": (fc1.bias.detach().clone(), fc1.spec.bias()),
              "fc2.weight": (fc2.weight.detach().clone(), fc2.spec),
              "fc2.bias": (fc2.bias.detach().clone(), None)}
    return {"pieces": pieces, "held": held}


@dataclass
class ZeroTensorRun:
    """What :func:`run_zero_tensor` found: each copy's MLP stitched from its tensor ranks,
    the one-process reference, the bytes each rank held, and the traffic (toy backend)."""

    dp: int
    tp: int
    stage: int
    copies: list
    reference: dict
    held: list
    traffic: object = None

    @property
    def max_error(self) -> float:
        return max(float((copy[n] - v).abs().max()) for copy in self.copies
                   for n, v in self.reference.items())


def run_zero_tensor(dp: int = 2, tp: int = 2, stage: int = 3, batch: int = 8, lr: float = 0.1,
                    seed: int = 0, backend: str = "toy") -> ZeroTensorRun:
    """Run :func:`zero_tensor_rank` on dp x tp ranks; compare with one process."""
    from parlab.launch import run
    for name, value in (("dp", dp), ("tp", tp), ("batch", batch)):
        check_count(name, value)
    check_choice("stage", stage, ZERO_STAGES)
    if batch % dp:
        raise ValueError(f"batch={batch} does not split into dp={dp} equal shares")
    ranks = run(zero_tensor_rank, dp * tp, dp, tp, stage, batch, lr, seed, backend=backend)
    mesh = Mesh(dp=dp, tp=tp)
    copies = [merge_grads([ranks[mesh.rank_at(d, 0, t)]["pieces"] for t in range(tp)])
              for d in range(dp)]
    return ZeroTensorRun(dp, tp, stage, copies, _reference(batch, lr, seed),
                         [r["held"] for r in ranks], ranks.traffic)
