"""Measure what a real training step keeps in memory, part by part, to check the calculator.

Why this module exists: :func:`parlab.memory.estimate` is a set of formulas; this runs the
same model, batch, precision and optimizer for real and counts the storages it holds, so the
formulas are tested, not trusted (chapter 01 shows the two side by side). Split from
:mod:`parlab.memory.calculator` to keep each module short.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import fields
from itertools import chain

import torch
from torch import nn

from parlab.hardware import gpu_memory
from parlab.memory.breakdown import Breakdown, describe_setup, Setup
from parlab.memory.setup import resolve_setup
from parlab.memory.tracing import default_loss, failure_message
from parlab.memory.decoders import DECODERS
from parlab.memory.vshape import V_SCHEDULES

__all__ = ["measure", "forward_saved_bytes"]


def _unique_bytes(tensors) -> int:
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in tensors if t is not None}
    return sum(storages.values())


def _check_device(device) -> None:
    """A ValueError unless ``device`` names the CPU or an available CUDA GPU."""
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError):
        kind = None
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or a CUDA device such as 'cuda' or 'cuda:0', "
                         f"got {device!r}")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but no CUDA GPU is available; use device='cpu'")


def _trainable(s: Setup, device, seed):
    """A real model in the compute dtype, one loss closure per micro-batch in flight, and the
    tensors whose storages are not activations when saved (a module's buffers and inputs)."""
    import torch.nn.functional as F

    from parlab.models import build_model

    g = torch.Generator().manual_seed(seed)
    mb, dtype, m = s.micro_batch, s.precision.dtype, s.model
    if isinstance(m, nn.Module):
        return _module_trainable(s, device, g)
    if isinstance(m, DECODERS):
        net = build_model(m, seed=seed, dtype=dtype, device=device)
        data = [[torch.randint(0, m.vocab, (mb, s.seq), generator=g).to(device) for _ in "xt"]
                for _ in range(s.in_flight(0))]
        return net, [lambda x=x, t=t: net.loss(x, t) for x, t in data], []
    net = m.to_torch(dtype).to(device)
    data = [[torch.randn(mb, n, generator=g).to(device, dtype) for n in (m.sizes[0], m.sizes[-1])]
            for _ in range(s.in_flight(0))]
    return net, [lambda x=x, t=t: F.mse_loss(net(x), t) for x, t in data], []


def _check_real(s: Setup) -> None:
    """A ValueError unless the module and its example inputs hold real memory."""
    tensors = chain(s.model.parameters(), s.model.buffers(),
                    (i.tensor for i in s.inputs if i.tensor is not None))
    if any(t.is_meta for t in tensors):
        raise ValueError(f"measure runs a real training step, but {type(s.model).__name__} (or "
                         f"its example_input) is on the meta device: build it on the CPU, or "
                         f"use estimate(), which allocates nothing")


def _module_trainable(s: Setup, device, g: torch.Generator):
    """A copy of the module in the compute dtype (training mode) and its micro-batches: the
    first rows of ``example_input`` (copied), or random floats of ``input_shape``."""
    dtype, mb = s.precision.dtype, s.micro_batch
    net = copy.deepcopy(s.model).to(device=device, dtype=dtype).train()
    batches = []
    for k in range(s.in_flight(0)):
        batch = []
        for spec in s.inputs:
            if spec.tensor is None:
                x = torch.randn((mb, *spec.shape[1:]), generator=g)
            else:
                x = spec.tensor.detach()[k * mb:(k + 1) * mb]
            batch.append(x.to(device, spec.dtype_for(dtype), copy=True))
        batches.append(tuple(batch))
    loss_fn = s.loss_fn or default_loss
    losses = [lambda xs=xs: loss_fn(net(*xs), *xs) for xs in batches]
    return net, losses, [*net.buffers(), *chain(*batches)]


def _out_of_memory(error: BaseException) -> bool:
    text = str(error).lower()
    return isinstance(error, (MemoryError, torch.OutOfMemoryError)) or "out of memory" in text \
        or "can't allocate memory" in text or "cannot allocate memory" in text


def measure(model, input_shape=None, optimizer: str = "adam", precision: str = "fp32",
            dp: int = 1, tp: int = 1, pp: int = 1, microbatches: int = 1, schedule: str = "1f1b",
            gpu_memory_gb: float | None = None, device: str = "cpu", seed: int = 0, *,
            example_input=None, loss_fn=None, gpu: str | None = None) -> Breakdown:
    """Run real training steps and count, part by part, the bytes the second step kept.

    The first step creates the gradients and the optimizer state (torch allocates both
    lazily); the second is measured. Parameters, gradients, optimizer state and master
    weights are the storages of the real tensors. Activations are the distinct storages that
    autograd saved during the forward pass (a ``saved_tensors_hooks`` pair sees each one),
    all alive at the end of the forward pass, which is the peak; parameters saved by
    reference are not counted twice. On CUDA, ``other`` is
    ``torch.cuda.max_memory_allocated()`` minus all that: the transient buffers.
    ``tests/test_cuda.py`` checks on a GPU that every other part equals the CPU measurement
    (run on an H100; CPU-only CI skips it).

    ``model`` may be any real ``torch.nn.Module`` (not on the meta device), with
    ``input_shape`` (random floats) or ``example_input`` (its first rows: one micro-batch)
    and ``loss_fn`` as for :func:`parlab.memory.estimate`; it is copied, in the compute dtype
    and training mode, so the module passed in is left as it was. Its buffers and inputs are
    not activations when saved. A step that fails is a ValueError naming the input shape and
    the module's error; running out of memory is a MemoryError (the step's tensors are freed).

    One process plays one data-parallel rank (batch/dp per step), so tp and pp must be 1.
    ``gpu`` names the GPU whose capacity ``fits`` is judged against, as in :func:`estimate`.
    """
    s = resolve_setup(model, input_shape, optimizer, precision, dp, tp, pp, microbatches,
                      schedule, gpu_memory(gpu, gpu_memory_gb), example_input=example_input, loss_fn=loss_fn)
    _check_device(device)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    if tp != 1 or pp != 1:
        raise ValueError("measure runs in one process: tp and pp must be 1 (chapters 03 and 04 "
                         "measure the split layers on real ranks)")
    if schedule in V_SCHEDULES:
        raise ValueError(f"measure runs one pipeline stage in one process; schedule="
                         f"{schedule!r} puts two chunks on a rank in a V: use one of 1f1b, "
                         f"gpipe, zb-h1 (estimate() counts the V per rank)")
    module = isinstance(s.model, nn.Module)
    if module:
        _check_real(s)
    failure = None
    try:
        return _measure(s, device, seed)
    except Exception as error:  # noqa: BLE001 - reported below, once the step's frames are gone
        if _out_of_memory(error):
            failure = MemoryError(f"{describe_setup(s, 'measure ran out of memory')} on "
                                  f"{device}: {str(error).strip().splitlines()[0]}; estimate() "
                                  f"gives the same parts without allocating them")
        elif module:
            failure = ValueError(failure_message(s.model, s.inputs, error, s.micro_batch))
        else:
            raise
    raise failure  # outside the except block: the failed step's tensors are already freed


def _measure(s: Setup, device, seed) -> Breakdown:
    net, loss_fns, inputs = _trainable(s, device, seed)
    params = list(net.parameters())
    masters = [p.detach().float().clone() for p in params] if s.precision.master else params
    opt = {"sgd": lambda: torch.optim.SGD(masters, lr=1e-3),
           "momentum": lambda: torch.optim.SGD(masters, lr=1e-3, momentum=0.9),
           "adam": lambda: torch.optim.Adam(masters, lr=1e-3)}[s.optimizer]()
    saved: dict[int, int] = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    def train_step(record: bool):
        for p in params:  # gradients stay allocated between steps, as the estimate assumes
            if p.grad is not None:
                p.grad.zero_()
        hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        with hooks if record else contextlib.nullcontext():
            losses = [loss_fn() for loss_fn in loss_fns]
        for loss in losses:
            loss.backward()
        if s.precision.master:
            for p, m in zip(params, masters):
                m.grad = None if p.grad is None else p.grad.float()
        opt.step()
        if s.precision.master:
            with torch.no_grad():
                for p, m in zip(params, masters):
                    p.copy_(m)
                    m.grad = None

    train_step(record=False)
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    train_step(record=True)
    state = [t for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
    owned = {t.untyped_storage().data_ptr() for t in params + masters + inputs}
    b = Breakdown(parameters=_unique_bytes(params),
                  gradients=_unique_bytes(p.grad for p in params),
                  optimizer_state=_unique_bytes(state),
                  master_weights=_unique_bytes(masters) if s.precision.master else 0,
                  activations=sum(n for ptr, n in saved.items() if ptr not in owned),
                  capacity=s.capacity, label=describe_setup(s, f"measured on {device}"))
    if cuda:
        peak = torch.cuda.max_memory_allocated(device)
        b = Breakdown(**{**{f.name: getattr(b, f.name) for f in fields(b)},
                         "other": max(0, peak - b.total)})
    return b


def forward_saved_bytes(module: torch.nn.Module, *inputs):
    """``(output, bytes)``: run ``module(*inputs)`` and count the distinct storages autograd
    keeps for the backward pass, the module's own parameters left out (its inputs, when kept,
    counted). Views of one tensor count once, as they share its memory."""
    weights = {p.untyped_storage().data_ptr() for p in module.parameters()}
    kept: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(*inputs)
    return out, sum(kept.values())
