"""The split backward on real ranks: B (input gradient) now, W (weight gradient) later.

Why W can wait. For a layer ``y = x A^T + b`` that receives the gradient ``dL/dy``:

* B, the input gradient ``dL/dx = dL/dy A``, is what the previous stage waits for;
* W, the weight gradients ``dL/dA = dL/dy^T x`` and ``dL/db = sum of dL/dy``, need only the
  layer's own input x and ``dL/dy``, and nobody waits for them before the optimizer step.

So a stage's backward splits (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", §2;
PyTorch's action codes "I" and "W"):

* F runs the stage; a forward hook on every module that holds parameters itself (a
  ``Linear``, a ``LayerNorm``) notes its output y.
* I: one ``torch.autograd.grad`` from the stage's output (or loss), with the gradient that
  came from the next stage, to the stage's input *and* to every noted y, keeping the graph
  (``retain_graph=True``). The input gradient leaves for the previous stage at once; the
  ``dL/dy`` stay.
* W: for each noted module, ``torch.autograd.backward(y, dL/dy, inputs=its own parameters)``:
  from y straight to the weights that made it (``dL/dy^T x``, one product per layer),
  nothing recomputed; the results add into ``.grad``. Then this micro-batch's graph is
  dropped, and with it the x's and ``dL/dy``'s that W kept alive.
* A full backward (code "B") stays chapter 03's ``out.backward(grad)``.

This is PyTorch's ``stage_backward_input`` / ``stage_backward_weight``
(``torch/distributed/pipelining/_backward.py``) in small: PyTorch finds those intermediate
tensors by walking the autograd graph, here they are the outputs of the modules holding the
weights, so every parameter must belong to one such module, called once per forward (no
weights tied within a stage); anything else is a ValueError. Stage 0's input needs no
gradient, so its I computes only the ``dL/dy`` (PyTorch's first stage does nothing at I and
the whole backward at W).

:func:`program_steps` puts a :class:`parlab.pipeline.Program` into the executor's time steps.
"""

from __future__ import annotations

import torch

from parlab.pipeline.events import Durations, timeline
from parlab.pipeline.programs import Program
from parlab.pipeline.schedules import Schedule
from parlab.pipeline.simulator import StageTransfer

__all__ = ["SplitBackward", "program_steps", "weight_modules"]


def weight_modules(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules inside ``module`` that hold parameters themselves, each parameter in one.

    A ValueError names a parameter that two of them share (tied weights): W, which goes
    from each module's output to its own weights, would miss or double part of its gradient.
    """
    found, owner = [], {}
    for name, sub in module.named_modules():
        own = list(sub.named_parameters(recurse=False))
        if not own:
            continue
        found.append(sub)
        for pname, param in own:
            where = f"{name}.{pname}" if name else pname
            if id(param) in owner:
                raise ValueError(f"parameter {where} is also {owner[id(param)]}: the split "
                                 f"backward (I then W) needs every weight in one module of "
                                 f"its stage; run this stage with full backwards (B)")
            owner[id(param)] = where
    return found


class SplitBackward:
    """One rank's split backward over the stages it holds (``{stage: module}``).

    :meth:`forward` runs a stage and notes the outputs of its weight modules,
    :meth:`input_gradient` is the I action and :meth:`weight_gradient` the W action (see
    the module's docstring). Call :meth:`close` to remove the hooks.
    """

    def __init__(self, modules: dict):
        if not isinstance(modules, dict) or not all(isinstance(m, torch.nn.Module)
                                                    for m in modules.values()):
            raise ValueError(f"SplitBackward needs the stages a rank holds as a dict "
                             f"{{stage: torch.nn.Module}}, such as {{0: stage}}, got "
                             f"{type(modules).__name__}")
        self._noted: list | None = None
        self._handles = [sub.register_forward_hook(self._note)
                         for module in modules.values() for sub in weight_modules(module)]

    def _note(self, module, args, output):
        if self._noted is None:
            return
        if not isinstance(output, torch.Tensor):
            raise ValueError(f"{type(module).__name__} returns {type(output).__name__}, not a "
                             f"tensor: the split backward needs each weight module's output")
        if any(m is module for m, _ in self._noted):
            raise ValueError(f"{type(module).__name__} runs twice in one forward: its weights "
                             f"are used twice, which the split backward (I then W) does not "
                             f"cover; run this stage with full backwards (B)")
        self._noted.append((module, output))

    def forward(self, module: torch.nn.Module, inp: torch.Tensor):
        """``module(inp)`` and the list of (weight module, its output) it made."""
        self._noted = []
        try:
            return module(inp), self._noted
        finally:
            self._noted = None

    @staticmethod
    def input_gradient(inp: torch.Tensor, out: torch.Tensor, grad, noted: list):
        """I: ``dL/d inp`` (None on stage 0) and what W will need (the y's and ``dL/dy``'s)."""
        wanted = ([inp] if inp.requires_grad else []) + [y for _, y in noted]
        if not wanted:  # stage 0 without weights: nothing to compute
            return None, []
        grads = torch.autograd.grad(out, wanted, grad, retain_graph=True, allow_unused=True)
        input_grad = grads[0] if inp.requires_grad else None
        kept = [(module, y, g) for (module, y), g in zip(noted, grads[len(grads) - len(noted):])
                if g is not None]
        return input_grad, kept

    @staticmethod
    def weight_gradient(kept: list) -> None:
        """W: each weight module's gradients from its output's, added into ``.grad``."""
        for module, y, g in kept:
            torch.autograd.backward(y, g, inputs=list(module.parameters(recurse=False)),
                                    retain_graph=True)

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def program_steps(prog: Program) -> tuple[Schedule, list[list[StageTransfer]]]:
    """``prog`` as the executor's time steps, and the transfers of each step in one order.

    The event-driven simulator (:func:`parlab.pipeline.timeline`, which also checks the
    program) times it with F = B = W = 1 and free transfers; each distinct start time
    becomes a step, so every rank runs its actions in the order the simulator does
    (:meth:`Timeline.order`). An action's result that another rank needs travels in the
    communication phase of its step and is used in a later step (it starts after that
    action ends); a W sends nothing; a stage next to it on the same rank (the tip of the V)
    takes it without a transfer. DualPipeV's overlapped pairs run as their two passes, one
    after the other.
    """
    t = timeline(prog, Durations(1, 1, 1))
    starts = sorted({e.start for e in t.entries})
    step_of = {start: n for n, start in enumerate(starts)}
    order = {r: [None] * len(starts) for r in range(prog.stages)}
    transfers: list[list[StageTransfer]] = [[] for _ in starts]
    K = prog.virtual_stages
    for e in t.entries:  # by start, then rank and lane: the same order on every rank
        n, a = step_of[e.start], e.action
        held = order[e.rank][n]
        order[e.rank][n] = str(a) if held is None else (*((held,) if isinstance(held, str)
                                                          else held), str(a))
        target = a.stage + 1 if a.kind == "F" else a.stage - 1
        if a.kind != "W" and 0 <= target < K and prog.rank_of(target) != e.rank:
            transfers[n].append(StageTransfer(n + 1, "y" if a.kind == "F" else "E",
                                              a.microbatch, e.rank, prog.rank_of(target),
                                              a.stage, target))
    sched = Schedule(prog.name, prog.stages, prog.microbatches, prog.chunks, order,
                     prog.slot_size, prog.placement)
    return sched, transfers
