"""Chapter 04's claims that do not hold as written, each checked by a computation.

Why this module exists: the notebook names each of the chapter's slips where it arises,
and shows the evidence as printed numbers, never as typed ones. The evidence is computed
here:

- :func:`collective_calls` reads a toy traffic log back into its collectives, with the
  size of the tensor each one carried. The chapter all-reduces *weight* gradients in the
  tensor-parallel backward pass; the log shows that what the collectives carry is
  *activations* and their gradients (batch x seq x d_model elements), never a weight
  shard, whose gradient each GPU computes alone (:func:`gradient_shard_bytes`,
  :func:`ffn_backward_sums` for Figure 8-19's network).
- :func:`layer_memory`: "a single layer often exceeds one GPU's memory" is false for
  GPT-3; what tensor parallelism does buy (activation memory and compute per layer, and
  far fewer pipeline stages) is computed next to it.
- :func:`book_rounding`: 605 M and 173 B are not what rounding the exact counts gives.
- :func:`column_split_input`: a column-split weight needs the *whole* input on every GPU.
  Figure 8-17's text says the embeddings are "distributed" between A1 and A2: read as a
  split of their features it is wrong, read as a copy on each GPU (Figure 8-18's
  broadcast) it is right.
- :func:`softmax_and_context`: the softmax gives attention weights; the context vector is
  those weights times V.
- :func:`ffn_widths`: the book's feed-forward network next to a transformer's.
- :func:`embedding_wire_bytes`: the two embedding layouts' traffic, for any number of GPUs.
- :func:`split_table_reasons`: why Megatron-LM splits the table all the same (memory, and
  the output layer that shares it).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from parlab.hardware import GPU_MEMORY_GB
from parlab.units import GB
from parlab.comm import ring_wire_bytes
from parlab.memory import activations_per_layer, model_state_bytes
from parlab.models import (
    count_parameters, forward_flops, get_config, GPT3_175B, TransformerConfig
)
from parlab.pipeline import schedule, simulate
from parlab.tensor_parallel import attend, FIGURE_8_19_SIZES, SelfAttention
from parlab.checks import check_count, check_positive_number

__all__ = ["BOOK_SAYS", "gpt3_counts", "CollectiveCall", "collective_calls", "calls_table", "gradient_shard_bytes",
           "ffn_backward_sums",
           "layer_memory", "book_rounding", "column_split_input", "softmax_and_context",
           "ffn_widths", "embedding_wire_bytes", "split_table_reasons"]

#: What the chapter states, to set beside the computed counts.
BOOK_SAYS = {"attention": 605e6, "feed_forward": 1.2e9, "blocks": 173e9, "total": 175e9}


def gpt3_counts(config: TransformerConfig | str = GPT3_175B) -> dict:
    """Parameters per attention layer, feed-forward layer, block, all blocks, and in total."""
    counts = count_parameters(get_config(config))
    return {k: counts[k] for k in ("attention", "feed_forward", "block", "blocks",
                                   "token_embedding", "position_embedding", "total")}


# --------------------------------------------------------------------------- what moved

class CollectiveCall(NamedTuple):
    """One collective (or one point-to-point message) read back from a toy traffic log.

    ``payload`` is the size of the tensor the collective was handed (the whole tensor:
    what an all-reduce sums, what an all-gather assembles), recovered from ``wire_bytes``
    with the ring formulas of :func:`parlab.comm.ring_wire_bytes`.
    """

    op: str
    group: str
    call: int
    ranks: tuple
    wire_bytes: int
    payload: int


def collective_calls(log) -> list[CollectiveCall]:
    """Every collective in ``log`` (a :class:`parlab.comm.TrafficLog`), in call order.

    Only the toy backend's ``ring`` algorithms (its default) can be read back; a log of
    another algorithm raises ValueError.
    """
    calls: dict[tuple, list] = {}
    for t in log.records:
        key = (t.group, t.call, t.op) + ((t.src, t.dst) if t.op == "send" else ())
        calls.setdefault(key, []).append(t)
    out = []
    for key, records in calls.items():
        op, algorithms = key[2], {t.algorithm for t in records}
        if op != "send" and algorithms != {"ring"}:
            raise ValueError(f"{op} in group {key[0]!r} ran {sorted(algorithms)}; only ring "
                             f"collectives can be read back into their payload")
        ranks = tuple(sorted({t.src for t in records} | {t.dst for t in records}))
        wire = sum(t.nbytes for t in records)
        factor = 1 if op == "send" else ring_wire_bytes(op, 1, len(ranks))
        out.append(CollectiveCall(op, key[0], key[1], ranks, wire, round(wire / factor)))
    return sorted(out, key=lambda c: (c.group, c.call))


def calls_table(calls: list[CollectiveCall]) -> str:
    """One line per collective: operation, group, ranks, tensor size, bytes on the wire."""
    lines = [f"{'collective':<12} {'group':<11} {'ranks':<8} {'tensor':>8} {'on the wire':>12}"]
    for c in calls:
        ranks = ",".join(map(str, c.ranks))
        lines.append(f"{c.op:<12} {c.group:<11} {ranks:<8} {c.payload:>6} B {c.wire_bytes:>10} B")
    return "\n".join(lines)


def gradient_shard_bytes(comparison, rank: int = 0) -> dict:
    """``{parameter: bytes}`` of the *sharded* weight gradients one rank holds after a run.

    ``comparison`` is what :func:`parlab.experiments.run_attention` returns; a gradient
    with a ShardSpec is one rank's piece (4-byte floats), a replicated one is left out.
    """
    specs = comparison.info["specs"][rank]
    return {name: math.prod(spec.local_shape) * 4 for name, spec in specs.items()
            if spec is not None}


def ffn_backward_sums(comparison) -> list[dict]:
    """Per stage of a :func:`parlab.experiments.run_ffn` run: what its backward pass summed.

    ``all_reduces`` ran inside the stage's server; ``tensor_bytes`` are the sizes of the
    tensors they carried (read from the toy log), ``input_gradient_bytes`` the size of
    dLoss/d(stage input) for one micro-batch, ``weight_shard_bytes`` the size of one GPU's
    piece of the stage's weight matrix (4-byte floats).
    """
    if comparison.traffic is None:
        raise ValueError("no traffic was logged: run run_ffn(..., backend='toy')")
    places, micro_batches = comparison.info["placements"], comparison.info["micro_batches"]
    samples = comparison.reference["output"].shape[0] // micro_batches
    calls = [c for c in collective_calls(comparison.traffic["backward"]) if c.op != "send"]
    rows = []
    for stage in sorted({p.stage for p in places}):
        mine = [p for p in places if p.stage == stage]
        sums = [c for c in calls if c.ranks == tuple(p.rank for p in mine)]
        rows.append({"layer": mine[0].layer, "micro_batches": micro_batches,
                     "all_reduces": len(sums), "tensor_bytes": sorted({c.payload for c in sums}),
                     "input_gradient_bytes": samples * mine[0].spec.shape[1] * 4,
                     "weight_shard_bytes": math.prod(mine[0].spec.local_shape) * 4})
    return rows


# --------------------------------------------------------------------------- one layer's size

def layer_memory(config: TransformerConfig | str = GPT3_175B,
                 gpu_bytes: float = float(GPU_MEMORY_GB * GB),
                 optimizer: str = "adam", precision: str = "bf16", tp: int = 8,
                 microbatches: int = 8) -> dict:
    """What one GPT-3 layer needs on one GPU, and what a tensor-parallel degree ``tp`` buys.

    Model states (parameters, gradients, fp32 master weights, optimizer state) come from
    :func:`parlab.memory.model_state_bytes`; one sequence's activations for one block from
    :func:`parlab.memory.activations_per_layer`; a block's forward matmul FLOPs for one
    sequence are :func:`parlab.models.forward_flops` (2 x its parameters x the tokens; the
    attention scores add a little more).
    "Stages" is how many pipeline stages the blocks need when model states alone must fit
    on a GPU; the bubble is GPipe's at ``microbatches`` micro-batches (from the simulator).
    """
    c = get_config(config)
    check_count("tp", tp)
    check_count("microbatches", microbatches)
    check_positive_number("gpu_bytes", gpu_bytes, "one GPU's memory in bytes")
    counts = count_parameters(c)

    def states(parameters):
        return model_state_bytes(parameters, optimizer, precision).total

    out = {"ffn_parameters": counts["feed_forward"],
           "ffn_state_bytes": states(counts["feed_forward"]),
           "attention_state_bytes": states(counts["attention"]),
           "block_state_bytes": states(counts["block"]), "gpu_bytes": gpu_bytes,
           "context": c.context, "microbatches": microbatches, "tp": tp}
    out["ffn_fits"] = out["ffn_state_bytes"] <= gpu_bytes
    for degree in (1, tp):
        per_gpu = states(math.ceil(counts["block"] / degree))
        blocks = int(gpu_bytes // per_gpu)
        stages = math.ceil(c.n_layers / blocks) if blocks else None
        out[f"tp{degree}"] = {
            "block_activation_bytes": activations_per_layer(c, 1, c.context, precision,
                                                            degree)["block 1"],
            "block_forward_flops": forward_flops(counts["block"], c.context) // degree,
            "blocks_per_gpu": blocks, "stages": stages,
            "bubble": simulate(schedule("gpipe", stages, microbatches)).bubble_fraction
            if stages else None}
    return out


def book_rounding(config: TransformerConfig | str = GPT3_175B) -> dict:
    """The book's 605 M and 173 B next to the exact counts and what rounding them gives.

    ``blocks_from_rounded`` is the number of blocks times the block count rounded to
    1.8 B first, the most likely source of "about 173 billion".
    """
    c = get_config(config)
    counts = count_parameters(c)
    block_rounded = round(counts["block"] / 1e9, 1) * 1e9
    return {"attention": counts["attention"],
            "attention_rounded_to_millions": round(counts["attention"] / 1e6) * 1e6,
            "book_attention": 605e6,
            "blocks": counts["blocks"],
            "blocks_rounded_to_billions": round(counts["blocks"] / 1e9) * 1e9,
            "block_rounded": block_rounded, "layers": c.n_layers,
            "blocks_from_rounded": c.n_layers * block_rounded, "book_blocks": 173e9}


# --------------------------------------------------------------------------- small demonstrations

def column_split_input(d_model: int = 8, tokens: int = 4, parts: int = 2, seed: int = 0) -> dict:
    """Largest error of rank 0's slice of Q = X W_Q^T when it sees all of X, or only its share.

    W_Q is split by output features (columns of the book's W, rows of ``nn.Linear.weight``),
    as in Figures 8-17 and 8-18. The two readings of X "distributed" between the ranks: a
    copy on each (``whole_input``, Figure 8-18's broadcast) gives the exact slice; a split
    (``input_share``: rank 0 holding only its share of X's features) gives a partial sum.
    """
    check_count("d_model", d_model)
    check_count("tokens", tokens)
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 2 or d_model % parts:
        raise ValueError(f"parts must be an int >= 2 that divides d_model={d_model}, got {parts!r}")
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(tokens, d_model, generator=g), torch.randn(d_model, d_model, generator=g)
    rows = slice(0, d_model // parts)  # rank 0's output features, and its share of X
    wanted = (x @ w.T)[:, rows]
    whole = x @ w[rows].T
    share = x[:, rows] @ w[rows, rows].T
    return {"whole_input": float((whole - wanted).abs().max()),
            "input_share": float((share - wanted).abs().max())}


def softmax_and_context(d_model: int = 8, n_heads: int = 2, batch: int = 1, seq: int = 4,
                        seed: int = 0) -> dict:
    """Shapes of the softmax output and of the context vectors, and that context = weights V.

    Uses :class:`parlab.tensor_parallel.SelfAttention` (no causal mask): the softmax gives
    one row of attention weights per token and head (each summing to 1); the context
    vectors are those weights times V, and equal the layer's own attention output.
    """
    layer = SelfAttention(d_model, n_heads, causal=False, seed=seed)
    x = torch.randn(batch, seq, d_model, generator=torch.Generator().manual_seed(seed + 1))
    d = layer.d_head
    with torch.no_grad():
        q, k, v = (layer.q_proj(x), layer.k_proj(x), layer.v_proj(x))
        heads = [t.view(batch, seq, n_heads, d).transpose(1, 2) for t in (q, k, v)]
        weights = torch.softmax(heads[0] @ heads[1].transpose(-2, -1) / math.sqrt(d), dim=-1)
        context = (weights @ heads[2]).transpose(1, 2).flatten(2)
        layer_context = attend(q, k, v, d, causal=False)
    return {"softmax_shape": tuple(weights.shape), "context_shape": tuple(context.shape),
            "rows_sum_to_one": bool(torch.allclose(weights.sum(-1), torch.ones(()))),
            "context_equals_layer": bool(torch.allclose(context, layer_context, atol=1e-6))}


def ffn_widths(config: TransformerConfig | str = GPT3_175B, sizes=FIGURE_8_19_SIZES) -> dict:
    """Layer widths: the book's Figure 8-19 network and a transformer's feed-forward layer.

    A transformer's feed-forward layer is d_model -> d_ff -> d_model: one hidden layer
    (fc1 and its activation) and one output layer (fc2), as :class:`parlab.models.MLP`.
    """
    c = get_config(config)
    return {"book": tuple(sizes), "book_hidden_layers": len(sizes) - 2,
            "transformer": (c.d_model, c.d_ff, c.d_model), "transformer_hidden_layers": 1,
            "d_ff_over_d_model": c.d_ff / c.d_model}


def embedding_wire_bytes(vectors_bytes: int, n: int) -> dict:
    """Bytes on the wire per step for ``vectors_bytes`` of looked-up vectors on ``n`` GPUs.

    Both layouts start from the same per-rank gradients: the first tensor-parallel layer
    hands each rank a different partial gradient of the vectors, and some collective must
    sum them (Megatron's ``f``). Per layout, ring algorithms:

    - the book's: the embedding broadcasts the vectors from A1 (forward); the reduce of the
      partial gradients onto A1, where the table lives, is the sum (backward);
    - the vocabulary split: the embedding all-reduces the ranks' partial lookups (forward,
      Megatron's ``g``); the first layer's ``f`` all-reduces the partial gradients, since
      every rank's rows need the full one (backward).

    ``embedding`` is the forward collective, ``f`` the backward one; ``ops`` names them.
    """
    check_count("vectors_bytes", vectors_bytes)
    check_count("n", n)
    out = {}
    for kind, ops in (("broadcast", ("broadcast", "reduce")), ("vocab", ("all_reduce",) * 2)):
        embedding, f = (ring_wire_bytes(op, vectors_bytes, n) for op in ops)
        out[kind] = {"ops": ops, "embedding": embedding, "f": f, "forward": embedding,
                     "backward": f, "total": embedding + f}
    return out


def split_table_reasons(config: TransformerConfig | str = GPT3_175B, tp: int = 8,
                        optimizer: str = "adam", precision: str = "bf16") -> dict:
    """Megatron-LM's reasons to split the word-embedding table by vocabulary, for one sequence.

    - memory: the table's model states (:func:`parlab.memory.model_state_bytes`) on one GPU,
      or 1/``tp`` of its rows on each, next to one GPU's share of a block;
    - the output layer shares the table (tied weights): its logits GEMM, 2 x tokens x d_model
      x vocab FLOPs forward, runs on one GPU or split like the table, next to one GPU's
      share of a block (2 x parameters x tokens / tp, as :func:`layer_memory`);
    - the loss over a vocabulary split across GPUs: gathering every token's fp32 logits
      (ring all-gather) against a parallel cross-entropy that all-reduces three fp32 values
      per token (the max logit, the target's logit, the sum of exponentials).
    """
    c = get_config(config)
    check_count("tp", tp)
    counts, tokens, rows = count_parameters(c), c.context, c.vocab * c.d_model

    def states(parameters):
        return model_state_bytes(parameters, optimizer, precision).total

    logits = tokens * c.vocab * 4
    return {"tp": tp, "tokens": tokens,
            "table_state_bytes": states(rows),
            "table_state_bytes_split": states(math.ceil(c.vocab / tp) * c.d_model),
            "block_state_bytes_per_gpu": states(math.ceil(counts["block"] / tp)),
            "head_forward_flops": 2 * tokens * c.d_model * c.vocab,
            "block_forward_flops_per_gpu": 2 * counts["block"] * tokens // tp,
            "logits_bytes": logits,
            "gather_logits_wire_bytes": ring_wire_bytes("all_gather", logits, tp),
            "parallel_loss_wire_bytes": 3 * ring_wire_bytes("all_reduce", tokens * 4, tp)}
