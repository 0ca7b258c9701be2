"""Keeping the experts evenly loaded: the Switch auxiliary loss and DeepSeek-V3's bias rule.

A router left alone tends to collapse: the experts it favours early get more tokens, train
faster, and are favoured more. Two remedies, each a few lines below:

- **An auxiliary loss** (Switch Transformer, Fedus et al. 2021, eq. 4), added to the task
  loss: ``L_aux = alpha N sum_i f_i P_i`` over the N experts, with ``f_i`` the share of the
  token-choice assignments that went to expert i (counted before capacity drops anything)
  and ``P_i`` the router's mean probability for expert i. ``f`` comes from an arg-max and has
  no gradient; ``P`` does, and the gradient lowers the probability of the experts that ``f``
  says are busy. Evenly spread (``f_i = P_i = 1/N``), ``L_aux = alpha``, its least value.
- **No loss at all** (DeepSeek-V3 report, section 2.1.2): the DeepSeek router chooses by
  ``score + b`` (see :mod:`parlab.models.moe`); after each step, raise ``b_i`` by ``gamma``
  for an expert that got fewer assignments than the mean and lower it for one that got more.
  The gates use the unbiased scores, so the model's output is steered, never rescaled.

Both read statistics of the *whole* batch. Under data or expert parallelism each rank routes
only its own tokens, so both functions take ``group``: the ranks whose counts are added up.
The convention here: ``group=None`` means no communication (this process's tokens are the
whole batch: a single process, or per-rank statistics on purpose); pass
``torch.distributed.group.WORLD`` for every rank, or any process group for those ranks. (The
strategies' ``group=None`` means every rank; here the default must work without
``torch.distributed`` started.)
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import torch
import torch.distributed as dist

from parlab.checks import check_positive_number
from parlab.models.moe import MoE, Routing

__all__ = ["BalancingLoss", "load_balancing_loss", "assignment_counts", "BiasUpdate",
           "update_router_bias", "load_ratio"]


class BalancingLoss(NamedTuple):
    """What :func:`load_balancing_loss` computed. ``loss``: this rank's share of ``L_aux``
    (a scalar with a gradient; the shares of the ranks of ``group`` add up to ``L_aux``).
    ``f`` and ``P`` (each one value per expert, no gradient) and ``tokens`` are global over
    ``group``: every rank holds the same ones."""

    loss: torch.Tensor
    f: torch.Tensor
    P: torch.Tensor
    tokens: int


class BiasUpdate(NamedTuple):
    """What :func:`update_router_bias` did: ``load`` (assignments per expert, added up over
    ``group``) and ``change`` (what was added to the bias: ``+gamma``, ``-gamma`` or 0)."""

    load: torch.Tensor
    change: torch.Tensor


def assignment_counts(experts: torch.Tensor, n_experts: int) -> torch.Tensor:
    """How many (token, choice) pairs of ``experts`` (T x k) chose each expert: an integer
    vector of ``n_experts`` adding up to ``T k``. Counted before capacity drops anything,
    unlike :attr:`RoutingStats.load`, which counts what was kept."""
    return torch.bincount(experts.reshape(-1), minlength=n_experts)


def load_ratio(load: torch.Tensor) -> float:
    """``max_i load_i / mean_i load_i``: 1 when evenly loaded; at most N / k with top-k of N
    experts (one expert in every token's choices), N when one expert takes all the load."""
    load = load.double()
    return (load.max() / load.mean()).item()


def _sum_over(t: torch.Tensor, group) -> torch.Tensor:
    """``t`` added up over the ranks of ``group`` (a new tensor, no gradient); ``group=None``:
    ``t`` itself, nothing sent."""
    if group is None:
        return t
    t = t.detach().clone()
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return t


def _check_routing(routing: Routing, n_experts: int) -> None:
    if not isinstance(routing, Routing):
        raise ValueError(f"routing must be a Routing (route() or MoE.last.routing gives one), "
                         f"got {type(routing).__name__}")
    if routing.probs.dim() != 2 or routing.probs.shape[1] != n_experts:
        raise ValueError(f"n_experts={n_experts} does not match the routing's probabilities "
                         f"of shape {tuple(routing.probs.shape)} (tokens x experts)")


def load_balancing_loss(routing: Routing, n_experts: int, alpha: float = 0.01,
                        group=None) -> BalancingLoss:
    """The Switch Transformer's auxiliary loss, ``alpha N sum_i f_i P_i``, with its statistics
    global over the ranks of ``group`` (None: this process alone; see the module's notes).

    With ``T`` tokens in all (over the ranks), each making ``k`` choices::

        c_i = #{(t, j) : experts[t, j] = i}       assignments to expert i, before dropping
        f_i = c_i / (T k)                          (no gradient: an arg-max count)
        S_i^r = sum over rank r's tokens t of probs[t, i]
        P_i = (sum_r S_i^r) / T

    Rank r returns ``L_r = alpha N sum_i f_i S_i^r / T``, with the global ``f`` and ``T``
    (one all-reduce of the counts, the token count and the probability sums) but only its
    own ``S^r``. Since ``P_i = sum_r S_i^r / T``, the shares add up to the loss on all
    tokens, ``sum_r L_r = alpha N sum_i f_i P_i = L``, and since ``L`` depends on rank r's
    probabilities only through ``S^r``, ``sum_r dL_r/dW = dL/dW``: adding up the router's
    gradients over the ranks (as the replicated router's gradients are) gives exactly the
    one-process gradient. (A data-parallel wrapper that averages gradients instead divides
    this by the number of ranks: multiply ``loss`` by it there.)
    """
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not alpha >= 0:
        raise ValueError(f"alpha must be a non-negative number (the weight of the auxiliary "
                         f"loss; Switch uses 0.01, 0 turns it off), got {alpha!r}")
    _check_routing(routing, n_experts)
    probs, k = routing.probs, routing.experts.shape[1]
    mine = probs.sum(0)                                     # S^r, with its gradient
    local = torch.cat([assignment_counts(routing.experts, n_experts).double(),
                       torch.tensor([float(probs.shape[0])], dtype=torch.float64),
                       mine.detach().double()])
    total = _sum_over(local, group)                         # [c (N), T (1), sum_r S^r (N)]
    tokens = int(total[n_experts].item())
    if tokens == 0:
        raise ValueError("load_balancing_loss got no tokens on any rank of the group")
    f = (total[:n_experts] / (tokens * k)).to(probs.dtype)
    P = (total[n_experts + 1:] / tokens).to(probs.dtype)
    loss = alpha * n_experts * (f * mine).sum() / tokens
    return BalancingLoss(loss, f, P, tokens)


def update_router_bias(moe: MoE, gamma: float = 1e-3, group=None) -> BiasUpdate:
    """DeepSeek-V3's auxiliary-loss-free balancing: one update of ``moe``'s router bias from
    the routing of its last forward pass (``moe.last.routing.experts``).

    With ``load_i`` the assignments that chose expert i (before dropping), added up over the
    ranks of ``group`` (None: this process alone) so every rank applies the same update::

        b_i <- b_i + gamma sign(mean(load) - load_i)

    An underloaded expert's bias rises, an overloaded one's falls, one exactly at the mean
    keeps its bias. (The sign is taken of ``sum(load) - N load_i``, in integers, so "exactly
    at the mean" is exact.) Takes the MoE layer, not its router: the router keeps no record
    of what it chose. Call it after each step; returns a :class:`BiasUpdate`.
    """
    gamma = check_positive_number("gamma", gamma, "the bias update speed; DeepSeek-V3 uses "
                                  "0.001")
    if not math.isfinite(gamma):
        raise ValueError(f"gamma must be finite, got {gamma!r}")
    if not isinstance(moe, MoE):
        raise ValueError(f"update_router_bias takes the MoE layer (it reads the last routing "
                         f"from MoE.last), got {type(moe).__name__}")
    if moe.router.bias is None:
        raise ValueError(f"update_router_bias needs a router with a bias, but router="
                         f"{moe.router.kind!r} has none (it chooses by its scores alone); "
                         f"only router='deepseek' has a bias to update")
    if moe.last is None:
        raise ValueError("update_router_bias reads the last routing: run a forward pass first")
    n = moe.config.n_experts
    load = _sum_over(assignment_counts(moe.last.routing.experts, n), group)
    bias = moe.router.bias
    change = torch.sign(load.sum() - n * load).to(bias.dtype) * gamma
    with torch.no_grad():
        bias += change
    return BiasUpdate(load, change)
