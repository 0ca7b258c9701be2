"""Expert parallelism inside data parallelism: the layout every MoE training job uses.

``dp`` ranks each train on their own slice of the batch. The dense weights (here a linear
layer, the router and a shared expert) are replicated on all of them, as in plain data
parallelism. The experts are not: the ``dp`` ranks are cut into runs of ``ep`` consecutive
ranks (:meth:`parlab.comm.Mesh.expert_ranks`), each run splits the experts among its ranks
(:func:`parlab.expert_parallel.apply_expert_parallel` over the ``expert`` group), and each
expert is held by ``dp / ep`` ranks, one per run: its ``expert_data`` group.

After backward, with every rank's loss the mean over its own tokens:

- a dense weight's gradient on each rank covers that rank's tokens, so the ``dp`` ranks
  average them (:func:`parlab.data_parallel.all_reduce_buckets` over every rank);
- an expert's gradient on its holder already sums the tokens of its whole ``expert`` run
  (the all-to-all's backward brought them), each weighted 1/T_rank. The ``expert_data``
  group sums the runs, which makes sum over all tokens / T_rank: dividing by ``dp`` gives
  the mean over all tokens, the same 1/dp as the dense weights.

Neither strategy knows about the other: data parallelism's bucketed all-reduce and expert
parallelism's all-to-all each see only their own process group. :func:`run_expert_data`
compares every parameter after a few SGD steps with one process training the whole layer
on the whole batch, capacity counted per rank (``groups=dp``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from parlab.checks import check_count
from parlab.comm import Mesh, TrafficLog
from parlab.data_parallel import all_reduce_buckets
from parlab.expert_parallel import apply_expert_parallel, global_parameter_names, local_experts
from parlab.launch import run
from parlab.models import expert_parameters, MoE, MoEConfig, max_difference

__all__ = ["ExpertDataRun", "run_expert_data", "expert_data_rank", "MoEBlock"]


class MoEBlock(nn.Module):
    """A dense linear layer, then an MoE layer with a residual connection: dense weights and
    experts side by side, the smallest model that needs both kinds of gradient sync."""

    def __init__(self, config: MoEConfig, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.moe = MoE(config, seed=None)

    def forward(self, x: torch.Tensor, groups: int = 1) -> torch.Tensor:
        h = self.proj(x)
        return h + self.moe(h, groups=groups)


def _problem(config, dp, tokens, steps, seed):
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(steps, dp * tokens, config.d_model, generator=g)
    return x, torch.randn(steps, dp * tokens, config.d_model, generator=g)


def _sgd(model, lr):
    """Plain SGD, written out: ``torch.optim`` would import ``torch._dynamo`` into the
    notebook's kernel on first use (seconds) for the same three lines."""
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= lr * p.grad


def _step(model, x, y, groups=1):
    model.zero_grad(set_to_none=True)
    loss = ((model(x, groups=groups) - y) ** 2).mean()
    loss.backward()
    return loss


def expert_data_rank(config: MoEConfig, dp: int, ep: int, tokens: int = 8, steps: int = 3,
                     lr: float = 0.1, seed: int = 0) -> dict:
    """``steps`` SGD steps on this rank of a ``dp``-rank job whose experts split over ``ep``.

    Returns this rank's parameters after training, under their global names.
    """
    groups = Mesh(dp=dp).build_expert_groups(ep)
    rank = dist.get_rank()
    model = apply_expert_parallel(MoEBlock(config, seed), groups["expert"])
    x, y = _problem(config, dp, tokens, steps, seed)
    mine = slice(rank * tokens, (rank + 1) * tokens)
    routed = expert_parameters(model)
    dense = [p for p in model.parameters() if id(p) not in routed]
    experts = [p for p in model.parameters() if id(p) in routed]
    for step in range(steps):
        _step(model, x[step, mine], y[step, mine])
        all_reduce_buckets([p.grad for p in dense])                     # over every rank
        all_reduce_buckets([p.grad for p in experts], average=False,
                           group=groups["expert_data"])                  # over the holders
        for p in experts:
            p.grad /= dp                                                 # the dense weights' 1/dp
        _sgd(model, lr)
    names = global_parameter_names(model, groups["expert"])
    return {names[name]: p.detach().clone() for name, p in model.named_parameters()}


@dataclass
class ExpertDataRun:
    """What :func:`run_expert_data` saw: each rank's parameters, the single-process ones, the
    largest difference, the assignments the reference dropped over all steps, and the toy log
    (empty on gloo)."""

    dp: int
    ep: int
    ranks: list
    reference: dict
    max_error: float
    dropped: int
    traffic: TrafficLog


def run_expert_data(config: MoEConfig | None = None, dp: int = 4, ep: int = 2, tokens: int = 8,
                    steps: int = 3, lr: float = 0.1, backend: str = "toy",
                    seed: int = 0) -> ExpertDataRun:
    """Train :class:`MoEBlock` on ``dp`` ranks with experts split over ``ep`` and compare every
    parameter each rank holds with one process on the whole batch."""
    config = config or MoEConfig(8, 16, 4, top_k=2, capacity_factor=1.0, shared_experts=1)
    for name, value in (("dp", dp), ("tokens", tokens), ("steps", steps)):
        check_count(name, value)
    Mesh(dp=dp).expert_ranks(ep)  # a bad ep fails here, not in every rank
    local_experts(config.n_experts, ep, 0)
    record = run(expert_data_rank, dp, config, dp, ep, tokens, steps, lr, seed, backend=backend)
    model = MoEBlock(config, seed)
    x, y = _problem(config, dp, tokens, steps, seed)
    dropped = 0
    for step in range(steps):
        _step(model, x[step], y[step], groups=dp)
        _sgd(model, lr)
        dropped += model.moe.last.dropped
    reference = {n: p.detach().clone() for n, p in model.named_parameters()}
    error = max(max_difference(rank, {n: reference[n] for n in rank}) for rank in record)
    return ExpertDataRun(dp, ep, list(record), reference, error, dropped,
                         record.traffic if backend == "toy" else TrafficLog([]))
