"""Chapter 08's experiments: one sequence split over real ranks three ways (ring, all-gather,
Ulysses), each checked against attention over the whole sequence, with its bytes per pass
from the toy log beside the closed forms; and the causal work each layout gives a rank.

The example: a batch of 1 sequence of 16 tokens, 4 heads of width 4, float64, on 4 ranks,
causal, contiguous layout. One launch runs every method, each on a process group named after it
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
    all_gather_bytes, causal_pairs, CP_METHODS, LAYOUTS, ring_attention, ring_bytes,
    ring_schedule, shard, ulysses_bytes, unshard
)
from parlab.launch import run
from parlab.hardware import GPU_MEMORY_GB
from parlab.memory import estimate, forward_saved_bytes
from parlab.models import get_config, GPT, TransformerConfig
from parlab.tensor_parallel import TensorParallelBlock
from parlab.viz import figure
from parlab.viz.plots import causal_work_figure, memory_by_sequence_figure, ring_steps_figure

__all__ = ["CONTEXT_SHAPE", "CONTEXT_RANKS", "context_inputs", "MethodRun",
           "compare_methods", "causal_work", "block_units", "ring_steps", "causal_work_chart",
           "SP_CONFIG", "SequenceParallelRun", "run_sequence_parallel", "MEMORY_LENGTHS",
           "MEMORY_LAYOUTS", "MEMORY_MODELS", "LLAMA_31_8B", "memory_by_sequence",
           "memory_by_sequence_chart"]

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
                "equal to one process (1e-12)": max(self.errors.values()) < 1e-12,
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
            CP_METHODS[m](*local, causal=causal, layout=layout, group=groups[m, "forward"])
        local = [t.requires_grad_() for t in local]
        out = CP_METHODS[m](*local, causal=causal, layout=layout, group=groups[m, "both"])
        (out * shard(w, r, n, layout)).sum().backward()
        results[m] = (out.detach(), *(t.grad for t in local))
    return results


def compare_methods(methods=tuple(CP_METHODS), shape=CONTEXT_SHAPE,
                    kv_heads: int | None = None,
                    world: int = CONTEXT_RANKS, causal: bool = True,
                    layout: str = "contiguous",
                    backend: str = "toy") -> list[MethodRun]:
    """Run each method on ``world`` ranks in one launch; compare with one process."""
    for m in methods:
        check_choice("method", m, tuple(CP_METHODS))
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


def _ring_flops_rank(shape):
    r, n = dist.get_rank(), dist.get_world_size()
    q, k, v, _ = context_inputs(shape)
    flops = {}
    for layout in LAYOUTS:
        local = [shard(t, r, n, layout) for t in (q, k, v)]
        with FlopCounterMode(display=False) as counter:
            ring_attention(*local, causal=True, layout=layout)
        flops[layout] = counter.get_total_flops()
    return flops


def causal_work(world: int = CONTEXT_RANKS, shape=CONTEXT_SHAPE, backend: str = "gloo") -> dict:
    """Per layout, per rank: the unmasked (query, key) pairs of causal attention, and the
    FLOPs ring attention computes there (PyTorch's FlopCounterMode, forward), in one launch."""
    check_count("world", world)
    flops = run(_ring_flops_rank, world, shape, backend=backend)
    return {layout: {"unmasked pairs": causal_pairs(shape[2], world, layout),
                     "ring FLOPs": [rank[layout] for rank in flops]}
            for layout in LAYOUTS}


#: Section 6's block: d_model 64, 8 heads, d_ff 256, one sequence of 64 tokens, fp32.
SP_CONFIG = TransformerConfig(name="sp-block", d_model=64, n_layers=1, n_heads=8, d_ff=256,
                              vocab=16, context=64)


@dataclass
class SequenceParallelRun:
    """Tensor parallelism against sequence parallelism for one block on ``world`` ranks."""

    world: int
    max_error: dict        # {"tp": ..., "sp": ...}: largest difference from one process
    saved_bytes: dict      # {"tp": [...], "sp": [...]}: activations kept per rank
    sent: dict             # {"tp": {op: bytes}, "sp": {op: bytes}}: what rank 0 sent, by op


def _sp_rank(seq):
    r, n = dist.get_rank(), dist.get_world_size()
    results = {}
    for kind in ("tp", "sp"):
        group = dist.new_group(group_desc=kind)
        torch.manual_seed(0)
        block = TensorParallelBlock(GPT(SP_CONFIG).blocks[0], group,
                                    sequence_parallel=kind == "sp")
        g = torch.Generator().manual_seed(1)
        x, w = (torch.randn(1, seq, SP_CONFIG.d_model, generator=g) for _ in range(2))
        if kind == "sp":  # a copy: a view would keep the whole sequence's storage alive
            x, w = (t.chunk(n, dim=1)[r].clone() for t in (x, w))
        out, kept = forward_saved_bytes(block, x.requires_grad_())
        (out * w).sum().backward()
        results[kind] = (out.detach(), x.grad, kept)
    return results


def run_sequence_parallel(world: int = CONTEXT_RANKS, seq: int = 64) -> SequenceParallelRun:
    """One block on ``world`` toy ranks, with tensor parallelism and with sequence parallelism:
    both against one process (output and input gradient), the activation bytes each rank
    keeps, and rank 0's bytes by collective."""
    check_count("world", world)
    ranks = run(_sp_rank, world, seq, backend="toy")
    torch.manual_seed(0)
    block = GPT(SP_CONFIG).blocks[0]
    g = torch.Generator().manual_seed(1)
    x, w = (torch.randn(1, seq, SP_CONFIG.d_model, generator=g) for _ in range(2))
    out = block(x.requires_grad_())
    (out * w).sum().backward()
    errors, saved, sent = {}, {}, {}
    for kind in ("tp", "sp"):
        got_out = (torch.cat([rank[kind][0] for rank in ranks], dim=1) if kind == "sp"
                   else ranks[0][kind][0])
        got_grad = (torch.cat([rank[kind][1] for rank in ranks], dim=1) if kind == "sp"
                    else ranks[0][kind][1])
        errors[kind] = max((got_out - out).abs().max().item(),
                           (got_grad - x.grad).abs().max().item())
        saved[kind] = [rank[kind][2] for rank in ranks]
        by_op = {}
        for t in ranks.traffic.filter(group=kind, src=0).records:
            by_op[t.op] = by_op.get(t.op, 0) + t.nbytes
        sent[kind] = {op: b for op, b in sorted(by_op.items()) if b}
    return SequenceParallelRun(world, errors, saved, sent)


def block_units(world: int = CONTEXT_RANKS, shape=CONTEXT_SHAPE) -> tuple[int, int]:
    """One whole ``S/p x S/p`` block: its (query, key) pairs, and ring attention's FLOPs for
    it (the QK^T and PV products: 2 x 2 x batch x heads x (S/p)^2 x d_head)."""
    b, h, s, d = shape
    chunk = s // world
    return chunk * chunk, 4 * b * h * chunk * chunk * d


@figure("fig-08-ring-steps", "Ring attention, causal, on 4 ranks: the key/value block each "
                             "rank holds at each step and how much of it it computes")
def ring_steps(layout: str = "contiguous", world: int = CONTEXT_RANKS):
    return ring_steps_figure(world, ring_schedule(CONTEXT_SHAPE[2], world, layout), layout)


@figure("fig-08-causal-work", "Causal attention's work per rank, by layout: unmasked pairs and "
                              "the FLOPs ring attention computes")
def causal_work_chart():
    return causal_work_figure(causal_work(), *block_units())


#: Llama-3-8B's weights with the 128K context of Llama 3.1 (the chapter's long-context model).
LLAMA_31_8B = get_config("Llama-3-8B").replace(name="Llama-3.1-8B", context=131072)

#: The sequence lengths of the memory figure: Llama 3's 8K pre-training up to its 128K stage.
MEMORY_LENGTHS = (8192, 16384, 32768, 65536, 131072)

#: Per model, the layouts the memory figure compares (keywords of ``memory.estimate``), each
#: with bf16 and Adam, ZeRO-1 over the GPUs that hold the same layers (dp x cp).
#: Llama-3.1-8B (Llama-3-8B's weights with the 128K context of 3.1) on one server of 8
#: GPUs, one sequence per step. Llama 3.1 405B as Dubey et al. (2024, "The Llama 3 Herd of
#: Models", Table 4) trained it on 16,384 H100s: tp 8 and pp 16, with cp 1 and dp 128 for
#: the 8K stage and cp 16 and dp 8 for the 128K stage; 16 sequences per replica, here 16
#: micro-batches of one (the paper's own schedule, a tuned interleaving, is not modelled).
MEMORY_LAYOUTS = {
    "Llama-3.1-8B, 8 GPUs": {
        "tp 8": dict(tp=8),
        "tp 8 + sequence parallel": dict(tp=8, sequence_parallel=True),
        "cp 8, ring": dict(cp=8),
        "cp 8, Ulysses": dict(cp=8, cp_method="ulysses"),
        "cp 8, all-gather (ours keeps a mask)": dict(cp=8, cp_method="all-gather"),
        "tp 2 x cp 4 ring + sequence parallel": dict(tp=2, cp=4, sequence_parallel=True)},
    "Llama-3.1-405B, 16,384 GPUs (Llama 3's layouts)": {
        "tp 8, pp 16 (8K stage)": dict(tp=8, pp=16, dp=128),
        "tp 8 + sequence parallel, pp 16": dict(tp=8, pp=16, dp=128, sequence_parallel=True),
        "+ cp 16 ring (128K stage)": dict(tp=8, pp=16, dp=8, cp=16, sequence_parallel=True),
        "+ cp 16 all-gather (ours)": dict(tp=8, pp=16, dp=8, cp=16, sequence_parallel=True,
                                          cp_method="all-gather")},
}


#: The config behind each panel of :data:`MEMORY_LAYOUTS`.
MEMORY_MODELS = dict(zip(MEMORY_LAYOUTS, (LLAMA_31_8B, get_config("Llama-3.1-405B"))))


def memory_by_sequence(lengths=MEMORY_LENGTHS) -> dict:
    """``{model: {layout: Breakdown at each of lengths}}`` from :func:`parlab.memory.estimate`
    (:data:`MEMORY_LAYOUTS`): the busiest GPU of each layout."""
    out = {}
    for model, layouts in MEMORY_LAYOUTS.items():
        config, out[model] = MEMORY_MODELS[model], {}
        for label, split in layouts.items():
            dp = split.get("dp", 1)
            micro = 16 if split.get("pp", 1) > 1 else 1
            out[model][label] = [
                estimate(config, (micro * dp, seq), "adam", "bf16", microbatches=micro, zero=1,
                         **split) for seq in lengths]
    return out


@figure("fig-08-memory-by-sequence", "Memory per GPU against sequence length for "
                                     "Llama-3.1-8B and Llama 3's 405B layouts, by method")
def memory_by_sequence_chart():
    curves = {model: {label: [b.total / 1e9 for b in values] for label, values in layouts.items()}
              for model, layouts in memory_by_sequence().items()}
    return memory_by_sequence_figure(curves, MEMORY_LENGTHS, GPU_MEMORY_GB)
