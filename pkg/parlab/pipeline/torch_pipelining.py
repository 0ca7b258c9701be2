"""PyTorch's own pipeline (``torch.distributed.pipelining``) beside our executor.

:func:`torch_pipelining` runs chapter 03's network with ``PipelineStage`` and
``ScheduleGPipe`` or ``Schedule1F1B`` on gloo, so the gradients of our executor can be
compared with PyTorch's, and our action order with the ``pipeline_order`` PyTorch builds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import torch.distributed as dist

from parlab.pipeline.executor import Network, stage_layers
from parlab.checks import check_count
from parlab.models import max_difference
from parlab.pipeline.schedules import Schedule, entry_actions

__all__ = ["TorchRun", "torch_pipelining", "our_action_order", "torch_action_order",
           "TORCH_SCHEDULES"]

#: Our schedule names -> the name ``torch.distributed.pipelining`` gives the same schedule.
TORCH_SCHEDULES = {"gpipe": "GPipe", "zbv": "ZBVZeroBubble", "dualpipev": "DualPipeV"}

_COMPUTE = re.compile(r"^\d+[FB]\d+$")


def _torch_worker(kinds: tuple, net: Network, microbatches: int):
    # importing torch.distributed.pipelining takes seconds per rank: one launch runs every kind
    from torch.distributed import pipelining

    rank, p = dist.get_rank(), dist.get_world_size()
    results = {}
    for kind in kinds:
        layers = net.build()
        module = torch.nn.Sequential(*(layers[j] for j in stage_layers(net, p, rank)))
        stage = pipelining.PipelineStage(module, rank, p, torch.device("cpu"))
        schedule_class = {"gpipe": pipelining.ScheduleGPipe, "1f1b": pipelining.Schedule1F1B}[kind]
        # mean over a micro-batch's samples; PyTorch then divides the gradients by the number
        # of micro-batches (scale_grads=True), which gives the mean over the whole batch
        per_microbatch = lambda out, target: ((out - target) ** 2).sum() / out.shape[0]
        schedule = schedule_class(stage, n_microbatches=microbatches, loss_fn=per_microbatch)
        x, target = net.batch()
        losses: list = []
        if p == 1:
            schedule.step(x, target=target, losses=losses)
        elif rank == 0:
            schedule.step(x)
        elif rank == p - 1:
            schedule.step(target=target, losses=losses)
        else:
            schedule.step()
        order = getattr(schedule, "pipeline_order", None) or {}
        results[kind] = {
            "grads": {j: (layers[j][0].weight.grad.clone(), layers[j][0].bias.grad.clone())
                      for j in stage_layers(net, p, rank)},
            "actions": [str(a) for a in order.get(rank, [])
                        if a is not None and _COMPUTE.match(str(a))],
            "loss": float(sum(l.detach() for l in losses) / microbatches) if losses else None,
        }
    return results


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
                     net: Network | None = None, timeout: float = 120) -> dict:
    """Run torch's ``ScheduleGPipe`` ("gpipe") and/or ``Schedule1F1B`` ("1f1b") on ``stages``
    gloo ranks over the chapter's network; returns {kind: TorchRun}."""
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    check_count("stages", stages, "pipeline stages, one rank each")
    check_count("microbatches", microbatches, "micro-batches per batch")
    for kind in kinds:
        if kind not in ("gpipe", "1f1b"):
            raise ValueError(f"kinds must be 'gpipe' and/or '1f1b' (torch's ScheduleGPipe and "
                             f"Schedule1F1B), got {kind!r}")
    if "1f1b" in kinds and microbatches < stages:
        raise ValueError(f"torch's Schedule1F1B needs microbatches >= stages, got "
                         f"microbatches={microbatches} for stages={stages}")
    net = net or Network()
    stage_layers(net, stages, 0)
    if net.samples % microbatches:
        raise ValueError(f"{net.samples} samples do not split into {microbatches} micro-batches")
    from parlab.launch import run
    results = run(_torch_worker, stages, kinds, net, microbatches, backend="gloo",
                  timeout=timeout)
    return {kind: TorchRun(kind, stages, microbatches,
                           {j: g for r in results for j, g in r[kind]["grads"].items()},
                           {rank: r[kind]["actions"] for rank, r in enumerate(results)},
                           results[-1][kind]["loss"])
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
    out = {}
    for rank, row in enumerate(ops):
        out[rank] = [tuple(str(a) for a in op.sub_actions) if op.sub_actions else str(op)
                     for op in row if op is not None and op.is_compute_op]
    return out
