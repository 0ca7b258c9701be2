"""Chapter 07's experiments: one MoE layer routed token by token, run split over real ranks,
its all-to-all bytes logged, and the capacity trade-off; and the chapter's figure recipes.

The example: 4 experts (SwiGLU, d_model 8, hidden 16), top-2 routing, 8 tokens on each of 4
ranks, capacity factor 1.0. ``skewed=True`` leans the router towards expert 0 and away from
expert 3 (positive inputs, one router row raised and one lowered), the case where capacity
drops tokens and one rank receives nothing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist

from parlab.checks import check_count
from parlab.expert_parallel import (
    apply_expert_parallel, dispatch_bytes, global_parameter_names, local_experts, routed_bytes
)
from parlab.launch import run
from parlab.models import (
    MoE, MoEConfig, assign_slots, assignment_counts, expert_capacity, load_balancing_loss,
    load_ratio, update_router_bias
)
from parlab.viz import figure
from parlab.viz.plots import balance_figure, capacity_figure, dispatch_matrix_figure

__all__ = ["EXAMPLE", "RANKS", "TOKENS", "example_layer", "example_tokens", "routing_table",
           "capacity_sweep", "ExpertRun", "run_expert_layer", "balancing_runs"]

EXAMPLE = MoEConfig(d_model=8, d_ff=16, n_experts=4, top_k=2, capacity_factor=1.0)
RANKS, TOKENS = 4, 8


def example_tokens(ranks: int = RANKS, tokens: int = TOKENS, skewed: bool = False,
                   seed: int = 1, d_model: int = EXAMPLE.d_model):
    """(x, w): ``ranks x tokens`` token vectors, and the weights of a sum loss (out * w).sum()."""
    g = torch.Generator().manual_seed(seed)
    shape = (ranks * tokens, d_model)
    x = torch.rand(shape, generator=g) if skewed else torch.randn(shape, generator=g)
    return x, torch.randn(shape, generator=g)


def example_layer(config: MoEConfig = EXAMPLE, skewed: bool = False) -> MoE:
    """The chapter's layer (seed 0); ``skewed`` raises expert 0's router row and sinks the last."""
    moe = MoE(config, seed=0)
    if skewed:
        with torch.no_grad():
            moe.router.gate.weight[0] += 1.0
            moe.router.gate.weight[-1] = -10.0
    return moe


def routing_table(config: MoEConfig = EXAMPLE, tokens: int = TOKENS, skewed: bool = False):
    """One rank's tokens, one row each: every choice's expert, gate and whether it was kept."""
    import pandas as pd

    moe = example_layer(config, skewed)
    x, _ = example_tokens(1, tokens, skewed, d_model=config.d_model)
    with torch.no_grad():
        moe(x)
    stats = moe.last
    rows = []
    for t in range(tokens):
        row = {"token": t}
        for j in range(config.top_k):
            row[f"choice {j + 1}"] = int(stats.routing.experts[t, j])
            row[f"gate {j + 1}"] = round(float(stats.routing.gates[t, j]), 3)
            row[f"kept {j + 1}"] = bool(stats.kept[t, j])
        rows.append(row)
    return pd.DataFrame(rows)


def capacity_sweep(factors=(0.5, 0.75, 1.0, 1.25, 1.5, 2.0), config: MoEConfig = EXAMPLE,
                   ranks: int = RANKS, tokens: int = TOKENS, skewed: bool = False):
    """Per capacity factor: the capacity, the share of assignments dropped, and the share of
    the fixed-capacity buffers' rows that would travel empty (padding), over all ranks."""
    import pandas as pd

    moe = example_layer(config.replace(capacity_factor=None), skewed)
    x, _ = example_tokens(ranks, tokens, skewed, d_model=config.d_model)
    with torch.no_grad():
        choices = moe.router(x).experts.split(tokens)
    rows = []
    for factor in factors:
        capacity = expert_capacity(tokens, config.n_experts, config.top_k, factor)
        kept = sum(int(assign_slots(c, config.n_experts, capacity)[1].sum()) for c in choices)
        assignments = ranks * tokens * config.top_k
        slots = ranks * config.n_experts * capacity
        rows.append({"capacity factor": factor, "capacity": capacity,
                     "dropped": round(1 - kept / assignments, 4),
                     "padding": round(1 - kept / slots, 4)})
    return pd.DataFrame(rows)


@dataclass
class ExpertRun:
    """One forward and backward pass of the example layer split over ``ranks`` ranks.

    ``max_error``: the largest difference from one process (outputs, input gradients and
    every parameter gradient); ``matrix[s][d]``: dispatch bytes rank s sent rank d (from the
    toy log); ``routed``: the same from the ranks' routing (:func:`routed_bytes`);
    ``closed_form``: :func:`dispatch_bytes` for an even load; ``load``: kept assignments per
    expert over all ranks; ``dropped``: assignments dropped; ``sent``: per pass
    ("forward", "backward"), the bytes each rank sent in all of that pass's all-to-alls (the
    forward's counts, dispatch and combine; the backward's two, reversed), from the toy log.
    """

    ranks: int
    skewed: bool
    max_error: float
    matrix: list
    routed: list
    closed_form: float
    load: list
    dropped: int
    sent: dict


def _layer_rank(config, skewed, tokens, layout):
    n, r = dist.get_world_size(), dist.get_rank()
    x, w = example_tokens(n, tokens, skewed, d_model=config.d_model)
    mine = slice(r * tokens, (r + 1) * tokens)
    x = x[mine].clone().requires_grad_()
    moe = apply_expert_parallel(example_layer(config, skewed), layout=layout)
    out = moe(x)
    (out * w[mine]).sum().backward()
    names = global_parameter_names(moe)
    grads = {names[name]: p.grad for name, p in moe.named_parameters()}
    stats = moe.last
    return {"out": out.detach(), "x.grad": x.grad, "grads": grads,
            "routed": routed_bytes(stats.routing.experts, stats.kept, config.n_experts, n,
                                   config.d_model),
            "load": stats.load, "dropped": stats.dropped}


def run_expert_layer(config: MoEConfig = EXAMPLE, ranks: int = RANKS, skewed: bool = False,
                     tokens: int = TOKENS, layout: str = "uneven") -> ExpertRun:
    """Run the layer over ``ranks`` logged ranks (toy backend) and check it against one process."""
    check_count("ranks", ranks)
    check_count("tokens", tokens)
    local_experts(config.n_experts, ranks, 0)  # experts must split over the ranks
    record = run(_layer_rank, ranks, config, skewed, tokens, layout, backend="toy")
    moe = example_layer(config, skewed)
    x, w = example_tokens(ranks, tokens, skewed, d_model=config.d_model)
    x.requires_grad_()
    out = moe(x, groups=ranks)
    (out * w).sum().backward()
    error = max((torch.cat([r["out"] for r in record]) - out.detach()).abs().max().item(),
                (torch.cat([r["x.grad"] for r in record]) - x.grad).abs().max().item())
    for name, p in moe.named_parameters():
        held = [r["grads"][name] for r in record if name in r["grads"]]
        total = held[0] if name.startswith("experts.") else sum(held)  # replicated: summed
        want = torch.zeros_like(p) if p.grad is None else p.grad  # an expert no token chose
        error = max(error, (total - want).abs().max().item())
    log = record.traffic.filter(op="all_to_all")
    calls = sorted({t.call for t in log.records})
    forward = 3 if layout == "uneven" else 2  # (uneven: the counts go first)
    matrix = log.filter(call=calls[forward - 2]).matrix(n=ranks).tolist()
    sent = {"forward": [0] * ranks, "backward": [0] * ranks}
    for t in log.records:
        sent["forward" if t.call in calls[:forward] else "backward"][t.src] += t.nbytes
    return ExpertRun(ranks, skewed, error, matrix, [r["routed"] for r in record],
                     dispatch_bytes(tokens, config.top_k, config.d_model, ranks),
                     sum(r["load"] for r in record).tolist(),
                     sum(r["dropped"] for r in record), sent)


def balancing_runs(steps: int = 30, tokens: int = 64, alpha: float = 1.0, gamma: float = 0.01,
                   lr: float = 0.1, lean: float = 0.4):
    """max/mean load per step on a router that leans towards expert 0 (its row raised by
    ``lean``, positive inputs): left alone, trained with the Switch auxiliary loss (``alpha``),
    and steered by DeepSeek-V3's bias rule (``gamma``), each from the same start.

    Every run trains on the same task (mean squared error to fixed targets, SGD ``lr``);
    the load is the choices per expert before any dropping.
    """
    import pandas as pd

    check_count("steps", steps)
    g = torch.Generator().manual_seed(5)
    x = torch.rand(tokens, EXAMPLE.d_model, generator=g)
    target = torch.randn(tokens, EXAMPLE.d_model, generator=g)
    ratios = {}
    for name, router in (("no balancing", "topk"), ("auxiliary loss", "topk"),
                         ("bias update", "deepseek")):
        moe = MoE(EXAMPLE.replace(capacity_factor=None, router=router), seed=0)
        with torch.no_grad():
            moe.router.gate.weight[0] += lean
        ratios[name] = []
        for _ in range(steps):
            moe.zero_grad(set_to_none=True)
            loss = ((moe(x) - target) ** 2).mean()
            counts = assignment_counts(moe.last.routing.experts, EXAMPLE.n_experts)
            ratios[name].append(round(load_ratio(counts), 3))
            if name == "auxiliary loss":
                loss = loss + load_balancing_loss(moe.last.routing, EXAMPLE.n_experts,
                                                  alpha).loss
            loss.backward()
            with torch.no_grad():  # plain SGD (torch.optim would import torch._dynamo here)
                for p in moe.parameters():
                    if p.grad is not None:
                        p -= lr * p.grad
            if name == "bias update":
                update_router_bias(moe, gamma)
    return pd.DataFrame({"step": range(steps), **ratios})


# --------------------------------------------------------------------------- figure recipes


@functools.cache
def _runs():
    return run_expert_layer(skewed=False), run_expert_layer(skewed=True)


@figure("fig-07-dispatch-matrix", "Bytes each rank sends each rank in one dispatch, "
                                  "even and skewed router (toy backend)")
def _matrix():
    return dispatch_matrix_figure(*_runs())


@figure("fig-07-capacity", "Capacity factor: assignments dropped against buffer rows padded")
def _capacity():
    return capacity_figure(capacity_sweep(), capacity_sweep(skewed=True))


@figure("fig-07-balance", "Load balance over training: none, Switch auxiliary loss, "
                          "DeepSeek-V3 bias update")
def _balance():
    return balance_figure(balancing_runs())
