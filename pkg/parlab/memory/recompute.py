"""Activation recomputation (activation checkpointing): what it saves, what it costs, measured.

Why this module exists: activations are the part of Figure 8-1 that grows with the batch and
the sequence, and the usual cure is to keep less and compute more. Each layer keeps only its
input during the forward pass and runs its forward again, inside the backward pass, when its
gradient is needed (Chen et al., 2016, "Training Deep Nets with Sublinear Memory Cost").
Korthikanti et al. (2022, "Reducing Activation Recomputation in Large Transformer Models")
add a *selective* variant: recompute only the attention core, softmax(QK^T / sqrt(d)) V,
whose b h T^2 probabilities are most of a block's activations at long sequences and only a
few percent of its FLOPs.

This module is the one home of the recompute formulas (:func:`layer_activations`,
:func:`recompute_flops`; :func:`parlab.memory.estimate` calls them) and of their check:
:func:`measure_recompute` runs a real forward and backward with every layer wrapped in
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``. Its bytes come from
:func:`live_bytes`, a tracker of every storage an op creates: under a checkpoint, autograd's
``saved_tensors_hooks`` see nothing (the checkpoint packs the saved tensors with its own hooks
and drops them), yet the layers' inputs stay alive, so only the storages themselves tell.

Selective recompute checkpoints only the attention core: ``Attention.core(q, k, v)`` of a GPT,
``LlamaAttention.core`` of a Llama (the key/value copies and scaled_dot_product_attention).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop
from torch.utils.flop_counter import FlopCounterMode

from parlab.memory.decoders import block_flops_per_token, full_input, selective_terms
from parlab.models import BookMLP, count_parameters, forward_flops, get_config, training_flops

__all__ = ["RECOMPUTE", "check_recompute", "layer_activations", "full_recompute", "recompute_flops",
           "RecomputeFlops", "Trace", "live_bytes", "measure_recompute", "RecomputeResult"]

#: None keeps every activation; "full" keeps each layer's input and recomputes the layer;
#: "selective" recomputes only the attention core (transformer configs).
RECOMPUTE = (None, "full", "selective")


def check_recompute(recompute):
    """``recompute`` itself, or a ValueError listing :data:`RECOMPUTE`."""
    if not (recompute is None or (isinstance(recompute, str) and recompute in RECOMPUTE)):
        raise ValueError(f"unknown recompute {recompute!r}; choose one of {list(RECOMPUTE)}")
    return recompute


# --- the formulas ----------------------------------------------------------------------------

def layer_activations(model, layer_bytes: int, batch: int, seq: int, element_bytes: int, tp=1,
                      recompute=None, sequence_parallel=False, dropout=False) -> tuple[int, int]:
    """(kept, working): bytes one layer keeps from its forward to its backward, and the bytes
    its recomputation creates again while its backward runs (one layer at a time).

    ``model``: a GPT or Llama config or a :class:`~parlab.models.BookMLP`; ``layer_bytes``: what
    the layer keeps without recompute (:func:`parlab.memory.activations_per_layer`).

    - ``None``: (layer_bytes, 0).
    - ``"full"``, transformer block: it keeps its input, b T d s bytes (replicated under tensor
      parallelism); the recomputation rebuilds the rest, layer_bytes minus the part of the
      input the block saved itself (:func:`parlab.memory.decoders.full_input`).
    - ``"full"``, :class:`~parlab.models.BookMLP` layer: it already keeps only its output, the
      next layer's input, so nothing is dropped; recomputing re-creates the output (a second
      copy): (layer_bytes, layer_bytes). Recompute pays where a layer keeps much more than its
      input, as a transformer block does (about 8 + 2 d_ff/d + hT/d times b T d).
    - ``"selective"``, transformer block: its attention core is dropped and rebuilt one layer
      at a time (:func:`parlab.memory.decoders.selective_terms`: a GPT drops its s b h T^2 / tp
      probabilities and T^2-byte mask and rebuilds them with the Q, K, V head copies; a Llama,
      whose fused attention keeps no T x T tensor, drops little; ``dropout``: the core's
      dropout goes too). An MLP has no attention: as ``None``. ``sequence_parallel``: full
      recompute keeps 1/tp of the (split) input.
    """
    check_recompute(recompute)
    if recompute is None or (recompute == "selective" and isinstance(model, BookMLP)):
        return layer_bytes, 0
    if isinstance(model, BookMLP):
        return layer_bytes, layer_bytes
    if recompute == "full":
        kept = full_input(model, batch, seq, element_bytes)
        return full_recompute(layer_bytes, *(x // (tp if sequence_parallel else 1) for x in kept))
    dropped, rebuilt = selective_terms(model, batch, seq, element_bytes, tp, dropout)
    return layer_bytes - dropped, rebuilt


def full_recompute(layer_bytes: int, input_bytes: int,
                   saved_input_bytes: int | None = None) -> tuple[int, int]:
    """(kept, rebuilt) of one layer under full recompute: it keeps only its input,
    ``input_bytes``, and its recomputation rebuilds what it saved except that input:
    ``layer_bytes - saved_input_bytes`` (``saved_input_bytes``, the part of its input among its
    saved tensors, defaults to all of it: a layer whose first op saves its input)."""
    saved_input_bytes = input_bytes if saved_input_bytes is None else saved_input_bytes
    return input_bytes, layer_bytes - saved_input_bytes


class RecomputeFlops(NamedTuple):
    """FLOPs of one training step (``training``, 6 N tokens) and what recompute adds."""

    training: float
    extra: float

    @property
    def fraction(self) -> float:
        """``extra`` as a share of ``training``: about 1/3 for full recompute."""
        return self.extra / self.training


def recompute_flops(model, tokens: int, recompute=None, seq: int | None = None) -> RecomputeFlops:
    """The forward work recompute repeats during the backward pass, next to 6 N tokens.

    A training step costs about 2 N FLOPs per token forward (a multiply and an add per weight)
    and 4 N backward (gradients of the input and of the weights), 6 N in all
    (:func:`parlab.models.training_flops`). Full recompute runs each block's forward once more:
    per token and block, 2 (4 d^2 + 2 d d_ff) for a GPT's projections and feed-forward layer
    (a Llama's 2 (2 d^2 + 2 d d_kv + 3 d d_ff); :mod:`parlab.memory.decoders`), plus 4 T d
    for the attention scores QK^T and the weighted sum of V (T = ``seq``, the context by
    default; the model computes all T x T scores, masked afterwards). That is about
    a third of the step, a little less since the embeddings and the head are not recomputed.
    Selective recompute repeats only the 4 T d per token and block. A
    :class:`~parlab.models.BookMLP` (``tokens`` = samples) repeats 2 x its weights per sample.
    """
    check_recompute(recompute)
    if isinstance(model, BookMLP):
        weights = sum(layer.W.numel() for layer in model.layers)
        total = weights + sum(layer.b.numel() for layer in model.layers)
        extra = forward_flops(weights, tokens) if recompute == "full" else 0
        return RecomputeFlops(training_flops(total, tokens), extra)
    c = get_config(model)
    seq = c.context if seq is None else seq
    block, core = block_flops_per_token(c, seq)
    per_token = {None: 0, "selective": core, "full": block}[recompute]
    return RecomputeFlops(training_flops(count_parameters(c)["total"], tokens),
                          tokens * c.n_layers * per_token)


# --- the tracker -----------------------------------------------------------------------------

class Trace(TorchDispatchMode):
    """Bytes of the storages that ops create while it is active, and are still alive.

    Every output of every op is seen (``__torch_dispatch__``); a storage that none of the op's
    inputs had is new, counted once however many views share it, and uncounted when it dies
    (a finalizer on the storage, which lives as long as the memory does, whoever holds it:
    a Python name, autograd, a checkpoint). Storages made before the trace (parameters,
    inputs) are never counted. ``current`` is the bytes alive now, ``peak`` the most at once
    (checked after every op, when its inputs and outputs are both alive), ``marks`` the
    snapshots taken by :meth:`mark`. Temporaries inside one kernel and memory allocated
    outside ops (e.g. a checkpoint's saved RNG state) are not seen.
    """

    def __init__(self):
        super().__init__()
        self.current = 0
        self.peak = 0
        self.marks: dict[str, int] = {}
        self.live: dict[int, int] = {}  # storage id (_cdata) -> bytes
        self.result = None              # what live_bytes' fn returned
        self._finalizers: dict[int, weakref.finalize] = {}
        self._lock = threading.RLock()  # the backward pass may run on another thread

    def mark(self, label: str) -> int:
        """Record (and return) the bytes alive now under ``label``."""
        self.marks[label] = self.current
        return self.current

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {_storage_key(t) for t in tree_leaves((args, kwargs))}
        for t in tree_leaves(out):
            storage = _storage(t)
            if storage is not None:
                self._add(storage, inputs)
        return out

    def _add(self, storage, inputs) -> None:
        key, nbytes = storage._cdata, storage.nbytes()
        with self._lock:
            if key in self.live:  # written in place, perhaps resized
                self.current += nbytes - self.live[key]
                self.live[key] = nbytes
            elif key not in inputs:  # a view of an input, or the input itself: not new
                self.live[key] = nbytes
                self.current += nbytes
                self._finalizers[key] = weakref.finalize(storage, self._free, key)
            self.peak = max(self.peak, self.current)

    def _free(self, key: int) -> None:
        with self._lock:
            self.current -= self.live.pop(key, 0)
            self._finalizers.pop(key, None)

    def __exit__(self, *exc):
        result = super().__exit__(*exc)
        with self._lock:  # frozen from here on: later deaths are not this trace's business
            for fin in self._finalizers.values():
                fin.detach()
            self._finalizers.clear()
        return result


def _storage(t):
    if not isinstance(t, torch.Tensor):
        return None
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # sparse, nested: no single storage
        return None


def _storage_key(t):
    storage = _storage(t)
    return None if storage is None else storage._cdata


def live_bytes(fn, *args, **kwargs) -> Trace:
    """Run ``fn(*args, **kwargs)`` under a :class:`Trace` and return it (``trace.result`` holds
    what ``fn`` returned, so ``trace.current`` includes it). For snapshots along the way, use
    the trace as a context manager: ``with Trace() as trace: ...; trace.mark("after forward")``.
    """
    with Trace() as trace:
        trace.result = fn(*args, **kwargs)
    return trace


# --- the measurement -------------------------------------------------------------------------

@dataclass(frozen=True)
class RecomputeResult:
    """One forward and backward pass, measured (bytes: storages created inside the step).

    ``activations``: alive at the end of the forward pass (parameters and inputs excluded, the
    loss included: ``loss_bytes``, its storage). ``recomputed``: the most bytes one layer's
    recomputation made and still held at its end, i.e. its saved tensors, rebuilt during the
    backward pass (0 without recompute). ``peak``: the most alive at once during forward and
    backward, gradients included. ``input_bytes``: the input and target storages (made before
    the step, so not in the others). FLOPs as ``FlopCounterMode`` counts them (2 per
    multiply-add): ``forward_flops``, ``flops`` (forward + backward + recomputation) and
    ``layer_forward_flops`` (the forward work inside the layers: what full recompute repeats).
    ``grads``: parameter name -> gradient.
    """

    recompute: str | None
    activations: int
    recomputed: int
    peak: int
    input_bytes: int
    forward_flops: int
    flops: int
    layer_forward_flops: int
    loss: float
    grads: dict[str, torch.Tensor] = field(repr=False, compare=False, default_factory=dict)
    loss_bytes: int = 0

    @property
    def backward_flops(self) -> int:
        return self.flops - self.forward_flops

    @property
    def held(self) -> int:
        """Kept + inputs + one layer rebuilt; :func:`parlab.memory.estimate` counts the same,
        less the loss (``loss_bytes``)."""
        return self.activations + self.input_bytes + self.recomputed


def _layers(model: nn.Module) -> list[nn.Module]:
    blocks = getattr(model, "blocks", None)
    layers = list(blocks) if isinstance(blocks, nn.ModuleList) else list(model.children())
    if not layers:
        raise ValueError(f"{type(model).__name__} has no child modules (layers) to checkpoint")
    return layers


def _default_loss(output, target):
    """Cross-entropy for integer targets (our GPT's loss), MSE for float ones, else a sum.

    (On CPU, ``F.mse_loss`` returns a 0-dim view of its whole elementwise buffer: the loss
    holds output.numel() elements, and ``activations`` counts them.)
    """
    if target is None:
        return output.sum()
    if target.is_floating_point():
        return F.mse_loss(output, target)
    return F.cross_entropy(output.flatten(0, -2), target.flatten())


def measure_recompute(model: nn.Module, example_input, target=None, *, recompute=None,
                      loss_fn=None) -> RecomputeResult:
    """Run one forward and backward pass of ``model`` and measure its bytes and FLOPs.

    The layers are ``model.blocks`` (our GPT) or else ``model``'s children; with
    ``recompute="full"`` each runs inside ``checkpoint(..., use_reentrant=False)``, with
    torch's early stop switched off so that each recomputation is the layer's whole forward
    (with it on, the ops after the layer's last saved tensor are skipped). ``loss_fn(output,
    target)`` defaults to :func:`_default_loss`. The step runs twice, bytes under a
    :class:`Trace`, then FLOPs under ``FlopCounterMode``: the counter's module tracker hooks
    every module's outputs and so keeps a layer's recomputed tensors alive until the backward
    pass ends, which would inflate the peak. The model's gradients are left as they were; the
    new ones are in the result. ``"selective"`` checkpoints only each layer's attention core,
    ``layer.attn.core(q, k, v)`` (our GPT's and Llama's), and counts layer FLOPs as without.
    """
    check_recompute(recompute)
    layers, loss_fn = _layers(model), loss_fn or _default_loss
    if recompute == "selective" and not all(hasattr(getattr(l, "attn", None), "core")
                                            for l in layers):
        raise ValueError("selective recompute checkpoints each layer's attention core, "
                         "layer.attn.core(q, k, v) as in parlab.models.GPT and Llama; these "
                         "layers have none: use recompute=None or 'full'")
    params = dict(model.named_parameters())
    old_grads = {name: p.grad for name, p in params.items()}
    inputs = {_storage_key(t): _storage(t).nbytes() for t in (example_input, target)
              if _storage(t) is not None}

    def step(trace=None, counter=None) -> tuple[torch.Tensor, dict, dict]:
        state = {"forward": True, "layer_flops": 0, "recomputed": 0}
        saved = [_wrap(layer, recompute, state, trace, counter) for layer in layers]
        if recompute == "selective":
            saved += [_wrap(layer.attn, "full", state, trace, None, attr="core")
                      for layer in layers]
        try:
            for p in params.values():
                p.grad = None
            with set_checkpoint_early_stop(False):
                loss = loss_fn(model(example_input), target)
                state["at_forward"] = trace.mark("forward") if trace else \
                    counter.get_total_flops()
                state["forward"] = False
                loss.backward()
            return loss, {name: p.grad for name, p in params.items()}, state
        finally:
            owners = layers + ([layer.attn for layer in layers] if recompute == "selective"
                               else [])
            for owner, forward in zip(owners, saved):
                _unwrap(owner, forward, "core" if owner not in layers else "forward")
            for name, p in params.items():
                p.grad = old_grads[name]

    with Trace() as trace:
        loss, grads, memory = step(trace=trace)
    with FlopCounterMode(display=False) as counter:
        flops = step(counter=counter)[2]
    return RecomputeResult(recompute, memory["at_forward"], memory["recomputed"], trace.peak,
                           sum(inputs.values()), flops["at_forward"], counter.get_total_flops(),
                           flops["layer_flops"], loss.item(), grads, _storage(loss).nbytes())


_MISSING = object()


def _wrap(layer: nn.Module, recompute, state: dict, trace: Trace | None,
          counter: FlopCounterMode | None, attr: str = "forward"):
    """Make ``layer.<attr>`` count its forward FLOPs (with a ``counter``) and, for "full",
    run under a checkpoint whose recomputations are measured; returns what :func:`_unwrap`
    needs to undo it. Selective recompute wraps ``layer.attn`` with ``attr="core"``."""
    previous = layer.__dict__.get(attr, _MISSING)
    forward = getattr(layer, attr)

    def run(*args, **kwargs):
        if not state["forward"] or counter is None:  # a recomputation, or no counter
            return forward(*args, **kwargs)
        before = counter.get_total_flops()
        out = forward(*args, **kwargs)
        state["layer_flops"] += counter.get_total_flops() - before
        return out

    @contextlib.contextmanager
    def rebuilt():
        """Around a recomputation: what it made and still holds at its end (the layer's
        saved tensors; torch has already dropped the recomputed output)."""
        before = set(trace.live)
        try:
            yield
        finally:
            made = sum(n for key, n in list(trace.live.items()) if key not in before)
            state["recomputed"] = max(state["recomputed"], made)

    def contexts():
        return contextlib.nullcontext(), (rebuilt() if trace else contextlib.nullcontext())

    def checkpointed(*args, **kwargs):
        return checkpoint(run, *args, use_reentrant=False, context_fn=contexts, **kwargs)

    setattr(layer, attr, checkpointed if recompute == "full" else run)
    return previous


def _unwrap(layer: nn.Module, previous, attr: str = "forward") -> None:
    if previous is _MISSING:
        layer.__dict__.pop(attr, None)
    else:
        setattr(layer, attr, previous)
