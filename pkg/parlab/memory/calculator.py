"""How much GPU memory training takes: a calculator, and a measurement that checks it.

Why this module exists: Figure 8-1 lists what a GPU holds while it trains, and the chapter's
argument for parallelism is that for a large model the list no longer fits. :func:`estimate`
puts a number of bytes on each part for any model, precision, optimizer and data / tensor /
pipeline split; :func:`measure` runs a real training step and counts what it actually kept,
so the formulas below are tested, not trusted.

Units: bytes; ``GB`` is 10**9 bytes (:mod:`parlab.units`; an "80 GB" card holds 80 x 10**9).

What the estimate counts, per GPU (the most loaded pipeline stage), for N parameters on it
(after the tensor / pipeline split), the first four from
:func:`parlab.memory.model_state_bytes` (module ``states``, the one home of these formulas):

- parameters  N x 4 bytes in fp32; N x 2 in fp16/bf16 mixed precision;
- gradients   the same size as the parameters (kept between steps);
- master weights (mixed precision only): an fp32 copy, N x 4;
- optimizer state, fp32: SGD 0, SGD with momentum 4 N (one buffer), Adam 8 N (two moments);
  (torch's Adam also keeps a 4-byte step counter per parameter *tensor*: ignored);
- with ``zero=1, 2, 3`` (ZeRO over the ``dp`` replicas, Rajbhandari et al., 2020) the
  optimizer state and master weights, then also the gradients, then also the parameters
  hold ceil(N / dp) elements instead of N;
- activations: what autograd saves for the backward pass, times the micro-batches in flight
  (ZeRO does not change them).

Activations of one micro-batch of b sequences of length T, element size s (4 or 2 bytes), for
:func:`parlab.models.build_model` (found by listing what autograd saves, op by op):

- each block: LayerNorm inputs and outputs 4bTd and their mean/rstd 4bT (replicated under
  tensor parallelism); Q, K, V head copies and the attention output 4bTd, GELU input and output
  2bT d_ff, softmax probabilities b h T^2 (all divided by tp); all times s, plus the causal
  mask, T^2 bytes (tensor by tensor: :func:`block_activations`);
- embedding: token ids 8bT and positions 8T; head: final LayerNorm 2bTd + 2bT, log-probs
  bT vocab/tp, times s; targets 8bT;
- a :class:`~parlab.models.LlamaConfig` (Llama 2 / 3, Mistral, any Hugging Face config
  :func:`parlab.models.from_hf_config` reads) has its own per-op count: RMSNorms in fp32,
  rotary tables, a fused attention kernel's logsumexp instead of T x T probabilities,
  SwiGLU's four d_ff-wide tensors, no position ids (:mod:`parlab.memory.decoders`, the one
  home of both families' formulas and of their parameters per tensor-parallel rank);
- a :class:`~parlab.models.BookMLP` of widths n_0 ... n_L: s b (n_0 + n_1 + ... + n_L + n_L):
  its input, each layer's output (ReLU, sigmoid and tanh save their output, which the next
  layer needs anyway) and the target of the loss.

With ``recompute="full"`` or ``"selective"`` (activation checkpointing) each layer keeps less
and one layer at a time rebuilds the rest during the backward pass: kept bytes x micro-batches
in flight + one layer's rebuilt bytes (:func:`parlab.memory.layer_activations`, module
``recompute``, the one home of those formulas).

Any other ``torch.nn.Module`` has no formula: :func:`estimate` traces one training step of it
with fake tensors (modules ``tracing`` and ``modules``: nothing is allocated, a model on the
meta device works) and counts what autograd saved, with the same parts, precisions,
optimizers, ZeRO stages, data and pipeline splits and full recompute (not tensor parallelism).

Not counted: temporary buffers that live only inside one operation (the gradient of the
logits, matmul workspaces), data loaders, the CUDA context. ``measure`` on a GPU reports
them as ``other``.
"""

from __future__ import annotations

import os

from torch import nn

from parlab.hardware import gpu_memory
from parlab.memory.breakdown import (Breakdown, describe_setup, ESTIMATED_SCHEDULES, Plan,
                                     Setup)
from parlab.memory.decoders import block_terms, CP_METHODS, DECODERS, end_terms
from parlab.memory.modules import estimate_module
from parlab.memory.recompute import layer_activations
from parlab.memory.setup import resolve_setup
from parlab.memory.states import model_state_bytes
from parlab.memory.interleaved import held_bytes
from parlab.memory.stages import stage_layer_counts
from parlab.memory.vshape import (held_parameters, layer_counts, V_SCHEDULES, v_breakdowns,
                                  v_parameters)
from parlab.models import BookMLP, get_config
from parlab.checks import check_count

__all__ = ["ESTIMATED_SCHEDULES", "CP_METHODS", "Breakdown", "Plan", "Setup", "estimate",
           "rank_breakdowns", "activation_bytes", "activations_per_layer", "block_activations",
           "describe_setup"]


def _micro(model, batch, seq, precision, tp=1, pp=1, recompute=None, **split) -> Setup:
    """Validate the arguments of one micro-batch's activation count (``split``: ``cp``,
    ``cp_method``, ``sequence_parallel``, ``stage_layers``, ``dropout``)."""
    model = get_config(model) if isinstance(model, (str, dict, os.PathLike)) else model
    check_count("seq", seq)  # an MLP ignores it, but a bad one is still a mistake
    shape = (batch, seq) if isinstance(model, DECODERS) else (batch,)
    return resolve_setup(model, shape, "sgd", precision, 1, tp, pp, 1, "1f1b", 80, 0, recompute,
                         **split)


def activation_bytes(model, batch: int, seq: int = 1, precision: str = "fp32", tp: int = 1,
                     stage: int = 0, pp: int = 1, recompute: str | None = None, *,
                     cp: int = 1, cp_method: str = "ring", sequence_parallel: bool = False,
                     stage_layers=None, dropout: bool = False) -> int:
    """Bytes autograd saves for one micro-batch of ``batch`` x ``seq`` on one pipeline stage.

    The pipeline chapter multiplies this by the micro-batches a stage holds in flight. With
    ``recompute`` (one of :data:`parlab.memory.RECOMPUTE`): the bytes the stage's layers keep
    plus the one layer rebuilt during the backward pass. ``cp``, ``cp_method`` and
    ``sequence_parallel``, ``dropout``: as in :func:`block_activations`; ``stage_layers``: the
    layers of each stage (:mod:`parlab.memory.stages`; None: as even as possible, extra first)."""
    return sum(_stage_activations(model, batch, seq, precision, tp, stage, pp, recompute,
                                  stage_layers, cp=cp, cp_method=cp_method,
                                  sequence_parallel=sequence_parallel, dropout=dropout))


def _stage_activations(model, batch, seq, precision, tp, stage, pp, recompute,
                       stage_layers=None, **split) -> tuple[int, int]:
    """(kept, rebuilt): bytes one micro-batch keeps on ``stage`` until its backward pass, and
    the most one of the stage's layers rebuilds at a time (0 without recompute)."""
    s = _micro(model, batch, seq, precision, tp, pp, recompute, stage_layers=stage_layers,
               **split)
    if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < pp:
        raise ValueError(f"stage must be an int in 0..{pp - 1} (pp={pp}), got {stage!r}")
    return _checked_stage_activations(s, batch, seq, tp, stage, pp, recompute)


def _checked_stage_activations(s: Setup, batch: int, seq: int, tp: int, stage: int, pp: int,
                               recompute) -> tuple[int, int]:
    """:func:`_stage_activations` of a checked :class:`Setup` ``s`` (its model, precision,
    stage layers and sequence split; not its batch or its pp): the estimate's inner loop,
    which checked its arguments once, for the whole job, instead of per stage."""
    per_layer = _layer_bytes(s, batch, seq, tp)
    # the first and last entries of per_layer are the two ends
    counts = stage_layer_counts(len(per_layer) - 2, pp, s.stage_layers)
    start = 1 + sum(counts[:stage])
    mine = per_layer[start:start + counts[stage]]
    priced = {n: layer_activations(s.model, n, batch, seq, s.precision.bytes, tp, recompute,
                                   s.sequence_parallel, s.dropout) for n in set(mine)}
    layers = [priced[n] for n in mine]  # a transformer's blocks are alike: each priced once
    total = sum(kept for kept, _ in layers)
    if stage == 0:
        total += per_layer[0]
    if stage == pp - 1:
        total += per_layer[-1]
    if isinstance(s.model, BookMLP) and stage > 0:  # the input this stage received
        total += batch * s.model.sizes[start - 1] * s.precision.bytes
    return total, max((rebuilt for _, rebuilt in layers), default=0)


def activations_per_layer(model, batch: int, seq: int = 1, precision: str = "fp32",
                          tp: int = 1, *, cp: int = 1, cp_method: str = "ring",
                          sequence_parallel: bool = False, dropout=False) -> dict[str, int]:
    """Saved bytes of one micro-batch, layer by layer: the input end, each layer, the loss end.
    With ``cp`` context-parallel ranks each holds seq / cp tokens of both ends (the
    embedding and the loss work token by token) and its blocks as :func:`block_activations`
    counts them (``dropout``: as there)."""
    s = _micro(model, batch, seq, precision, tp, cp=cp, cp_method=cp_method,
               sequence_parallel=sequence_parallel, dropout=dropout)
    return _per_layer(s, batch, seq, tp)


def _per_layer(s: Setup, batch: int, seq: int, tp: int) -> dict[str, int]:
    """:func:`activations_per_layer` of a checked one-micro-batch :class:`Setup` ``s``."""
    values = _layer_bytes(s, batch, seq, tp)
    first, layer, last = (("input", "layer", "loss") if isinstance(s.model, BookMLP)
                          else ("embedding", "block", "head"))
    names = [first] + [f"{layer} {i}" for i in range(1, len(values) - 1)] + [last]
    return dict(zip(names, values))


def _layer_bytes(s: Setup, batch: int, seq: int, tp: int) -> list[int]:
    """:func:`_per_layer`'s values in order: the input end, each layer, the loss end."""
    e, m, sequence_parallel, cp, cp_method = (s.precision.bytes, s.model, s.sequence_parallel,
                                              s.cp, s.cp_method)
    if isinstance(m, BookMLP):
        return [batch * m.sizes[0] * e] + [batch * n * e for n in m.sizes[1:]] \
            + [batch * m.sizes[-1] * e]
    block = sum(block_terms(m, batch, seq, e, tp, sequence_parallel, cp, cp_method,
                            s.dropout).values())
    embedding, head = end_terms(m, batch, seq // cp, e, tp, s.dropout, sequence_parallel)
    return [embedding] + [block] * m.n_layers + [head]


def block_activations(model, batch: int, seq: int = 1, precision: str = "fp32",
                      tp: int = 1, sequence_parallel: bool = False, *, cp: int = 1,
                      cp_method: str = "ring", dropout: bool = False) -> dict[str, int]:
    """Saved bytes of one block of :func:`parlab.models.build_model`, tensor by tensor.

    :func:`activations_per_layer` adds these up; the formulas live in
    :func:`parlab.memory.decoders.block_terms`. What autograd keeps for the backward pass, in
    the order the forward pass saves it, for b sequences of T tokens, d = d_model, f = d_ff,
    h heads, s bytes per element, in a GPT block:

    - ``ln1 input`` (the block's input x) and ``ln1 output``, the one tensor the Q, K and V
      projections all save (s b T d each); ``ln mean/rstd``: both LayerNorms' per-token mean
      and 1/std, 4 b T elements of the compute dtype (on the CPU; CUDA's kernel keeps fp32);
    - ``q heads``, ``k heads``, ``v heads``: the batched matmuls save contiguous copies of
      the (b, h, T, d/h) head views (s b T d / tp each);
    - ``causal mask``: masked_fill keeps the T x T boolean mask (T^2 bytes, per layer);
    - ``softmax probabilities``: s b h T^2 / tp, kept once, by softmax and by the V product;
    - ``attention output``: the heads put back together, out_proj's input (s b T d / tp);
    - ``ln2 input`` and ``ln2 output`` (fc1's input), s b T d each;
    - ``gelu input`` (fc1's output) and ``gelu output`` (fc2's input), s b T f / tp each.

    A Llama block (RMSNorm in fp32, rotary tables, a fused attention kernel's logsumexp
    instead of T x T probabilities, SwiGLU's four d_ff-wide tensors) has its own keys, listed
    in :mod:`parlab.memory.decoders`. ``model``: a :class:`~parlab.models.TransformerConfig`
    or :class:`~parlab.models.LlamaConfig` (or its name), with ``tp`` dividing its heads (and
    key/value heads) and d_ff; the norms' tensors are replicated under tensor parallelism,
    unless ``sequence_parallel`` (GPT blocks, as ``TensorParallelBlock`` runs them; a Llama's
    by the same rule) splits their tokens ``tp`` ways as well.

    ``cp`` context-parallel ranks (``seq`` is the whole sequence) each count a block of seq
    / cp tokens whose attention core is the one of ``cp_method`` (:data:`CP_METHODS`, as
    :func:`parlab.context_parallel.apply_context_parallel` runs them; keys:
    :func:`parlab.memory.decoders.context_core_terms`). ``dropout`` (GPT, cp = 1): also count
    Megatron-LM's dropout, which the published runs had and our GPT has not (its masks and the
    softmax dropout's output; keys: :func:`parlab.memory.decoders.block_terms`).
    """
    if not isinstance(get_config(model) if isinstance(model, str) else model, DECODERS):
        raise ValueError(f"block_activations counts a transformer block; got {model!r}")
    s = _micro(model, batch, seq, precision, tp, cp=cp, cp_method=cp_method,
               sequence_parallel=sequence_parallel, dropout=dropout)
    return block_terms(s.model, batch, seq, s.precision.bytes, tp, sequence_parallel, cp,
                       cp_method, dropout)


def _stage_breakdown(s: Setup, stage: int, label: str) -> Breakdown:
    states = model_state_bytes(held_parameters(s, stage), s.optimizer, s.precision.name,
                               s.dp * s.cp, s.zero)
    kept, rebuilt = _checked_stage_activations(s, s.micro_batch, s.seq, s.tp, stage, s.pp,
                                               s.recompute)
    ends = end_terms(s.model, s.micro_batch, s.seq // s.cp, s.precision.bytes, s.tp,
                     s.dropout, s.sequence_parallel) \
        if isinstance(s.model, DECODERS) else (0, 0)
    held = held_bytes(s, stage, kept, ends[0] * (stage == 0) + ends[1] * (stage == s.pp - 1))
    return Breakdown(**states.parts(), activations=held + rebuilt, capacity=s.capacity,
                     label=label)


def rank_breakdowns(s: Setup, label: str) -> list[Breakdown]:
    """Every GPU's :class:`Breakdown` of a config's (or a BookMLP's) job ``s``, one per
    pipeline rank: stage k's, or in a V (:mod:`parlab.memory.vshape`) rank r's two chunks'."""
    if s.schedule not in V_SCHEDULES:
        return [_stage_breakdown(s, k, f"{label}, stage {k}") for k in range(s.pp)]
    K, known, mlp = 2 * s.pp, {}, isinstance(s.model, BookMLP)
    counts = layer_counts(len(s.model.layers) if mlp else s.model.n_layers, K)

    def chunk(k: int) -> tuple[int, int]:  # chunks alike in layers and ends save alike
        key = k if mlp else (counts[k], k == 0, k == K - 1)
        if key not in known:
            known[key] = _checked_stage_activations(s._replace(stage_layers=None), s.micro_batch,
                                                    s.seq, s.tp, k, K, s.recompute)
        return known[key]

    return v_breakdowns(s, label, chunk, lambda r: v_parameters(s, r))


def estimate(model, input_shape=None, optimizer: str = "adam", precision: str = "fp32",
             dp: int = 1, tp: int = 1, pp: int = 1, microbatches: int = 1,
             schedule: str = "1f1b", gpu_memory_gb: float | None = None, zero: int = 0,
             recompute: str | None = None, *, example_input=None, loss_fn=None,
             split_points=None, ep: int = 1, cp: int = 1, cp_method: str = "ring",
             sequence_parallel: bool = False, gpu: str | None = None,
             virtual_stages: int = 1, stage_layers=None, dropout: bool = False) -> Breakdown:
    """Predicted bytes per part on the busiest GPU (see the module docstring for the formulas).

    ``model``: a :class:`~parlab.models.TransformerConfig` (or its name), a
    :class:`~parlab.models.BookMLP`, or any ``torch.nn.Module``, whose training step is traced
    with fake tensors (no memory allocated, a module on the meta device works):
    :func:`parlab.memory.modules.estimate_module` describes how, and what ``example_input``,
    ``loss_fn`` and ``split_points`` mean.

    ``input_shape`` is the global batch: ``(batch, seq)`` for a transformer, ``(batch,)`` for
    an MLP, the shape of a float input for a module. Each of the ``dp`` replicas takes
    batch/dp, cut into ``microbatches``; layers are spread over ``pp`` stages and each layer's
    matrices over ``tp`` GPUs (transformer configs only). Stage k holds ``stage_layers[k]``
    layers (a config or a BookMLP: pp positive ints summing to its layers, as Megatron-LM's
    ``--decoder-first/last-pipeline-num-layers`` set them; :mod:`parlab.memory.stages`), or
    by default as even a share as possible, the extra layers on the first stages (32 layers
    on pp=3: 11, 11, 10). With the default only the first and the last stage are evaluated:
    the first holds the embeddings, the most layers and the most micro-batches in flight, the
    last the output layer, and a middle stage never holds more than the first; with
    ``stage_layers`` every stage is priced with its own layers and the busiest returned.
    ``schedule`` is one of :data:`ESTIMATED_SCHEDULES`; the V schedules ``"zbv"`` and
    ``"dualpipev"`` cut the layers into 2 pp chunks, rank r holding chunks r and 2 pp - 1 - r
    (rank 0 both ends), and are priced per rank, not per stage
    (:mod:`parlab.memory.vshape`): every rank is evaluated, and the label names the busiest
    one and its chunks. They need n_layers >= 2 pp, DualPipeV also microbatches >= 2 pp.
    ``zero`` (0 to 3) shards the model states of each GPU's parameters over the ``dp``
    replicas as :func:`parlab.memory.model_state_bytes` describes; activations are unchanged.
    ``recompute`` (None, "full", "selective"): activation recomputation, module docstring.
    ``ep``: expert parallelism, for a module with :class:`~parlab.models.MoE` layers: each
    layer's experts are divided over ``ep`` of the ``dp`` GPUs, everything else replicated.

    Long sequences (transformer configs; chapter 08): ``cp`` context-parallel GPUs share each
    sequence, each holding seq / cp of its tokens and attending to the rest by ``cp_method``
    ("ring", "all-gather" or "ulysses", :func:`block_activations`); they hold the same
    weights, so the job has dp x tp x pp x cp GPUs and ZeRO shards over the dp x cp of them
    that hold the same layers, as Megatron-LM's distributed optimizer does.
    ``sequence_parallel`` (Megatron's) splits the norm regions' tokens over the ``tp`` GPUs;
    ``dropout`` (GPT configs) counts Megatron-LM's dropout as well (:func:`block_activations`).
    ``gpu``: a name in :data:`parlab.hardware.GPUS`, whose capacity is the limit (None: 80 GB,
    or ``gpu_memory_gb``; giving both is a ValueError unless they agree). ``virtual_stages``
    (v > 1, schedule "1f1b"): interleaved 1F1B, :mod:`parlab.memory.interleaved`."""
    s = resolve_setup(model, input_shape, optimizer, precision, dp, tp, pp, microbatches,
                      schedule, gpu_memory(gpu, gpu_memory_gb), zero, recompute,
                      example_input=example_input, loss_fn=loss_fn, split_points=split_points,
                      ep=ep, cp=cp, cp_method=cp_method, sequence_parallel=sequence_parallel,
                      virtual_stages=virtual_stages, stage_layers=stage_layers, dropout=dropout)
    label = describe_setup(s, "estimate per GPU")
    if isinstance(s.model, nn.Module):
        return estimate_module(s, label)
    if s.schedule in V_SCHEDULES:
        return max(rank_breakdowns(s, label), key=lambda b: b.total)
    stages = set(range(pp)) if s.stage_layers else {0, pp - 1}
    return max((_stage_breakdown(s, k, label) for k in sorted(stages)), key=lambda b: b.total)

