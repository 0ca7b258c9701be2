"""Any ``torch.nn.Module``: the estimate of its training step, per GPU, as for a config.

Why this module exists: the calculator's formulas (:mod:`parlab.memory.calculator`) know two
families, our GPT configs and the book's MLP. For any other network (a CNN, an LSTM, a
Llama-style block) :func:`parlab.memory.estimate` checks the job here
(:func:`module_setup`), traces one micro-batch's step with fake tensors
(:func:`parlab.memory.tracing.trace_module`: nothing is allocated, so a model built on the
meta device works) and prices it here (:func:`estimate_module`): the model states of the
busiest pipeline stage from :func:`parlab.memory.model_state_bytes`, its activations times
the micro-batches in flight on it.

A :class:`~parlab.models.MoE` layer traced without values has no routing to follow: its
experts run on the rows of an even load (:func:`parlab.models.even_rows`). Without a
capacity that saves exactly what any routing saves (every assignment is computed somewhere);
with one, it is an upper bound (a real routing may drop more). ``ep`` (expert parallelism)
divides the experts' parameters over ``ep`` of the ``dp`` GPUs; with an even load a rank's
experts see as many rows as its own tokens made, so the activations do not change.

Pipeline stages are contiguous runs of the top-level children
(:func:`parlab.memory.tracing.module_children`), balanced by parameter count or cut at
``split_points``. Tensor parallelism and selective recompute are modelled for transformer
configs only. :func:`module_pricer` prices many splits of one module from one trace per
micro-batch size, for :func:`parlab.memory.min_gpus`.
"""

from __future__ import annotations

import torch
from torch import nn

from parlab.checks import check_count
from parlab.memory.breakdown import Breakdown, describe_setup, Setup
from parlab.memory.states import check_split, model_state_bytes, ModelStates
from parlab.memory.tracing import InputSpec, module_children, trace_module
from parlab.models import expert_parameters, MoE

__all__ = ["module_setup", "stage_ranges", "estimate_module", "module_pricer"]


def _inputs(input_shape, example_input) -> tuple[InputSpec, ...]:
    if (input_shape is None) == (example_input is None):
        raise ValueError("give a module's input as exactly one of input_shape (the global "
                         "batch's shape, for one float input, e.g. (48, 300)) or example_input "
                         "(a tensor or a tuple of tensors whose first dimension is the batch), "
                         f"got input_shape={input_shape!r} and example_input of type "
                         f"{type(example_input).__name__}")
    if example_input is not None:
        tensors = (example_input,) if isinstance(example_input, torch.Tensor) else example_input
        if not isinstance(tensors, (tuple, list)) or not tensors \
                or not all(isinstance(t, torch.Tensor) for t in tensors):
            kinds = [type(t).__name__ for t in tensors] if isinstance(tensors, (tuple, list)) \
                else type(tensors).__name__
            raise TypeError(f"example_input must be a tensor or a tuple of tensors, got {kinds}")
        shapes = [tuple(t.shape) for t in tensors]
        if any(not shape for shape in shapes) or len({shape[0] for shape in shapes}) != 1:
            raise ValueError(f"the first dimension of every example_input tensor is the batch, "
                             f"the same for all; got shapes {shapes}")
        return tuple(InputSpec(tuple(t.shape), t.dtype, t) for t in tensors)
    shape = (input_shape,) if isinstance(input_shape, int) else input_shape
    if not isinstance(shape, (tuple, list)) or not shape or any(
            isinstance(n, bool) or not isinstance(n, int) or n <= 0 for n in shape):
        raise ValueError(f"input_shape must be the global batch as a tuple of positive ints, "
                         f"(batch, features...) for a module, got {input_shape!r}")
    return (InputSpec(tuple(shape), None),)


def _split_points(model: nn.Module, pp: int, split_points) -> tuple[int, ...] | None:
    n = len(module_children(model))
    if pp > n:
        raise ValueError(f"pp={pp} stages for the {n} top-level children of "
                         f"{type(model).__name__}: at most one stage per child")
    if split_points is None:
        return None
    points = tuple(split_points) if isinstance(split_points, (tuple, list)) else None
    if points is None or any(isinstance(i, bool) or not isinstance(i, int) for i in points) \
            or list(points) != sorted(set(points)) or (points and not 0 < points[0]) \
            or (points and not points[-1] < n):
        raise ValueError(f"split_points must be increasing child indices in 1..{n - 1} (stage "
                         f"k starts at child split_points[k-1]), got {split_points!r}")
    if len(points) != pp - 1:
        raise ValueError(f"split_points={list(points)} cut {len(points) + 1} stages but pp={pp}")
    return points


def _check_ep(model: nn.Module, ep, dp: int) -> None:
    check_count("ep", ep, "expert-parallel GPUs")
    if ep == 1:
        return
    layers = [m for m in model.modules() if isinstance(m, MoE)]
    if not layers:
        raise ValueError(f"ep={ep}: {type(model).__name__} has no MoE layer whose experts "
                         f"could be divided; use ep=1")
    for layer in layers:
        if layer.config.n_experts % ep:
            raise ValueError(f"ep={ep} does not divide n_experts={layer.config.n_experts}; "
                             f"valid ep divide the number of experts")
    if dp % ep:
        raise ValueError(f"ep={ep} must divide dp={dp}: expert parallelism splits the experts "
                         f"over data-parallel GPUs")


def module_setup(model, input_shape, example_input, precision, optimizer, dp, tp, pp,
                 microbatches, schedule, capacity, zero, recompute, loss_fn,
                 split_points, ep=1) -> Setup:
    """Check a module's job (the other arguments are already checked by ``resolve_setup``)."""
    _check_ep(model, ep, dp)
    inputs = _inputs(input_shape, example_input)
    batch = inputs[0].shape[0]
    check_split(batch, dp, tp, pp, microbatches)
    if tp != 1:
        raise ValueError(f"tensor parallelism is modelled for transformer configs; use tp=1 "
                         f"for a torch.nn.Module ({type(model).__name__})")
    if recompute == "selective":
        raise ValueError("selective recompute (of the attention core) is modelled for "
                         "transformer configs; use recompute=None or 'full' for a torch.nn.Module")
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable as loss_fn(output, *inputs), got {loss_fn!r}")
    points = _split_points(model, pp, split_points)
    return Setup(model, batch, 1, precision, optimizer, dp, tp, pp, microbatches, schedule,
                 capacity, zero, recompute, inputs, loss_fn, points, ep)


# --- the estimate ----------------------------------------------------------------------------

def _balanced(counts: list[int], pp: int) -> tuple[int, ...]:
    """Cut points of ``counts`` into ``pp`` contiguous parts whose largest sum is smallest
    (on a tie the later cut: a child without parameters stays with the one before it)."""
    n, prefix = len(counts), [0]
    for c in counts:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(pp + 1)]
    cut = [[0] * (n + 1) for _ in range(pp + 1)]
    best[0][0] = 0
    for k in range(1, pp + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                v = max(best[k - 1][j], prefix[i] - prefix[j])
                if v <= best[k][i]:
                    best[k][i], cut[k][i] = v, j
    points, i = [], n
    for k in range(pp, 1, -1):
        i = cut[k][i]
        points.append(i)
    return tuple(reversed(points))


def stage_ranges(model: nn.Module, pp: int, split_points=None) -> list[range]:
    """The child indices of each of ``pp`` pipeline stages: cut at ``split_points``, else
    balanced by parameter count (:func:`module_children` lists the children)."""
    children = module_children(model)
    if split_points is None:
        check_count("pp", pp, "pipeline stages")
        if pp > len(children):
            raise ValueError(f"pp={pp} stages for {len(children)} children of the model: at "
                             f"most one stage per child")
        counts = [sum(p.numel() for p in c.parameters()) for _, c in children]
        split_points = _balanced(counts, pp)
    bounds = [0, *split_points, len(children)]
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


def _stage_parameters(model: nn.Module, stage: range, first: bool, ep: int = 1) -> int:
    """Parameters the GPU of a stage holds: its children's (shared ones once), and on the first
    stage those that the model holds outside every child; experts divided by ``ep``."""
    children = [c for _, c in module_children(model)]
    held = {id(p): p.numel() for i in stage for p in children[i].parameters()}
    if first:
        inside = {id(p) for c in children for p in c.parameters()}
        held |= {id(p): p.numel() for p in model.parameters() if id(p) not in inside}
    experts = expert_parameters(model) if ep > 1 else set()
    return sum(n // ep if key in experts else n for key, n in held.items())


def estimate_module(s: Setup, label: str) -> Breakdown:
    """The busiest pipeline stage of a module's job ``s`` (from
    :func:`parlab.memory.setup.resolve_setup`), traced once for one micro-batch.

    What :func:`parlab.memory.estimate` takes for a module: ``input_shape`` (one float input of
    that shape) or ``example_input`` (a tensor or a tuple of tensors; only shapes and dtypes
    are used), the first dimension being the global batch, so each micro-batch has
    batch / (dp x microbatches) rows; floating inputs run in the compute dtype.
    ``loss_fn(output, *inputs)`` replaces :func:`parlab.memory.tracing.default_loss`
    (``output.float().square().mean()``). ``split_points``: the child indices where pipeline
    stages 1, 2, ... begin (default: balanced by parameter count, :func:`stage_ranges`).

    Each stage holds the model states of its parameters
    (:func:`parlab.memory.model_state_bytes`, sharded by ``zero``; every parameter counts as
    trained; buffers are not counted) and, per micro-batch in flight on it (as for a config:
    1F1B min(pp - k, m), GPipe m, ZB-H1 min(pp, m)), what its children saved; with
    ``recompute="full"``, each child's input per micro-batch and one child rebuilt. The label
    ends with ", stage k".
    """
    trace = trace_module(s.model, s.inputs, s.micro_batch, s.precision.dtype, s.loss_fn)
    return _price(s, trace, label)


def _in_order(trace) -> bool:
    return trace.order == sorted(trace.order)


def _price(s: Setup, trace, label: str) -> Breakdown:
    """The busiest stage of job ``s``, from the ``trace`` of one of its micro-batches."""
    model = s.model
    if s.pp > 1 and not _in_order(trace):
        names = [module_children(model)[i][0] for i in trace.order]
        raise ValueError(f"pp cuts the top-level children in the order they are registered, "
                         f"but {type(model).__name__} runs them in the order {names}")
    best = None
    for k, stage in enumerate(stage_ranges(model, s.pp, s.split_points)):
        n = _stage_parameters(model, stage, k == 0, s.ep)
        states = model_state_bytes(n, s.optimizer, s.precision.name, s.dp, s.zero) if n \
            else ModelStates(0, 0, 0, 0)
        kept, rebuilt = trace.stage_activations(stage, s.recompute)
        b = Breakdown(**states.parts(), activations=s.in_flight(k) * kept + rebuilt,
                      capacity=s.capacity, label=label + (f", stage {k}" if s.pp > 1 else ""))
        best = b if best is None or b.total > best.total else best
    return best


def module_pricer(s: Setup, what: str):
    """``price(dp, pp)``: the busiest GPU's :class:`Breakdown` for job ``s`` split over ``dp``
    replicas and ``pp`` balanced stages (None when the children do not run in the order a
    pipeline needs), labelled ``what``; one trace per micro-batch size, however many splits
    are priced (for :func:`parlab.memory.min_gpus`)."""
    traces = {}

    def price(dp: int, pp: int) -> Breakdown | None:
        job = s._replace(dp=dp, pp=pp, split_points=None)
        if job.micro_batch not in traces:
            traces[job.micro_batch] = trace_module(job.model, job.inputs, job.micro_batch,
                                                   job.precision.dtype, job.loss_fn)
        trace = traces[job.micro_batch]
        if pp > 1 and not _in_order(trace):
            return None
        return _price(job, trace, describe_setup(job, what))

    return price
