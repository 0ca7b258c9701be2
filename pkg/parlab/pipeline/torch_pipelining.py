"""PyTorch's own pipeline (``torch.distributed.pipelining``) beside our executor.

:func:`torch_pipelining` runs chapter 03's network with ``PipelineStage`` and
``ScheduleGPipe`` or ``Schedule1F1B`` on gloo, so the gradients of our executor can be
compared with PyTorch's, and our action order with the ``pipeline_order`` PyTorch builds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from parlab.pipeline.executor import Network, stage_layers
from parlab.checks import check_count
from parlab.models import max_difference
from parlab.pipeline.schedules import Schedule, entry_actions, stage_rank
from parlab.pipeline.zero_bubble import v_stages

__all__ = ["TorchRun", "torch_pipelining", "our_action_order", "torch_action_order",
           "TORCH_SCHEDULES", "V_SCHEDULES_NEED_TORCH"]

#: Our schedule names -> the name ``torch.distributed.pipelining`` gives the same schedule.
TORCH_SCHEDULES = {"gpipe": "GPipe", "zbv": "ZBVZeroBubble", "dualpipev": "DualPipeV"}

#: The kinds that hold two stages per rank in a V.
_V_KINDS = ("zbv", "dualpipev")
#: The torch that runs PyTorch's V schedules on gloo: torch 2.11's stage warm-up sends a tensor
#: from a rank to itself where the V puts two adjacent stages on one rank, and gloo refuses
#: that ("Pair is not connected"); torch 2.13 warms up by another protocol (2.12 not checked).
V_SCHEDULES_NEED_TORCH = "2.13"
_CLASSES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "zbv": "ScheduleZBVZeroBubble",
            "dualpipev": "ScheduleDualPipeV"}


def _torch_worker(kinds: tuple, net: Network, microbatches: int, dtype=torch.float32):
    # importing torch.distributed.pipelining takes seconds per rank: one launch runs every kind
    from torch.distributed import pipelining

    rank, p = dist.get_rank(), dist.get_world_size()
    results = {}
    for kind in kinds:
        placement = "v" if kind in _V_KINDS else "loop"
        K = 2 * p if placement == "v" else p
        held = v_stages(rank, p) if placement == "v" else (rank,)
        layers = [layer.to(dtype) for layer in net.build()]
        stages = [pipelining.PipelineStage(
            torch.nn.Sequential(*(layers[j] for j in stage_layers(net, K, k))), k, K,
            torch.device("cpu")) for k in held]
        # mean over a micro-batch's samples; PyTorch then divides the gradients by the number
        # of micro-batches (scale_grads=True), which gives the mean over the whole batch
        per_microbatch = lambda out, target: ((out - target) ** 2).sum() / out.shape[0]
        schedule = getattr(pipelining, _CLASSES[kind])(
            stages if placement == "v" else stages[0], n_microbatches=microbatches,
            loss_fn=per_microbatch)
        x, target = (t.to(dtype) for t in net.batch())
        losses: list = []
        first, last = stage_rank(0, p, placement) == rank, stage_rank(K - 1, p, placement) == rank
        schedule.step(*((x,) if first else ()),
                      **({"target": target, "losses": losses} if last else {}))
        order = getattr(schedule, "pipeline_order", None) or {}
        results[kind] = {
            "grads": {j: (layers[j][0].weight.grad.clone(), layers[j][0].bias.grad.clone())
                      for k in held for j in stage_layers(net, K, k)},
            "actions": _compute_codes(order.get(rank, [])),
            "loss": float(sum(l.detach() for l in losses) / microbatches) if losses else None,
        }
    return results


def _compute_codes(row) -> list:
    """A rank's ``pipeline_order`` row as compute codes ("1F0", "1I0", "1W0"): sends, receives
    and idle slots dropped, an overlapped pair (``OVERLAP_F_B``) as a tuple of its two."""
    return [tuple(str(a) for a in op.sub_actions) if op.sub_actions else str(op)
            for op in row if op is not None and op.is_compute_op]


@dataclass
class TorchRun:
    """PyTorch's pipeline on the chapter's network: gradients and each rank's action order."""

    kind: str
    stages: int
    microbatches: int
    grads: dict
    actions: dict
    loss: float

    def difference(self, execution) -> float:
        """Largest ``|PyTorch gradient - our executor's gradient|`` (an :class:`Execution`)."""
        return max_difference(self.grads, execution.grads)

    def forward_microbatches(self, rank: int) -> list:
        """The micro-batch numbers (from 0) of the forward passes in ``rank``'s plan."""
        if rank not in self.actions:
            raise ValueError(f"rank must be one of {sorted(self.actions)}, got {rank!r}")
        return sorted({int(a[a.index("F") + 1:]) for a in self.actions[rank] if "F" in a})


def torch_pipelining(kinds=("gpipe", "1f1b"), stages: int = 4, microbatches: int = 4,
                     net: Network | None = None, timeout: float = 120,
                     dtype: torch.dtype = torch.float32) -> dict:
    """Run torch's ``ScheduleGPipe`` ("gpipe"), ``Schedule1F1B`` ("1f1b"),
    ``ScheduleZBVZeroBubble`` ("zbv") and/or ``ScheduleDualPipeV`` ("dualpipev") on
    ``stages`` gloo ranks over the chapter's network in ``dtype``; returns {kind: TorchRun}.

    ``stages`` counts ranks: the V schedules cut the network into 2 x ``stages`` stages."""
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    check_count("stages", stages, "pipeline ranks")
    check_count("microbatches", microbatches, "micro-batches per batch")
    for kind in kinds:
        if kind not in _CLASSES:
            raise ValueError(f"kinds must be among {list(_CLASSES)} (torch's "
                             f"{', '.join(_CLASSES.values())}), got {kind!r}")
    if "1f1b" in kinds and microbatches < stages:
        raise ValueError(f"torch's Schedule1F1B needs microbatches >= stages, got "
                         f"microbatches={microbatches} for stages={stages}")
    if "dualpipev" in kinds and microbatches < 2 * stages:
        raise ValueError(f"torch's ScheduleDualPipeV needs microbatches >= 2 x ranks = "
                         f"{2 * stages}, got microbatches={microbatches}")
    v_kinds = [kind for kind in kinds if kind in _V_KINDS]
    if v_kinds and torch.__version__ < V_SCHEDULES_NEED_TORCH:
        raise RuntimeError(f"PyTorch's {' and '.join(_CLASSES[k] for k in v_kinds)} on gloo "
                           f"need torch {V_SCHEDULES_NEED_TORCH} or later (requirements.txt's); "
                           f"torch {torch.__version__}'s stages send a tensor from a rank to "
                           f"itself as they start, which gloo refuses")
    net = net or Network()
    for kind in kinds:
        stage_layers(net, 2 * stages if kind in _V_KINDS else stages, 0)
    if net.samples % microbatches:
        raise ValueError(f"{net.samples} samples do not split into {microbatches} micro-batches")
    from parlab.launch import run
    results = run(_torch_worker, stages, kinds, net, microbatches, dtype, backend="gloo",
                  timeout=timeout)
    return {kind: TorchRun(kind, stages, microbatches,
                           {j: g for r in results for j, g in r[kind]["grads"].items()},
                           {rank: r[kind]["actions"] for rank, r in enumerate(results)},
                           next(r[kind]["loss"] for r in results if r[kind]["loss"] is not None))
            for kind in kinds}


def our_action_order(sched: Schedule) -> dict:
    """Each rank's actions in the order it runs them (idle steps dropped), as strings."""
    return {rank: [str(a) for e in row for a in entry_actions(e)]
            for rank, row in sched.pipeline_order.items()}


def torch_action_order(name: str, stages: int, microbatches: int) -> dict:
    """PyTorch's per-rank compute order for our schedule ``name``, built without ranks.

    PyTorch's own ``_schedule_visualizer.get_schedule_ops`` builds the schedule class on
    stand-in stages, so its ``pipeline_order`` comes out in one process. Idle slots are
    dropped; an overlapped pair (``OVERLAP_F_B``) becomes a tuple (forward, backward), as
    :func:`parlab.pipeline.zero_bubble.dualpipe_v` writes it.
    """
    if name not in TORCH_SCHEDULES:
        raise ValueError(f"PyTorch has no schedule for {name!r} to compare with; choose one of "
                         f"{sorted(TORCH_SCHEDULES)} (1F1B's pipeline_order is compared on real "
                         f"ranks by torch_pipelining)")
    check_count("stages", stages, "pipeline ranks")
    check_count("microbatches", microbatches, "micro-batches per batch")
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    ops = get_schedule_ops(TORCH_SCHEDULES[name], stages, microbatches)
    return {rank: _compute_codes(row) for rank, row in enumerate(ops)}
