"""Chapter 08's experiments: one sequence split over real ranks three ways (ring, all-gather,
Ulysses), each checked against attention over the whole sequence, with its bytes per pass
from the toy log beside the closed forms; and the causal work each layout gives a rank.

The example: a batch of 1 sequence of 16 tokens, 4 heads of width 4, float64, on 4 ranks,
causal, zigzag layout. One launch runs every method, each on a process group named after it
(so that its messages stand apart in the log), twice: forward only under ``no_grad`` (the
forward bytes), then forward and backward (the backward bytes are the difference).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from parlab.checks import check_choice, check_count
from parlab.context_parallel import (
    all_gather_attention, all_gather_bytes, causal_pairs, LAYOUTS, ring_attention, ring_bytes,
    shard, ulysses_attention, ulysses_bytes, unshard
)
from parlab.launch import run

__all__ = ["CONTEXT_METHODS", "CONTEXT_SHAPE", "CONTEXT_RANKS", "context_inputs", "MethodRun",
           "compare_methods", "causal_work"]

CONTEXT_METHODS = {"ring": ring_attention, "all-gather": all_gather_attention,
           "ulysses": ulysses_attention}
#: (batch, heads, tokens, d_head) of the chapter's example, and its number of ranks.
CONTEXT_SHAPE, CONTEXT_RANKS = (1, 4, 16, 4), 4


def context_inputs(shape=CONTEXT_SHAPE, kv_heads: int | None = None, seed: int = 0):
    """Whole-sequence q, k, v (float64) and the weights w of the loss (out * w).sum()."""
    g = torch.Generator().manual_seed(seed)
    b, h, s, d = shape
    kv = h if kv_heads is None else kv_heads
    q = torch.randn(b, h, s, d, generator=g, dtype=torch.float64)
    k, v = (torch.randn(b, kv, s, d, generator=g, dtype=torch.float64) for _ in range(2))
    return q, k, v, torch.randn(b, h, s, d, generator=g, dtype=torch.float64)


@dataclass
class MethodRun:
    """One method on ``world`` ranks: its largest difference from one process (output and
    each gradient), and each rank's bytes sent per pass, measured and in closed form."""

    method: str
    world: int
    errors: dict
    sent: dict
    closed_form: dict

    def row(self) -> dict:
        return {"method": self.method,
                "max |difference| from one process": max(self.errors.values()),
                "forward bytes per rank": sorted(set(self.sent["forward"])),
                "backward bytes per rank": sorted(set(self.sent["backward"])),
                "closed form (forward, backward)": (self.closed_form["forward"],
                                                    self.closed_form["backward"])}


def _methods_rank(methods, shape, kv_heads, causal, layout):
    groups = {(m, part): dist.new_group(group_desc=f"{m} {part}")
              for m in methods for part in ("forward", "both")}
    r, n = dist.get_rank(), dist.get_world_size()
    q, k, v, w = context_inputs(shape, kv_heads)
    results = {}
    for m in methods:
        local = [shard(t, r, n, layout) for t in (q, k, v)]
        with torch.no_grad():
            CONTEXT_METHODS[m](*local, causal=causal, layout=layout, group=groups[m, "forward"])
        local = [t.requires_grad_() for t in local]
        out = CONTEXT_METHODS[m](*local, causal=causal, layout=layout, group=groups[m, "both"])
        (out * shard(w, r, n, layout)).sum().backward()
        results[m] = (out.detach(), *(t.grad for t in local))
    return results


def compare_methods(methods=tuple(CONTEXT_METHODS), shape=CONTEXT_SHAPE,
                    kv_heads: int | None = None,
                    world: int = CONTEXT_RANKS, causal: bool = True, layout: str = "zigzag",
                    backend: str = "toy") -> list[MethodRun]:
    """Run each method on ``world`` ranks in one launch; compare with one process."""
    for m in methods:
        check_choice("method", m, tuple(CONTEXT_METHODS))
    check_choice("layout", layout, LAYOUTS)
    check_count("world", world)
    ranks = run(_methods_rank, world, tuple(methods), shape, kv_heads, causal, layout,
                backend=backend)
    q, k, v, w = context_inputs(shape, kv_heads)
    qkv = [t.clone().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*qkv, is_causal=causal,
                                         enable_gqa=kv_heads not in (None, shape[1]))
    (out * w).sum().backward()
    want = {"output": out.detach(), "dQ": qkv[0].grad, "dK": qkv[1].grad, "dV": qkv[2].grad}
    element = torch.finfo(q.dtype).bits // 8
    b, h, s, d = shape
    q_bytes = b * h * (s // world) * d * element
    kv_bytes = b * (kv_heads or h) * (s // world) * d * element
    closed = {"ring": ring_bytes(kv_bytes, world), "all-gather": all_gather_bytes(kv_bytes, world),
              "ulysses": ulysses_bytes(q_bytes, world, kv_bytes)}
    log = getattr(ranks, "traffic", None)
    runs = []
    for m in methods:
        got = [unshard([rank[m][i] for rank in ranks], layout) for i in range(4)]
        errors = {name: (a - ref).abs().max().item() for (name, ref), a in zip(want.items(), got)}
        sent = {"forward": [None] * world, "backward": [None] * world}
        if log is not None:
            for r in range(world):
                forward = sum(t.nbytes for t in log.filter(group=f"{m} forward", src=r).records)
                both = sum(t.nbytes for t in log.filter(group=f"{m} both", src=r).records)
                sent["forward"][r], sent["backward"][r] = forward, both - forward
        runs.append(MethodRun(m, world, errors, sent, closed[m]))
    return runs


def _ring_flops_rank(shape, layout):
    r, n = dist.get_rank(), dist.get_world_size()
    q, k, v, _ = context_inputs(shape)
    local = [shard(t, r, n, layout) for t in (q, k, v)]
    with FlopCounterMode(display=False) as counter:
        ring_attention(*local, causal=True, layout=layout)
    return counter.get_total_flops()


def causal_work(world: int = CONTEXT_RANKS, shape=CONTEXT_SHAPE, backend: str = "gloo") -> dict:
    """Per layout, per rank: the unmasked (query, key) pairs of causal attention, and the
    FLOPs ring attention computes there (PyTorch's FlopCounterMode, forward), one launch
    per layout."""
    seq = shape[2]
    return {layout: {"unmasked pairs": causal_pairs(seq, world, layout),
                     "ring FLOPs": list(run(_ring_flops_rank, world, shape, layout,
                                            backend=backend))}
            for layout in LAYOUTS}
