"""A mixture-of-experts feed-forward layer, written out: router, top-k gates, capacity, experts.

Why this module exists: most large models trained since 2024 (Mixtral, DeepSeek-V3, Qwen3-MoE)
replace the feed-forward layer of each block by ``n_experts`` feed-forward layers of which
each token uses only ``top_k``. Three steps, each one a few lines below:

1. **Route.** A linear map scores every expert for every token, ``logits = x W_r`` (T x E).
   The three routers a reader meets differ in how scores become choices and weights:

   ==============  ==========================  ===========================================
   ``router``      choose                      gate (the weight of a chosen expert)
   ==============  ==========================  ===========================================
   ``"switch"``    top-1 of softmax(logits)    its probability, not renormalized (Switch)
   ``"topk"``      top-k of softmax(logits)    probabilities renormalized over the k chosen
                                               (GShard, Mixtral, Qwen3-MoE)
   ``"deepseek"``  top-k of sigmoid(logits)+b  sigmoid affinities normalized over the chosen;
                                               the bias ``b`` steers the choice only (DeepSeek-V3)
   ==============  ==========================  ===========================================

2. **Keep what fits.** An expert takes at most ``capacity = ceil(top_k x T x factor / E)``
   assignments of the T tokens it is counted over (each rank's own tokens, as GShard counts
   per group). When an expert is full, first choices are served before second choices,
   then in token order; the rest are dropped (the residual connection around the layer
   still carries those tokens). ``capacity_factor=None`` keeps everything.

3. **Compute and combine.** Each kept assignment (token t, its j-th choice e) gives
   ``y[t, j] = expert_e(x_t)`` (a SwiGLU MLP); the layer returns ``sum_j gate[t, j] y[t, j]``,
   plus a shared expert that every token passes through, if asked (DeepSeek).

Where step 3 runs is a :class:`Dispatcher`'s business: :class:`LocalExperts` runs every expert
in this process; expert parallelism (:mod:`parlab.expert_parallel`) swaps in one that sends
each assignment to the rank that holds its expert with an all-to-all and brings the outputs
back with another. Routing, capacity and the combine stay here, so "equal to one process" is
one layer run two ways.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from parlab.checks import check_choice, check_count, check_positive_number
from parlab.models.ffn import SwiGLU

__all__ = ["ROUTERS", "MoEConfig", "Routing", "route", "expert_capacity", "assign_slots",
           "Router", "LocalExperts", "MoE", "RoutingStats", "even_rows", "expert_parameters"]

ROUTERS = ("switch", "topk", "deepseek")


@dataclass(frozen=True)
class MoEConfig:
    """The shape of one MoE layer. ``d_ff`` is each expert's hidden width; ``shared_experts``
    adds that many experts' width of an always-used SwiGLU (DeepSeek's shared expert)."""

    d_model: int
    d_ff: int
    n_experts: int
    top_k: int = 2
    router: str = "topk"
    capacity_factor: float | None = None
    shared_experts: int = 0

    def __post_init__(self):
        for name in ("d_model", "d_ff", "n_experts", "top_k"):
            check_count(name, getattr(self, name))
        check_choice("router", self.router, ROUTERS)
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k={self.top_k} is larger than n_experts={self.n_experts}: "
                             f"a token can choose at most every expert once")
        if self.router == "switch" and self.top_k != 1:
            raise ValueError(f"the Switch router chooses one expert (top_k=1), got "
                             f"top_k={self.top_k}; use router='topk' for more")
        if self.capacity_factor is not None:
            check_positive_number("capacity_factor", self.capacity_factor,
                                  "None keeps every token")
        if isinstance(self.shared_experts, bool) or not isinstance(self.shared_experts, int) \
                or self.shared_experts < 0:
            raise ValueError(f"shared_experts must be a non-negative integer, got "
                             f"{self.shared_experts!r}")

    def replace(self, **changes) -> "MoEConfig":
        return replace(self, **changes)


class Routing(NamedTuple):
    """One batch's routing: ``experts`` (T x k, first choice first), ``gates`` (T x k, the
    weight of each choice's output) and ``probs`` (T x E, each expert's share of the token
    in the router's eyes: what load-balancing statistics average)."""

    experts: torch.Tensor
    gates: torch.Tensor
    probs: torch.Tensor


def route(logits: torch.Tensor, top_k: int, router: str = "topk",
          bias: torch.Tensor | None = None) -> Routing:
    """Choices and gates from router ``logits`` (T x E), by the rules of ``router`` (see above)."""
    check_choice("router", router, ROUTERS)
    if logits.dim() != 2:
        raise ValueError(f"router logits must be 2-D (tokens x experts), got shape "
                         f"{tuple(logits.shape)}")
    if not 1 <= top_k <= logits.shape[1]:
        raise ValueError(f"top_k={top_k} must be from 1 to the number of experts "
                         f"({logits.shape[1]})")
    if router == "deepseek":
        scores = logits.sigmoid()
        steer = scores if bias is None else scores + bias.detach()
        experts = steer.topk(top_k, dim=-1).indices
        picked = scores.gather(1, experts)
        return Routing(experts, picked / picked.sum(-1, keepdim=True),
                       scores / scores.sum(-1, keepdim=True))
    probs = logits.softmax(-1)
    picked, experts = probs.topk(top_k, dim=-1)
    gates = picked if router == "switch" else picked / picked.sum(-1, keepdim=True)
    return Routing(experts, gates, probs)


def expert_capacity(tokens: int, n_experts: int, top_k: int, factor: float | None) -> int | None:
    """How many assignments one expert takes from ``tokens`` tokens: ``ceil(k T f / E)``
    (None: no limit)."""
    if factor is None:
        return None
    return math.ceil(top_k * tokens * factor / n_experts)


def assign_slots(experts: torch.Tensor, n_experts: int, capacity: int | None):
    """Each assignment's place in its expert's queue, and whether it fits.

    Queue order: every token's first choice in token order, then every second choice, ...
    Returns ``(slot, kept)``, both T x k: ``slot[t, j]`` counts the assignments to the same
    expert ahead of (t, j); ``kept`` is ``slot < capacity`` (all True without a capacity).
    """
    tokens, k = experts.shape
    order = experts.t().reshape(-1)                      # choice-major: j * T + t
    ahead = F.one_hot(order, n_experts).cumsum(0) - 1    # per expert, a running count
    slot = ahead.gather(1, order[:, None]).view(k, tokens).t()
    kept = torch.ones_like(slot, dtype=torch.bool) if capacity is None else slot < capacity
    return slot, kept


class Router(nn.Module):
    """``logits = x W_r`` (no bias), then :func:`route`. The DeepSeek router also holds a
    per-expert ``bias`` buffer (not a parameter: it is set by a rule, not by gradients; the
    rule is :func:`parlab.models.moe_balance.update_router_bias`)."""

    def __init__(self, config: MoEConfig):
        super().__init__()
        self.top_k, self.kind = config.top_k, config.router
        self.gate = nn.Linear(config.d_model, config.n_experts, bias=False)
        if config.router == "deepseek":
            self.register_buffer("bias", torch.zeros(config.n_experts))
        else:
            self.bias = None

    def forward(self, x: torch.Tensor) -> Routing:
        return route(self.gate(x), self.top_k, self.kind, self.bias)


class RoutingStats(NamedTuple):
    """What the last forward pass did: its routing, which assignments were kept, the
    capacity per expert, and the kept assignments per expert (the load)."""

    routing: Routing
    kept: torch.Tensor
    capacity: int | None
    load: torch.Tensor

    @property
    def dropped(self) -> int:
        return int((~self.kept).sum())


def _holds_no_values(x: torch.Tensor) -> bool:
    """A fake or meta tensor (a memory estimate's trace): shapes only, no routing to follow."""
    from torch._subclasses.fake_tensor import is_fake
    return x.device.type == "meta" or is_fake(x)


def even_rows(tokens: int, n_experts: int, top_k: int, capacity: int | None) -> int:
    """The rows one expert runs on when the load is even: ``ceil(k T / E)``, at most
    ``capacity``. What a memory estimate assumes, since a trace without values has no routing."""
    rows = -(-top_k * tokens // n_experts)
    return rows if capacity is None else min(rows, capacity)


class LocalExperts:
    """The dispatcher that runs every expert here: ``y[t, j] = experts[e](x_t)`` for kept
    assignments, 0 for dropped ones (T x k x d). A dispatcher holds no weights (the layer
    passes its ``experts``), so the layer's parameter names stay ``experts.<i>.*``.

    On fake or meta tensors (a memory estimate's trace) there is no routing to follow: each
    expert then runs on :func:`even_rows` rows, the shapes of an even load."""

    def __call__(self, experts, x, choices, slot, kept, capacity=None):
        if _holds_no_values(x):
            return self._even(experts, x, choices, capacity)
        flat = choices.reshape(-1)
        use = kept.reshape(-1)
        y = x.new_zeros(flat.numel(), x.shape[-1])
        tokens = torch.arange(x.shape[0], device=x.device).repeat_interleave(choices.shape[1])
        for e, expert in enumerate(experts):
            rows = torch.nonzero((flat == e) & use).squeeze(1)
            if rows.numel():
                y = y.index_copy(0, rows, expert(x[tokens[rows]]))
        return y.view(*choices.shape, -1)

    @staticmethod
    def _even(experts, x, choices, capacity):
        tokens, k = choices.shape
        rows = even_rows(tokens, len(experts), k, capacity)
        take = torch.arange(rows, device=x.device) % tokens
        out = torch.cat([expert(x[take]) for expert in experts])
        place = torch.arange(out.shape[0], device=x.device) % (tokens * k)
        y = x.new_zeros(tokens * k, x.shape[-1]).index_add(0, place, out)
        return y.view(tokens, k, -1)


class MoE(nn.Module):
    """A mixture-of-experts feed-forward layer (input and output ``... x d_model``).

    ``forward(x, groups=1)`` counts capacity over ``groups`` equal runs of the tokens (the
    tokens of each data-parallel rank), so one process reproduces what ``groups`` ranks
    drop. After each call, :attr:`last` holds a :class:`RoutingStats`.
    """

    def __init__(self, config: MoEConfig, seed: int | None = 0):
        super().__init__()
        if seed is not None:
            torch.manual_seed(seed)
        self.config = config
        self.router = Router(config)
        self.experts = nn.ModuleList(SwiGLU(config.d_model, config.d_ff)
                                     for _ in range(config.n_experts))
        self.shared = (SwiGLU(config.d_model, config.d_ff * config.shared_experts)
                       if config.shared_experts else None)
        self.dispatcher = LocalExperts()
        self.last: RoutingStats | None = None

    def forward(self, x: torch.Tensor, groups: int = 1) -> torch.Tensor:
        c, shape = self.config, x.shape
        x = x.reshape(-1, c.d_model)
        if x.shape[0] % check_count("groups", groups):
            raise ValueError(f"{x.shape[0]} tokens do not split into groups={groups} equal runs")
        routing = self.router(x)
        per_group = x.shape[0] // groups
        capacity = expert_capacity(per_group, c.n_experts, c.top_k, c.capacity_factor)
        slots, kept = zip(*(assign_slots(e, c.n_experts, capacity)
                            for e in routing.experts.split(per_group)))
        slot, kept = torch.cat(slots), torch.cat(kept)
        y = self.dispatcher(self.experts, x, routing.experts, slot, kept, capacity)
        out = (routing.gates.unsqueeze(-1) * y).sum(1)
        if self.shared is not None:
            out = out + self.shared(x)
        chosen = F.one_hot(routing.experts, c.n_experts) * kept.unsqueeze(-1)
        load = chosen.sum((0, 1))                    # kept assignments per expert
        if not _holds_no_values(x):  # (a memory estimate's trace leaves nothing behind)
            self.last = RoutingStats(routing, kept, capacity, load)  # (with its graph: the
        return out.view(shape)                                       # auxiliary loss needs it)

    def __deepcopy__(self, memo):
        """A copy without :attr:`last` (its routing is part of a graph, which cannot be
        copied, and belongs to the pass that made it)."""
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            new.__dict__[key] = None if key == "last" else copy.deepcopy(value, memo)
        return new


def expert_parameters(model: nn.Module) -> set[int]:
    """The ids of the parameters of every MoE layer's routed experts in ``model``: what expert
    parallelism divides over ranks (the router and any shared expert stay replicated)."""
    return {id(p) for m in model.modules() if isinstance(m, MoE) for p in m.experts.parameters()}
