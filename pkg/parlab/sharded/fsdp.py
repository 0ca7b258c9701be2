"""The same problem through PyTorch's own FSDP (``torch.distributed.fsdp.fully_shard``, FSDP2).

Why this module exists: :mod:`parlab.sharded.zero` shows the mechanism; a reader then meets
it as FSDP. ``fully_shard`` on each ``nn.Linear`` and then on the model is ZeRO stage 3 with
layer-sized units: every parameter becomes a ``DTensor`` sharded along dimension 0 (rank r
keeps chunk r of ``tensor.chunk(N)``), gathered before each layer's forward and backward and
freed after, its gradient reduce-scattered. It runs on CPU ranks with gloo, and on the toy
backend, whose log then shows FSDP's own all-gathers and reduce-scatters.
:func:`train_fsdp` returns the same :class:`~parlab.sharded.runs.ShardRun` as ours, so the
two are compared number for number.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from parlab.comm import default_mesh, toy, TrafficLog
from parlab.launch import rank_device
from parlab.sharded.flat import parameter_layers
from parlab.sharded.runs import (
    launch_spec, local_batch, make_zero_model, RankResult, ShardRun, ZeroSpec, zero_rank
)
from parlab.sharded.zero import check_stage, optimizer_by_name

__all__ = ["train_fsdp", "fsdp_rank", "train_stages"]


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _state_bytes(model, optimizer) -> dict[str, int]:
    """Bytes this rank holds of each kind: the local shards of parameters, gradients, state."""
    params = list(model.parameters())
    state = [v for s in optimizer.state.values() for v in s.values()
             if isinstance(v, torch.Tensor) and v.dim() > 0]
    count = lambda ts: sum(_local(t).numel() * _local(t).element_size()   # noqa: E731
                           for t in ts if t is not None)
    return {"parameters": count(params), "gradients": count(p.grad for p in params),
            "optimizer_state": count(state)}


def _slices(model) -> list[torch.Tensor]:
    """This rank's dimension-0 chunk of every parameter, layer by layer (weight, then bias).

    Rank r's chunks of all ranks, stacked in rank order per parameter, rebuild the parameter;
    :func:`train_fsdp` does that so the result compares with :func:`~parlab.sharded.zero_reference`.
    """
    return [[_local(p).detach().cpu().clone() for p in m.parameters()]
            for m in parameter_layers(model)]


def fsdp_rank(spec: ZeroSpec) -> RankResult:
    """Runs on every rank: ``spec.steps`` steps with ``fully_shard`` on every layer."""
    from torch.distributed.fsdp import fully_shard

    rank, world = dist.get_rank(), dist.get_world_size()
    device = rank_device()
    # the mesh of the ranks' own device: FSDP2's default mesh is on CUDA whenever a GPU is
    # present and puts rank r on GPU r, which fails on gloo ranks beside fewer GPUs than ranks
    mesh = default_mesh()
    model = make_zero_model(spec).to(device)
    for layer in parameter_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = optimizer_by_name(spec.optimizer, model.parameters(), spec.lr)
    losses, slices, state = [], [], {}
    for step in range(spec.steps):
        x, y = (t.to(device) for t in local_batch(spec, step, rank, world))
        loss = F.mse_loss(model(x), y)
        loss.backward()
        state = _state_bytes(model, optimizer)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        slices.append(_slices(model))
    return RankResult(rank, losses, slices, state)


def train_fsdp(world_size: int, spec: ZeroSpec = ZeroSpec(), *, backend: str | None = None,
               timeout: float | None = None) -> ShardRun:
    """:func:`~parlab.sharded.train_zero` with ``fully_shard`` instead of ours (ZeRO stage 3).

    FSDP shards each tensor along dimension 0, not each layer's flat buffer, so the run
    carries each step's layers rebuilt from the ranks' chunks (``ShardRun.rebuilt``):
    :meth:`ShardRun.parameters` and :meth:`ShardRun.max_difference` then work unchanged.
    """
    results, log = launch_spec(fsdp_rank, world_size, spec, backend=backend, timeout=timeout)
    return ShardRun(3, world_size, spec, results, log, _rebuilt(results, spec))


def _rebuilt(results, spec: ZeroSpec):
    """Per step, every layer put together from the ranks' dimension-0 chunks (FSDP's layout)."""
    return [[torch.cat([torch.cat([r.slices[step][i][j] for r in results]).reshape(-1)
                        for j in range(len(results[0].slices[step][i]))])
             for i in range(len(results[0].slices[step]))]
            for step in range(spec.steps)]


def train_stages(world_size: int, spec: ZeroSpec = ZeroSpec(), stages=(0, 1, 2, 3), *,
                 fsdp: bool = True, backend: str | None = None,
                 timeout: float | None = None) -> list[ShardRun]:
    """:func:`~parlab.sharded.train_zero` for each of ``stages``, then (``fsdp``) :func:`train_fsdp`,
    all in one launch: the same runs, one after another in the same ranks, each with its own
    traffic log (the toy log is cleared between them). One launch instead of five."""
    for stage in stages:
        check_stage(stage)
    jobs = [("ZeRO", stage) for stage in stages] + ([("FSDP2", 3)] if fsdp else [])
    results, _ = launch_spec(_jobs_rank, world_size, spec, jobs, backend=backend,
                             timeout=timeout)
    runs = []
    for j, (kind, stage) in enumerate(jobs):
        ranks = [rank[j][0] for rank in results]
        log = TrafficLog.merge([rank[j][1] for rank in results]) if backend == "toy" else None
        runs.append(ShardRun(stage, world_size, spec, ranks, log,
                             _rebuilt(ranks, spec) if kind == "FSDP2" else None))
    return runs


def _jobs_rank(spec: ZeroSpec, jobs) -> list[tuple[RankResult, TrafficLog | None]]:
    """Runs on every rank: each job in turn, with what this rank sent during it."""
    out = []
    for kind, stage in jobs:
        toy.clear_transfers()
        result = fsdp_rank(spec) if kind == "FSDP2" else zero_rank(spec, stage)
        out.append((result, toy.sent_log()))
    return out
