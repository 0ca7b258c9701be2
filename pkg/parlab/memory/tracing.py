"""Any ``torch.nn.Module``'s training step traced with fake tensors: what autograd saves.

Why this module exists: :func:`parlab.memory.measure` counts what a real step saves by
listening to ``saved_tensors_hooks``; :func:`trace_module` does the same on *fake* tensors
(``torch._subclasses.fake_tensor.FakeTensorMode``): every op computes the shape, dtype and
strides of its result and allocates nothing, so a 7-billion-parameter model built on the meta
device is traced in seconds. :mod:`parlab.memory.modules` turns the trace into an estimate.

How a step is traced, for one micro-batch:

- the parameters and buffers become fake CPU tensors in the compute dtype (fp32, or bf16 /
  fp16 for mixed precision), passed with ``torch.func.functional_call``; the module itself
  is not changed (it runs in training mode, as a training step does);
- the inputs become fake tensors of the micro-batch's shape: floating inputs in the compute
  dtype, integer ones (token ids) as given;
- forward, the loss (:func:`default_loss`: ``output.float().square().mean()``, summed over the
  output's tensors; ``loss_fn(output, *inputs)`` overrides it), backward;
- every storage autograd saves is counted once, however many views of it are saved; the
  parameters, buffers and inputs are never counted (they exist anyway). A forward hook on
  each top-level child (the items of a ``ModuleList`` or ``ModuleDict`` child count as
  children) records which child saved what and what each child received, for pipeline stages
  and recompute.

Fake ops follow the CPU kernels (a GPU's attention or RNN kernels may save otherwise). One
CPU kernel needs help: oneDNN's LSTM keeps a workspace whose size only the oneDNN primitive
knows (the fake kernel returns an empty one), so :class:`_Workspaces` asks it with a real
call of that one layer on zeros, at a batch small enough to cost at most about 64 MiB, scaled
linearly in the batch.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from torch.autograd.graph import saved_tensors_hooks
from torch.func import functional_call
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from parlab.memory.recompute import full_recompute

__all__ = ["InputSpec", "ModuleTrace", "module_children", "default_loss", "failure_message",
           "trace_module"]


class InputSpec(NamedTuple):
    """One input of a module: its global-batch ``shape`` (the first dimension is the batch),
    its ``dtype`` (None: a float input made from ``input_shape``, in the compute dtype) and
    the ``tensor`` given as ``example_input`` (None for ``input_shape``)."""

    shape: tuple[int, ...]
    dtype: torch.dtype | None
    tensor: torch.Tensor | None = None

    def dtype_for(self, compute: torch.dtype) -> torch.dtype:
        """Floating inputs run in the compute dtype; token ids and masks keep theirs."""
        return compute if self.dtype is None or self.dtype.is_floating_point else self.dtype


def module_children(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, child) of the top-level children, a ModuleList's or ModuleDict's items in its
    place; a module without children is its own one child."""
    out = []
    for name, child in model.named_children():
        if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
            out += [(f"{name}.{n}", c) for n, c in child.named_children()]
        else:
            out.append((name, child))
    return out or [("", model)]


def default_loss(output, *inputs) -> torch.Tensor:
    """The mean of the squares of the output, in fp32: a scalar whose gradient reaches every
    element (a tuple or dict output: the sum over its floating tensors that need a gradient).
    Squaring saves the output (in fp32: a copy of a bf16 output), and both estimate and
    measure count it."""
    leaves = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor)
              and t.is_floating_point() and t.requires_grad]
    if not leaves:
        raise ValueError("the module's output has no floating tensor that needs a gradient; "
                         "pass loss_fn=")
    loss = leaves[0].float().square().mean()
    for t in leaves[1:]:
        loss = loss + t.float().square().mean()
    return loss


#: PyTorch's losses whose target is a class index per sample (not a tensor like the output).
_CLASS_TARGET = (nn.CrossEntropyLoss, nn.NLLLoss, nn.MultiMarginLoss, nn.MultiLabelMarginLoss)


def as_loss(loss_fn):
    """``loss_fn`` as the trace calls it, ``loss(output, *inputs)`` -> a scalar tensor.

    None is :func:`default_loss`. A PyTorch loss module (``nn.CrossEntropyLoss()``,
    ``nn.MSELoss()``) takes ``(output, target)``: the trace gives it a target of zeros of the
    shape that loss expects (class indices for the classification losses; the output's shape
    for the others); the values do not change what a step holds in memory.
    """
    if loss_fn is None:
        return default_loss
    if isinstance(loss_fn, nn.modules.loss._Loss):
        def module_loss(output, *inputs):
            if isinstance(loss_fn, _CLASS_TARGET):
                shape = output.shape[:1] + output.shape[2:] if output.dim() > 1 else ()
                target = torch.zeros(shape, dtype=torch.long, device=output.device)
            else:
                target = torch.zeros_like(output)
            return loss_fn(output, target)
        return module_loss
    if not callable(loss_fn):
        raise ValueError(f"loss_fn must be a function loss_fn(output, *inputs) that returns a "
                         f"scalar tensor, or a PyTorch loss module such as "
                         f"nn.CrossEntropyLoss(); got {loss_fn!r}")
    return loss_fn


def failure_message(model: nn.Module, inputs, error: BaseException, micro_batch=None) -> str:
    """One line: the module, the input shapes, and the first line of ``error``."""
    shapes = ", ".join(str(tuple(i.shape)) for i in inputs)
    micro = f" (micro-batch of {micro_batch})" if micro_batch not in (None, inputs[0].shape[0]) \
        else ""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    if type(error).__module__.startswith("torch._subclasses"):
        text += (" (the estimate runs on fake tensors, which hold no values, so an op whose "
                 "output depends on values, such as .item() or nonzero(), cannot be traced)")
    return (f"{type(model).__name__}'s training step failed on input of shape {shapes}{micro}: "
            f"{text}")


class _LossError(Exception):
    """``loss_fn`` failed: the message says how it was called."""

    def __init__(self, loss_fn, output, inputs, error):
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        first = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
        module = isinstance(loss_fn, nn.modules.loss._Loss)
        how = ("a PyTorch loss module is called as loss_fn(output, target), with a target of "
               "zeros shaped as that loss expects" if module else
               "loss_fn is called as loss_fn(output, *inputs) and must return a scalar tensor")
        super().__init__(f"loss_fn={loss_fn!r} failed on the model's output "
                         f"{_described(output)} and inputs "
                         f"{', '.join(_described(i) for i in inputs)}: {first} ({how})")


def _described(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"(a {value.dtype} tensor of shape {tuple(value.shape)})"
    return f"{type(value).__name__} {value!r}"[:80]


# --- the trace -------------------------------------------------------------------------------

class ModuleTrace(NamedTuple):
    """What one micro-batch's step saved, by top-level child (see :func:`trace_module`).

    ``sizes``: storage -> bytes; ``inside[i]``: the storages saved while child i ran;
    ``after[i]``: those saved outside every child while child i was the last to begin (the
    code between the children, the loss; before any child: child 0); ``inputs[i]``: the
    storages child i received; ``order``: the children in the order they first ran.
    Parameters, buffers and the model's inputs appear nowhere.
    """

    sizes: dict
    inside: list
    after: list
    inputs: list
    order: list

    def bytes(self, keys) -> int:
        return sum(self.sizes[k] for k in keys)

    def stage_activations(self, children, recompute=None) -> tuple[int, int]:
        """(kept, rebuilt) bytes of one micro-batch on a stage made of ``children`` (indices).

        Without recompute a stage keeps what its children saved (its first child's input
        too, when saved: a pipeline stage owns the activation it received). With ``"full"``
        each child keeps only its input, and one child at a time rebuilds the rest
        (:func:`parlab.memory.recompute.full_recompute`)."""
        if recompute is None:
            return self.bytes(set().union(*(self.inside[i] | self.after[i] for i in children))), 0
        kept = set().union(*(self.inputs[i] | self.after[i] for i in children))
        rebuilt = [full_recompute(self.bytes(self.inside[i]), self.bytes(self.inputs[i]),
                                  self.bytes(self.inside[i] & self.inputs[i]))[1]
                   for i in children]
        return self.bytes(kept), max(rebuilt, default=0)


def _storage_key(t):
    if not isinstance(t, torch.Tensor):
        return None
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):  # sparse, nested: no single storage
        return None


_PROBE_BYTES = 64 * 2**20


def _rnn_workspace(func, args) -> int:
    """Bytes of the workspace oneDNN's LSTM layer keeps, from real calls on zeros: at the
    micro-batch itself if that is small, else at two smaller batches, extrapolated linearly
    (the workspace grows with the batch; each part is rounded up to 4 kB pages)."""
    x, hx = args[0], args[5]
    batched = not args[8] and x.dim() == 3 and x.shape[1] == hx.shape[0]

    def probe(batch: int) -> int:
        def real(i, a):
            if not isinstance(a, torch.Tensor):
                return a
            shape = list(a.shape)
            if batched and i == 0:
                shape[1] = batch
            elif batched and i in (5, 6):
                shape[0] = batch
            return torch.zeros(shape, dtype=a.dtype)
        with unset_fake_temporarily():  # (no torch.no_grad(): it drops the workspace)
            return func(*[real(i, a) for i, a in enumerate(args)])[3].nbytes

    if not batched:  # packed sequences: ask at the real size
        return probe(0)
    batch, one = hx.shape[0], probe(1)
    if batch == 1:
        return one
    if batch * one <= _PROBE_BYTES:
        return probe(batch)
    big = max(2, min(batch, _PROBE_BYTES // one))
    small = big // 2
    at_big, at_small = probe(big), probe(small)
    return at_big + (batch - big) * (at_big - at_small) // (big - small)


class _Workspaces(TorchDispatchMode):
    """Under a FakeTensorMode: give oneDNN's LSTM layer its real workspace size."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.mkldnn_rnn_layer.default and args[-1]:  # train=True
            workspace = torch.empty(_rnn_workspace(func, args), dtype=torch.uint8,
                                    device=out[3].device)
            out = (*out[:3], workspace)
        return out


def trace_module(model: nn.Module, inputs, micro_batch: int, dtype: torch.dtype,
                 loss_fn=None) -> ModuleTrace:
    """Trace one training step of ``model`` on a micro-batch of ``inputs`` (:class:`InputSpec`)
    with fake tensors in ``dtype`` (module docstring); a ValueError if the step fails."""
    children = [c for _, c in module_children(model)]
    n = len(children)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes: dict[int, torch.Tensor] = {}

    def fake(t: torch.Tensor, grad: bool) -> torch.Tensor:
        if id(t) not in fakes:
            f = torch.empty(t.shape, dtype=dtype if t.is_floating_point() else t.dtype,
                            device="cpu")
            fakes[id(t)] = f.requires_grad_(grad and f.is_floating_point())
        return fakes[id(t)]

    with mode:
        state = {name: fake(p, p.requires_grad)
                 for name, p in model.named_parameters(remove_duplicate=False)}
        state |= {name: fake(b, False) for name, b in model.named_buffers(remove_duplicate=False)}
        args = tuple(torch.empty((micro_batch, *i.shape[1:]), dtype=i.dtype_for(dtype),
                                 device="cpu") for i in inputs)
    excluded = {_storage_key(t) for t in (*state.values(), *args)}
    trace = ModuleTrace({}, [set() for _ in range(n)], [set() for _ in range(n)],
                        [set() for _ in range(n)], [])
    stack, last, keep = [], [0], []  # keep: every tensor seen, so no storage key is reused

    def record(t, into: set) -> None:
        key = _storage_key(t)
        if key is not None and key not in excluded:
            keep.append(t)
            trace.sizes[key] = t.untyped_storage().nbytes()
            into.add(key)

    def pack(t):
        record(t, trace.inside[stack[-1]] if stack else trace.after[last[0]])
        return t

    def before(i):
        def hook(module, args, kwargs):
            stack.append(i)
            last[0] = i
            if i not in trace.order:
                trace.order.append(i)
            for t in tree_leaves((args, kwargs)):
                record(t, trace.inputs[i])
        return hook

    def after(module, args, kwargs, output):
        stack.pop()

    loss = as_loss(loss_fn)
    modes = {m: m.training for m in model.modules()}
    handles = [h for i, c in enumerate(children) for h in (
        c.register_forward_pre_hook(before(i), with_kwargs=True),
        c.register_forward_hook(after, with_kwargs=True, always_call=True))]
    model.train()
    quiet = logging.getLogger("torch._subclasses.fake_tensor")  # it logs a failed op in full
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        with mode, _Workspaces(), saved_tensors_hooks(pack, lambda t: t):
            output = functional_call(model, state, args)
            try:
                loss = loss(output, *args)
            except Exception as error:  # the reader's loss: say how it is called
                raise _LossError(loss_fn, output, args, error) from error
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise ValueError(f"loss_fn must return a scalar tensor (a 0-dim torch.Tensor) to call "
                             f".backward() on; it returned {_described(loss)}")
        with mode:
            loss.backward()
    except _LossError as error:
        raise ValueError(str(error)) from error.__cause__
    except ValueError as error:
        if "loss_fn must return" in str(error):
            raise
        raise ValueError(failure_message(model, inputs, error, micro_batch)) from error
    except Exception as error:  # the module's own error, in one line
        raise ValueError(failure_message(model, inputs, error, micro_batch)) from error
    finally:
        quiet.setLevel(level)
        for h in handles:
            h.remove()
        for m, training in modes.items():
            m.train(training)
    return trace
