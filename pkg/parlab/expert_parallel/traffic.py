"""The bytes of expert parallelism: exact from a routing, and in closed form.

One MoE layer's forward pass moves each kept assignment (token t, its j-th expert e) to the
rank holding e and its output back: two all-to-alls of ``d_model`` values per assignment
that leaves its rank. With ``k`` experts per token, ``T`` tokens per rank, ``n`` ranks and
an even load, a rank sends ``k T d b (n-1)/n`` bytes in each (``b`` bytes per value): an
all-to-all of a ``k T d b`` buffer (:func:`parlab.comm.ring_wire_bytes`, divided by n).

The naive dispatch sends a token once per chosen expert, even when two of them live on the
same rank. Sending it once per destination rank instead (and letting that rank copy it to
its experts) saves the difference, which :func:`routed_bytes` counts both ways; DeepSeek-V3
goes further and routes each token to at most a few nodes.

Tensor-parallel experts (every expert's matrices split over ``n`` ranks, Megatron's MLP)
move no tokens but all-reduce the layer's output, ``T d b`` per rank and layer:
:func:`tensor_parallel_expert_bytes`.
"""

from __future__ import annotations

import torch

from parlab.checks import check_count
from parlab.comm import ring_wire_bytes

__all__ = ["dispatch_bytes", "routed_bytes", "tensor_parallel_expert_bytes"]


def dispatch_bytes(tokens: int, top_k: int, d_model: int, n: int, element_bytes: int = 4) -> float:
    """Bytes one rank sends in one dispatch (and as many in the combine), load even."""
    for name, value in (("tokens", tokens), ("top_k", top_k), ("d_model", d_model),
                        ("n", n), ("element_bytes", element_bytes)):
        check_count(name, value)
    return ring_wire_bytes("all_to_all", top_k * tokens * d_model * element_bytes, n) / n


def routed_bytes(experts: torch.Tensor, kept: torch.Tensor, n_experts: int, n: int,
                 d_model: int, element_bytes: int = 4, once_per_rank: bool = False) -> list[int]:
    """Bytes this rank sends to each of the ``n`` ranks in one dispatch, from its routing.

    ``experts``/``kept``: T x k, as :class:`parlab.models.RoutingStats` holds them; expert e
    lives on rank ``e // (n_experts / n)``. The entry for this rank itself is what stays home.
    ``once_per_rank``: a token chosen by two experts of one rank is counted once.
    """
    owner = experts // (n_experts // n)
    if once_per_rank:
        rows = [torch.unique(torch.nonzero(kept & (owner == r))[:, 0]).numel() for r in range(n)]
    else:
        rows = [int((kept & (owner == r)).sum()) for r in range(n)]
    return [r * d_model * element_bytes for r in rows]


def tensor_parallel_expert_bytes(tokens: int, d_model: int, n: int,
                                 element_bytes: int = 4) -> float:
    """Bytes one rank sends per layer when the experts are split Megatron's way over ``n``
    ranks instead: one ring all-reduce of the layer's ``T x d`` output."""
    return ring_wire_bytes("all_reduce", tokens * d_model * element_bytes, n) / n
