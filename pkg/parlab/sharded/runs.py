"""ZeRO runs on N real ranks, checked step by step against one process training alone.

Why a module of its own: :mod:`parlab.sharded.zero` is the mechanism; this is the experiment
around it. :class:`ZeroSpec` is a small deterministic problem (an MLP of ``nn.Linear``
layers, fresh data every step, Adam by default). :func:`train_zero` runs it with one ZeRO
stage on N ranks (gloo, nccl, or the logging toy backend) and brings home, per rank and
step, the loss, the rank's slice of every layer and the model-state bytes it held;
:func:`zero_reference` is one process on the whole batch. :class:`ShardRun` rebuilds the parameters from the
slices, compares them with the reference and tabulates memory and traffic.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from parlab.comm import run_with_traffic, TrafficLog
from parlab.launch import rank_device, run
from parlab.memory import check_optimizer
from parlab.sharded.flat import parameter_layers
from parlab.sharded.zero import check_stage, optimizer_by_name, Zero
from parlab.checks import check_count

__all__ = ["ZeroSpec", "RankResult", "ShardRun", "make_zero_model", "make_zero_batch",
           "local_batch",
           "layer_values", "train_zero", "zero_rank", "zero_reference", "launch_spec"]


@dataclass(frozen=True)
class ZeroSpec:
    """An MLP ``sizes[0] -> ... -> sizes[-1]`` with Tanh between layers, trained on fresh
    random batches of ``samples`` (split evenly over the ranks) for ``steps`` steps."""

    sizes: tuple = (16, 32, 32, 8)
    samples: int = 16
    steps: int = 3
    lr: float = 1e-2
    optimizer: str = "adam"
    seed: int = 0

    def __post_init__(self):
        check_optimizer(self.optimizer)
        if len(self.sizes) < 2 or any(isinstance(n, bool) or not isinstance(n, int) or n < 1
                                      for n in self.sizes):
            raise ValueError(f"sizes must be two or more positive integers, got {self.sizes!r}")
        for name in ("samples", "steps"):
            check_count(name, getattr(self, name))

    def replace(self, **changes) -> "ZeroSpec":
        return replace(self, **changes)

    @property
    def parameters(self) -> int:
        return sum(a * b + b for a, b in zip(self.sizes, self.sizes[1:]))


def make_zero_model(spec: ZeroSpec) -> nn.Sequential:
    """The spec's MLP, initialised from ``spec.seed`` (the same on every rank and run)."""
    torch.manual_seed(spec.seed)
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(spec.sizes, spec.sizes[1:])):
        layers += [nn.Linear(a, b)] + ([nn.Tanh()] if i < len(spec.sizes) - 2 else [])
    return nn.Sequential(*layers)


def make_zero_batch(spec: ZeroSpec, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s whole batch: inputs and targets of a fixed smooth function."""
    g = torch.Generator().manual_seed(10_007 * (spec.seed + 1) + step)
    x = torch.randn(spec.samples, spec.sizes[0], generator=g)
    mix = torch.randn(spec.sizes[0], spec.sizes[-1],
                      generator=torch.Generator().manual_seed(spec.seed + 3))
    return x, torch.sin(x @ mix)


def local_batch(spec: ZeroSpec, step: int, rank: int, world_size: int):
    """Rank ``rank``'s equal slice of step ``step``'s batch."""
    x, y = make_zero_batch(spec, step)
    return x.chunk(world_size)[rank], y.chunk(world_size)[rank]


def layer_values(model: nn.Module) -> list[torch.Tensor]:
    """Each layer's parameters end to end (weight then bias), as ``FlatShard`` lays them out."""
    return [torch.cat([p.detach().reshape(-1) for p in m.parameters()]).cpu()
            for m in parameter_layers(model)]


@dataclass
class RankResult:
    """What one rank brings home: per step its loss and its slice of every layer; the
    model-state bytes it held at the end of the last backward pass; its collectives."""

    rank: int
    losses: list[float]
    slices: list[list[torch.Tensor]]
    state_bytes: dict[str, int]
    events: list[tuple[str, str, int]] = field(default_factory=list)


def zero_rank(spec: ZeroSpec, stage: int) -> RankResult:
    """Runs on every rank: ``spec.steps`` steps of ZeRO ``stage`` on this rank's slice."""
    rank, world = dist.get_rank(), dist.get_world_size()
    device = rank_device()
    model = make_zero_model(spec).to(device)
    zero = Zero(model, stage, spec.optimizer, spec.lr)
    losses, slices, state = [], [], {}
    for step in range(spec.steps):
        x, y = (t.to(device) for t in local_batch(spec, step, rank, world))
        loss = F.mse_loss(model(x), y)
        loss.backward()
        state = zero.state_bytes()
        zero.step()
        losses.append(loss.item())
        slices.append(zero.shard_values())
    return RankResult(rank, losses, slices, state, zero.events)


def zero_reference(spec: ZeroSpec) -> list[tuple[float, list[torch.Tensor]]]:
    """One process, whole batch: per step the loss and every layer's parameters after it."""
    model = make_zero_model(spec)
    optimizer = optimizer_by_name(spec.optimizer, model.parameters(), spec.lr)
    out = []
    for step in range(spec.steps):
        x, y = make_zero_batch(spec, step)
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        out.append((loss.item(), layer_values(model)))
    return out


@dataclass
class ShardRun:
    """A finished run: every rank's :class:`RankResult`, and the toy backend's log if logged."""

    stage: int
    world_size: int
    spec: ZeroSpec
    ranks: list[RankResult]
    log: TrafficLog | None = None
    rebuilt: list[list[torch.Tensor]] | None = None   # per step, every layer (FSDP's layout)

    def losses(self) -> list[float]:
        """The whole batch's loss per step (the ranks' equal slices averaged)."""
        return [sum(r.losses[s] for r in self.ranks) / self.world_size
                for s in range(self.spec.steps)]

    def parameters(self, step: int) -> list[torch.Tensor]:
        """Every layer's parameters after ``step``, put together from the ranks' slices."""
        if self.rebuilt is not None:
            return self.rebuilt[step]
        return [torch.cat([r.slices[step][i] for r in self.ranks])
                for i in range(len(self.ranks[0].slices[step]))]

    def max_difference(self, ref=None) -> float:
        """Largest difference from :func:`zero_reference` over every step's loss and parameters."""
        ref = zero_reference(self.spec) if ref is None else ref
        worst = 0.0
        for step, (loss, layers) in enumerate(ref):
            worst = max(worst, abs(self.losses()[step] - loss))
            for mine, theirs in zip(self.parameters(step), layers):
                worst = max(worst, (mine - theirs).abs().max().item())
        return worst

    def state_bytes(self) -> list[dict[str, int]]:
        """Per rank: parameters, gradients and optimizer state held after the last backward."""
        return [r.state_bytes for r in self.ranks]

    def bytes_sent_per_step(self) -> float:
        """Bytes each rank sent per step, averaged over ranks and steps (needs the toy log)."""
        if self.log is None:
            raise ValueError("no traffic log: run with backend='toy'")
        return self.log.total_bytes() / self.world_size / self.spec.steps

    def collectives(self):
        """One row per collective of rank 0's first step: what, when, which layer, bytes sent."""
        import pandas as pd
        if self.log is None:
            raise ValueError("no traffic log: run with backend='toy'")
        events = self.ranks[0].events
        per_step = len(events) // self.spec.steps
        rows = []
        for call, (op, phase, layer) in enumerate(events[:per_step]):
            sent = self.log.filter(call=call).total_bytes() // self.world_size
            rows.append({"collective": op, "phase": phase, "layer": layer,
                         "bytes sent per rank": sent})
        return pd.DataFrame(rows)


def launch_spec(rank_fn, world_size: int, spec: ZeroSpec, *args, backend: str | None = None,
                timeout: float | None = None) -> tuple[list, TrafficLog | None]:
    """Check ``world_size`` against ``spec``, then run ``rank_fn(spec, *args)`` on every rank.

    Returns the ranks' results and, with ``backend="toy"``, the merged traffic log.
    """
    check_count("world_size", world_size)
    if spec.samples % world_size:
        raise ValueError(f"spec.samples={spec.samples} does not split evenly over world_size="
                         f"{world_size} ranks; use a multiple of {world_size} samples")
    options = {} if timeout is None else {"timeout": timeout}
    if backend == "toy":
        return run_with_traffic(rank_fn, world_size, spec, *args, **options)
    return run(rank_fn, world_size, spec, *args, backend=backend, **options), None


def train_zero(stage: int, world_size: int, spec: ZeroSpec = ZeroSpec(), *,
          backend: str | None = None, timeout: float | None = None) -> ShardRun:
    """ZeRO ``stage`` on ``world_size`` real ranks; ``backend="toy"`` also logs every byte."""
    check_stage(stage)
    results, log = launch_spec(zero_rank, world_size, spec, stage, backend=backend,
                               timeout=timeout)
    return ShardRun(stage, world_size, spec, results, log)
