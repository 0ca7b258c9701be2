"""The two decoder families, GPT and Llama: what one GPU holds of them, op by op, in closed form.

Why this module exists: :func:`parlab.memory.estimate` prices a
:class:`~parlab.models.TransformerConfig` (GPT-2 / GPT-3) or a
:class:`~parlab.models.LlamaConfig` (Llama 2 / 3, Mistral, and whatever
:func:`parlab.models.from_hf_config` reads) without building anything, so it can split the
model over tensor-parallel ranks that a traced module does not have. Each count below was
written by listing what autograd saves for :func:`parlab.models.build_model`'s module, op
by op on the CPU, and the tests hold it to a real step (``memory.measure``) and to a fake
trace of the per-rank shard. This module is the one home of those per-family formulas:
:mod:`parlab.memory.calculator` (activations and parameters per stage) and
:mod:`parlab.memory.recompute` (what recomputation drops and rebuilds, and its FLOPs) read
them from here.

Tensor parallelism follows Megatron-LM: Q, K, V, fc1 / gate / up are split by columns (by
heads, by d_ff), the output projections by rows, the embedding and the LM head by vocabulary
(each rank ceil(vocab / tp) rows); norms are replicated. ``tp`` must divide the attention
heads and d_ff, and for a Llama config also its key/value heads. (Megatron, given more
tensor ranks than key/value heads, replicates each key/value head over tp / n_kv_heads
ranks; that layout is not modelled here, and such a tp is refused with an error that says
so.)
"""

from __future__ import annotations

import math

from parlab.checks import check_count
from parlab.models import forward_flops, LlamaConfig, TransformerConfig

__all__ = ["DECODERS", "CP_METHODS", "tensor_split_sizes", "tp_problem", "check_sequence_split",
           "check_dropout",
           "block_terms",
           "context_core_terms", "end_terms",
           "stage_parameters", "full_input", "selective_terms", "block_flops_per_token"]

#: The config classes with a closed form here.
DECODERS = (TransformerConfig, LlamaConfig)

#: The context-parallel attention methods counted here, by the names
#: :func:`parlab.context_parallel.apply_context_parallel` takes.
CP_METHODS = ("ring", "all-gather", "ulysses")

#: The keys of :func:`block_terms` that belong to the attention core, which context
#: parallelism replaces (:func:`context_core_terms`).
_CORE_KEYS = {TransformerConfig: ("q heads", "k heads", "v heads", "causal mask",
                                  "softmax probabilities", "attention output"),
              LlamaConfig: ("q rotated", "k heads", "v heads", "attention logsumexp",
                            "attention output")}


def tensor_split_sizes(m) -> dict[str, int]:
    """What tensor parallelism splits into ``tp`` equal parts, so what ``tp`` must divide:
    ``{"n_heads": ..., "n_kv_heads": ... (Llama only), "d_ff": ...}``."""
    kv = {"n_kv_heads": m.n_kv_heads} if isinstance(m, LlamaConfig) else {}
    return {"n_heads": m.n_heads, **kv, "d_ff": m.d_ff}


def tp_problem(m, tp: int) -> str:
    """Why ``tp`` tensor ranks cannot split ``m`` (with the valid degrees), or '' if they can."""
    check_count("tp", tp, "tensor-parallel ranks")
    need = tensor_split_sizes(m)
    if all(v % tp == 0 for v in need.values()):
        return ""
    valid = [t for t in range(1, min(need.values()) + 1)
             if all(v % t == 0 for v in need.values())]
    text = f"tp={tp} must divide " + " and ".join(f"{k}={v}" for k, v in need.items())
    if need.get("n_kv_heads", tp) % tp and need["n_heads"] % tp == 0:
        text += (f" (Megatron-LM would replicate each of the {m.n_kv_heads} key/value heads "
                 f"over {tp // math.gcd(tp, m.n_kv_heads)} ranks; that layout is not modelled "
                 f"here)")
    return f"{text}; valid tp for {m.name}: {valid}"


def check_dropout(m, dropout, cp: int = 1) -> bool:
    """``dropout`` if it is True or False and counted for ``m`` (a GPT config, cp = 1), else
    the error that says why (:func:`block_terms` documents what it adds)."""
    if not isinstance(dropout, bool):
        raise TypeError(f"dropout must be True or False, got {dropout!r}")
    if dropout and not isinstance(m, TransformerConfig):
        raise ValueError(f"dropout=True counts the dropout of Megatron-LM's GPT (a "
                         f"TransformerConfig); {getattr(m, 'name', m)!r} has none modelled")
    if dropout and cp > 1:
        raise ValueError(f"dropout=True with cp={cp} is not modelled yet; use cp=1")
    return dropout


def check_sequence_split(m, seq, tp, cp, cp_method, sequence_parallel, recompute) -> None:
    """The sequence splits of ``m`` that cannot work, each a ValueError naming its numbers."""
    if seq % cp:
        raise ValueError(f"cp={cp} context-parallel ranks must divide the sequence of {seq} "
                         f"tokens")
    if sequence_parallel and (seq // cp) % tp:
        raise ValueError(f"sequence_parallel splits each rank's {seq // cp} tokens over tp={tp} "
                         f"ranks: use a sequence length that tp x cp = {tp * cp} divides")
    heads = getattr(m, "n_kv_heads", m.n_heads) // tp
    if cp > 1 and cp_method == "ulysses" and heads % cp:
        raise ValueError(f"cp_method='ulysses' gives each of cp={cp} ranks whole key/value heads: "
                         f"cp must divide the {heads} key/value heads per tensor rank")
    if recompute and cp > 1:
        raise ValueError(f"recompute={recompute!r} with cp={cp} is not modelled yet; use "
                         f"recompute=None")


def block_terms(m, batch: int, seq: int, e: int, tp: int, sequence_parallel: bool = False,
                cp: int = 1, cp_method: str = "ring", dropout: bool = False) -> dict[str, int]:
    """Bytes one block saves for b = ``batch`` sequences of T = ``seq`` tokens, tensor by
    tensor, on one of ``tp`` ranks (``e`` bytes per element of the compute dtype).
    :func:`parlab.memory.block_activations` documents the keys. ``sequence_parallel``
    (Megatron's): the norm regions hold T/tp tokens on each rank, so their tensors (both
    norms' inputs, outputs and statistics) are divided by ``tp`` too; the column-parallel
    layers keep their own tokens only and gather them again for backward. ``cp``: each of
    ``cp`` context-parallel ranks holds T/cp tokens, and its attention core is
    :func:`context_core_terms` for ``cp_method``.

    ``dropout`` (GPT configs only): count the dropout of Megatron-LM's GPT, which the
    published runs trained with (Korthikanti et al. 2022, section 4.1) and
    :func:`parlab.models.build_model` does not build. It adds, in the order the forward pass
    saves them, ``attention dropout mask`` (one byte per softmax probability, b h T^2 / tp),
    ``attention dropout output`` (what the product with V then keeps besides the
    probabilities softmax keeps, e b h T^2 / tp), and the one-byte masks of the dropouts after
    the attention and after the MLP (``attention out dropout mask``, ``mlp dropout mask``,
    b T d each, replicated like the norms' tensors, or split ``tp`` ways under
    ``sequence_parallel``)."""
    check_dropout(m, dropout, cp)
    if cp > 1:
        terms = block_terms(m, batch, seq // cp, e, tp, sequence_parallel)
        core = context_core_terms(m, batch, seq, e, tp, cp, cp_method)
        keys = _CORE_KEYS[type(m)]
        first = next(k for k in terms if k in keys)
        out = {}
        for k, v in terms.items():
            out |= core if k == first else {} if k in keys else {k: v}
        return out
    if isinstance(m, LlamaConfig):
        m.check_modelled("the activation memory of a block")
        return _llama_block(m, batch, seq, e, tp, sequence_parallel)
    bt, d = batch * seq, m.d_model
    x, heads, ff = e * bt * d, e * bt * d // tp, e * bt * m.d_ff // tp
    if sequence_parallel:
        x, stats = x // tp, e * 4 * bt // tp
    else:
        stats = e * 4 * bt
    probs = batch * m.n_heads * seq * seq // tp
    core = {"causal mask": seq * seq, "softmax probabilities": e * probs}
    if dropout:
        core |= {"attention dropout mask": probs, "attention dropout output": e * probs}
    mask = {"attention out dropout mask": x // e} if dropout else {}
    return {"ln1 input": x, "ln1 output": x, "ln mean/rstd": stats, "q heads": heads,
            "k heads": heads, "v heads": heads, **core, "attention output": heads, **mask,
            "ln2 input": x, "ln2 output": x, "gelu input": ff, "gelu output": ff,
            **({"mlp dropout mask": x // e} if dropout else {})}


def context_core_terms(m, batch: int, seq: int, e: int, tp: int, cp: int,
                       method: str) -> dict[str, int]:
    """What one of ``cp`` context-parallel ranks keeps for a block's attention core, for b =
    ``batch`` sequences of T = ``seq`` tokens (the whole sequence), as
    :func:`parlab.context_parallel.apply_context_parallel` runs it (measured in the tests).
    With T' = T / cp tokens per rank, h = n_heads / tp heads, q = e b T' d / tp and kv = e b
    T' d_kv / tp (d_kv = d for a GPT):

    - ``ring``: our own autograd Function keeps this rank's q, k and v (k and v with their
      H_kv heads only: the copies for grouped-query attention are made per block and
      dropped), its output and one log-sum-exp per row (e b h T', in the compute dtype); the
      output projection keeps its own contiguous copy of the output (q). No T x T tensor;
    - ``all-gather``: scaled_dot_product_attention keeps the gathered keys and values of the
      whole sequence (2 cp kv), this rank's q, the mask of which keys each query sees (T' x
      T, in the compute dtype: the boolean mask becomes an additive one), a log-sum-exp in
      fp32 (4 b h T'), and its output, which is also the output projection's input;
    - ``ulysses``: after the all-to-all each rank holds the whole sequence for h / cp heads:
      q, k and v (q + 2 kv bytes; one buffer, or the copies put into sequence order for a
      zigzag or striped layout), a log-sum-exp (4 b h T' bytes again), the output by heads
      (q) and, after the all-to-all back, the output projection's input (q); attention runs
      with its causal flag, so no mask is kept (a zigzag or striped layout's reordering also
      keeps its two index vectors, 16 T bytes per layer, not counted here).
    """
    local = seq // cp
    bt, kv_width = batch * local, (m.d_kv if isinstance(m, LlamaConfig) else m.d_model)
    q, kv, h = e * bt * m.d_model // tp, e * bt * kv_width // tp, m.n_heads // tp
    if method == "ring":
        return {"q shard": q, "k shard": kv, "v shard": kv, "ring output": q,
                "ring logsumexp": e * bt * h, "attention output": q}
    if method == "all-gather":
        return {"visibility mask": e * local * seq, "gathered k, v": 2 * cp * kv, "q shard": q,
                "attention logsumexp": 4 * bt * h, "attention output": q}
    if method == "ulysses":
        return {"q, k, v by heads": q + 2 * kv,
                "attention logsumexp": 4 * bt * h, "attention output by heads": q,
                "attention output": q}
    raise ValueError(f"unknown cp_method {method!r}; choose one of {list(CP_METHODS)}")


def _llama_block(m: LlamaConfig, batch: int, seq: int, e: int, tp: int,
                 sequence_parallel: bool = False) -> dict[str, int]:
    """A :class:`~parlab.models.Llama` block (the keys, in the order the forward pass saves):

    - each RMSNorm computes in fp32: it keeps its input as fp32 (the block's input itself in
      fp32, an fp32 copy in bf16 / fp16), 4 b T d bytes; 1/rms, 4 b T; the normalised x in
      the compute dtype before the weight (e b T d); its output, the one tensor the
      projections after it all keep (e b T d); all replicated under tensor parallelism;
    - ``rotary cos/sin``: the rotation's two (T, d_head) tables, kept by the products with q
      and k (e T d_head each, on every rank);
    - scaled_dot_product_attention (on the CPU its flash kernel) keeps q after the rotation,
      k and v with every query head's copy (``repeat_interleave`` for grouped-query
      attention; its input, k before the copies, is then not kept), its output (which is
      also o_proj's input), e b T d / tp each, and a logsumexp per head and token in fp32,
      4 b h T / tp; no T x T tensor;
    - SwiGLU: the gate's output (SiLU's input), SiLU's output and the up projection's output
      (kept by their product) and the product (down's input), e b T d_ff / tp each.

    ``sequence_parallel`` divides the norms' tensors by ``tp``, by the rule measured on the
    GPT block (parlab has no tensor-parallel Llama block to measure it on).
    """
    bt, d = batch * seq, m.d_model
    fp32, x, heads, ff = 4 * bt * d, e * bt * d, e * bt * d // tp, e * bt * m.d_ff // tp
    norms = 4 * bt
    if sequence_parallel:
        fp32, x, norms = fp32 // tp, x // tp, norms // tp
    return {"attn_norm input (fp32)": fp32, "norm 1/rms": 2 * norms, "attn_norm normed": x,
            "attn_norm output": x, "rotary cos/sin": 2 * e * seq * m.d_head, "q rotated": heads,
            "k heads": heads, "v heads": heads, "attention logsumexp": 4 * bt * m.n_heads // tp,
            "attention output": heads, "mlp_norm input (fp32)": fp32, "mlp_norm normed": x,
            "mlp_norm output": x, "gate output": ff, "silu output": ff, "up output": ff,
            "silu x up": ff}


def end_terms(m, batch: int, seq: int, e: int, tp: int, dropout: bool = False,
              sequence_parallel: bool = False) -> tuple[int, int]:
    """(embedding, head): bytes saved outside the blocks for one micro-batch.

    Embedding: the token ids, 8 b T (int64), and for a GPT the positions, 8 T. Head: the
    final norm (a GPT's LayerNorm: input and output, e b T d each, mean/rstd e 2 b T; a
    Llama's RMSNorm: fp32 input 4 b T d, 1/rms 4 b T, normalised and output e b T d each),
    the log-probabilities that cross-entropy keeps, e b T ceil(vocab / tp), its total weight
    (one element) and the targets, 8 b T. ``dropout`` (a GPT's, as in :func:`block_terms`):
    the embedding's dropout keeps a one-byte mask, b T d (split ``tp`` ways under
    ``sequence_parallel``, as Megatron-LM runs it).
    """
    check_dropout(m, dropout)
    bt, d, vocab = batch * seq, m.d_model, math.ceil(m.vocab / tp)
    if isinstance(m, LlamaConfig):
        return 8 * bt, 4 * bt * d + 4 * bt + e * (2 * bt * d + bt * vocab + 1) + 8 * bt
    mask = bt * d // (tp if sequence_parallel else 1) if dropout else 0
    return 8 * bt + 8 * seq + mask, e * (2 * bt * d + 2 * bt + bt * vocab + 1) + 8 * bt


def stage_parameters(m, tp: int, layers: int, first: bool, last: bool, pp: int) -> int:
    """Parameters one of ``tp`` GPUs holds for a pipeline stage of ``layers`` blocks (the
    ``first`` holds the embeddings, the ``last`` the final norm and the head, a copy of the
    tied embedding when pp > 1). A bias after a row split is whole on every rank."""
    d, f, word = m.d_model, m.d_ff, math.ceil(m.vocab / tp) * m.d_model
    if isinstance(m, LlamaConfig):
        kv = m.d_kv
        block = (2 * d * d + 2 * d * kv + 3 * d * f) // tp + 2 * d
        block += (d + 2 * kv) // tp + d if m.attention_bias else 0
        block += 2 * f // tp + d if m.mlp_bias else 0
        positions, final = 0, d
    else:
        block = (4 * d * d + 3 * d) // tp + d + (2 * d * f + f) // tp + d + 4 * d
        positions, final = m.context * d, 2 * d
    n = layers * block
    if first:
        n += word + positions
    if last:
        n += final + (word if (not m.tied_embeddings or pp > 1) else 0)
    return n


def full_input(m, batch: int, seq: int, e: int) -> tuple[int, int]:
    """(kept, saved) under full recompute: the block's input that the checkpoint keeps,
    e b T d, and how much of it the block itself saved (so the recomputation need not
    rebuild it): all of it for a GPT (LayerNorm keeps its input as it is) and for a Llama
    in fp32; none for a Llama in bf16 / fp16, whose RMSNorm keeps an fp32 copy instead."""
    x = e * batch * seq * m.d_model
    return x, (0 if isinstance(m, LlamaConfig) and e != 4 else x)


def selective_terms(m, batch: int, seq: int, e: int, tp: int,
                    dropout: bool = False) -> tuple[int, int]:
    """(dropped, rebuilt): bytes selective recompute takes off what a block keeps, and what
    recomputing its attention core makes again (one block at a time).

    The core is the GPT's ``Attention.core(q, k, v)`` (scores, mask, softmax, product with
    V) or the Llama's ``LlamaAttention.core(q, k, v)`` (the key/value copies and
    scaled_dot_product_attention). The checkpoint keeps the core's inputs, and the core's
    output stays kept as the output projection's input.

    - GPT: drops the probabilities and the causal mask (s b h T^2 / tp + T^2). The Q, K, V
      head copies are dropped too, but the checkpoint keeps q, k and v as they came out of
      the projections, the same bytes. Rebuilt: the probabilities, the mask and the three
      head copies (the batched products copy their operands again).
    - Llama: drops the logsumexp (4 b h T / tp) and, with grouped-query attention, trades
      the key/value copies for the un-copied k and v (e b T (d - d_kv) / tp each). Rebuilt:
      the logsumexp, the output, and the two copies with grouped-query attention. A fused
      attention kernel keeps no T x T tensor, so there is little left to drop.

    ``dropout`` (a GPT's, :func:`block_terms`): the softmax dropout is inside the core, so its
    mask and output are dropped and rebuilt with the probabilities (Korthikanti et al. 2022,
    section 5: the core is QK^T, softmax, softmax dropout and the product with V).
    """
    t = block_terms(m, batch, seq, e, tp, dropout=dropout)
    if isinstance(m, LlamaConfig):
        grouped = m.n_kv_heads < m.n_heads
        copies = t["k heads"] + t["v heads"] if grouped else 0
        dropped = t["attention logsumexp"] + copies - 2 * e * batch * seq * m.d_kv // tp * grouped
        return dropped, t["attention logsumexp"] + t["attention output"] + copies
    scores = t["softmax probabilities"] + t["causal mask"]
    scores += t.get("attention dropout mask", 0) + t.get("attention dropout output", 0)
    return scores, scores + t["q heads"] + t["k heads"] + t["v heads"]


def block_flops_per_token(m, seq: int) -> tuple[int, int]:
    """(block, core): forward FLOPs per token of one block, and of its attention core.

    The projections and the feed-forward layer do 2 FLOPs per weight
    (:func:`parlab.models.forward_flops`; GPT: 4 d^2 + 2 d d_ff;
    Llama: 2 d^2 + 2 d d_kv + 3 d d_ff); the core computes all T x T scores QK^T and their
    product with V, 2 T d each (masked afterwards; a causal kernel may skip half)."""
    if isinstance(m, LlamaConfig):
        m.check_modelled("FLOPs per token")
    d, f = m.d_model, m.d_ff
    weights = (2 * d * d + 2 * d * m.d_kv + 3 * d * f if isinstance(m, LlamaConfig)
               else 4 * d * d + 2 * d * f)
    core = 4 * seq * d
    return forward_flops(weights, 1) + core, core
