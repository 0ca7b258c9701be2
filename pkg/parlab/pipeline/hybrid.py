"""Pipeline + data parallelism (Figure 8-14), and the production API beside our executor.

Figure 8-14: when one pipeline is not enough, the pipeline is replicated. With 4 stages on
8 GPUs, replica 1 runs on A1, A2, B1, B2 (the names of the single pipeline) and replica 2 on
C1, C2, D1, D2; each gets its share of the batch and runs the same schedule on it. After the
last backward, each stage's gradients are synchronized between the GPUs that hold that stage
(A1 with C1, A2 with C2, B1 with D1, B2 with D2): one
all-reduce sums them across the replicas, and every GPU divides the sum by the number of
replicas, so every copy of a layer takes the same step. :func:`pipeline_data_parallel`
runs this on real ranks (a data-parallel group per stage, made with ``dist.new_group``)
and compares it with one process training on the whole batch; :meth:`HybridRun.sync_pairs`
gives one weight per stage on every GPU, before and after the sync.

:func:`torch_pipelining` runs the same network with ``torch.distributed.pipelining``
(``PipelineStage`` with ``ScheduleGPipe`` or ``Schedule1F1B``) on gloo, so the gradients of
our hand-written executor can be compared with PyTorch's, and our action order with the
``pipeline_order`` PyTorch builds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.distributed as dist

from parlab.comm import Mesh
from parlab.launch import rank_device
from parlab.pipeline.executor import Network, max_difference, reference, run_stages, stage_layers
from parlab.pipeline.schedules import Schedule, _check_count, entry_actions
from parlab.pipeline.simulator import simulate, stage_gpu_name

__all__ = ["HybridRun", "SyncPair", "SYNC_FORMAT", "pipeline_data_parallel", "hybrid_name",
           "TorchRun", "torch_pipelining", "our_action_order"]

#: How :meth:`HybridRun.sync_table` and the sync figure print a gradient: 5 significant
#: digits, enough that each average visibly is (replica 1 + replica 2) / 2.
SYNC_FORMAT = "+.4e"


def hybrid_name(replica: int, stage: int, stages: int) -> str:
    """GPU names of Figure 8-14, two GPUs per server as in the single pipeline.

    Replica 1 keeps the single pipeline's names (A1, A2, B1, B2 for 4 stages); each further
    replica starts on fresh servers, so with 4 stages replica 2 is C1, C2, D1, D2. The book
    names only A1/C1 and A2/C2 (hidden layers 1 and 2); the rest continues its pattern, and a
    stage sits in the same position in every replica.
    """
    for name, value in (("replica", replica), ("stage", stage), ("stages", stages)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    if stage >= stages:
        raise ValueError(f"stage must be 0 to {stages - 1} for {stages} stages, got {stage}")
    return stage_gpu_name(replica * 2 * ((stages + 1) // 2) + stage)


class SyncPair(NamedTuple):
    """One stage's gradient sync, seen through one weight of its first layer.

    ``gpus`` hold the stage (one per replica); ``local`` is that weight's gradient on each
    before the sync; ``summed`` what the all-reduce leaves on every one of them;
    ``averaged`` the sum divided by the number of replicas; ``single`` the same weight's
    gradient in one process trained on the whole batch.
    """

    stage: int
    layers: tuple
    label: str
    gpus: tuple
    local: tuple
    summed: float
    averaged: float
    single: float


def _hybrid_worker(sched: Schedule, net: Network, replicas: int, by_step):
    p = sched.stages
    mesh = Mesh(dp=replicas, pp=p)
    replica, me, _ = mesh.coordinates(dist.get_rank())
    data_group = mesh.new_groups(kinds=("data",))["data"]  # this stage's copies
    group = sorted(dist.get_process_group_ranks(data_group))
    x, target = net.batch()
    peers = [mesh.rank_at(replica, s) for s in range(p)]
    result = run_stages(sched, net, me, peers, x.chunk(replicas)[replica],
                        target.chunk(replicas)[replica], by_step)
    local, summed, averaged = {}, {}, {}
    unflat = lambda flat, dw: (flat[:dw.numel()].view_as(dw).cpu(), flat[dw.numel():].cpu())
    for j, (dw, db) in result["grads"].items():
        flat = torch.cat([dw.flatten(), db]).to(rank_device())
        local[j] = (dw, db)
        dist.all_reduce(flat, group=data_group)  # sum over the replicas, shared with each
        summed[j] = unflat(flat.clone(), dw)
        flat /= replicas  # every GPU divides by the number of replicas: the average
        averaged[j] = unflat(flat, dw)
    return {"events": result["events"], "local": local, "summed": summed,
            "averaged": averaged, "loss": result["loss"], "group": group}


@dataclass
class HybridRun:
    """Figure 8-14 on ``stages * replicas`` ranks. ``ranks[g]`` is global rank g's result:
    its gradients before the sync (``local``), after the sum, and after the division."""

    schedule: Schedule
    replicas: int
    ranks: list
    names: list
    reference_grads: dict
    reference_loss: float
    net: Network | None = None  # the network and batch every replica took its share of

    @property
    def grads(self) -> dict:
        """The synchronized gradients of every layer, as replica 1 holds them."""
        return {j: g for r in self.ranks[:self.schedule.stages] for j, g in r["averaged"].items()}

    @property
    def replicas_agree(self) -> bool:
        """Do all copies of each layer hold exactly the same gradients after the sync?"""
        p = self.schedule.stages
        return all(max_difference(self.ranks[g]["averaged"], self.ranks[g % p]["averaged"]) == 0
                   for g in range(len(self.ranks)))

    @property
    def max_grad_error(self) -> float:
        return max_difference(self.grads, self.reference_grads)

    @property
    def sync_groups(self) -> list:
        """The all-reduce groups the ranks really used, by GPU name: one per stage."""
        groups = []
        for rank in self.ranks:
            names = tuple(self.names[g] for g in rank["group"])
            if names not in groups:
                groups.append(names)
        return groups

    def _layer_label(self, layers) -> str:
        if len(layers) > 1:
            return "layers " + ", ".join(str(j + 1) for j in layers)
        return ("output layer" if layers[0] == len(self.reference_grads) - 1
                else f"hidden layer {layers[0] + 1}")

    def sync_pairs(self, index: tuple = (0, 0)) -> list:
        """One :class:`SyncPair` per stage: weight ``index`` (row, column) of the stage's
        first layer."""
        p, pairs = self.schedule.stages, []
        shapes = [tuple(self.reference_grads[min(r["local"])][0].shape) for r in self.ranks[:p]]
        rows, cols = min(s[0] for s in shapes), min(s[1] for s in shapes)
        if (not isinstance(index, tuple) or len(index) != 2
                or not all(isinstance(i, int) and not isinstance(i, bool) for i in index)
                or not (0 <= index[0] < rows and 0 <= index[1] < cols)):
            raise ValueError(f"index must be a weight (row, column) that every stage's first "
                             f"layer has: rows 0..{rows - 1}, columns 0..{cols - 1}; got {index!r}")
        for stage in range(p):
            holders = [replica * p + stage for replica in range(self.replicas)]
            layers = tuple(sorted(self.ranks[stage]["local"]))
            value = lambda g, key: float(self.ranks[g][key][layers[0]][0][index])
            pairs.append(SyncPair(
                stage, layers, self._layer_label(layers), tuple(self.names[g] for g in holders),
                tuple(value(g, "local") for g in holders), value(stage, "summed"),
                value(stage, "averaged"), float(self.reference_grads[layers[0]][0][index])))
        return pairs

    def sync_table(self, index: tuple = (0, 0)) -> str:
        """Per stage, weight ``index`` on each of its GPUs: local, summed, averaged; and the
        same weight in one process on the whole batch. Printed with :data:`SYNC_FORMAT`."""
        pairs, n, f = self.sync_pairs(index), self.replicas, SYNC_FORMAT
        width = max(len(x.label) for x in pairs)
        gpus = max(len(" + ".join(x.gpus)) for x in pairs)
        head = (["stage", "layer".ljust(width), "GPUs".ljust(gpus)]
                + [f"replica {r + 1}".ljust(11) for r in range(n)]
                + ["sum".ljust(11), f"sum / {n}".ljust(11), "one process"])
        lines = [f"weight {list(index)} of each stage's layer, gradient on each GPU "
                 f"(each replica trains on 1/{n} of the batch)", "  ".join(head)]
        for x in pairs:
            lines.append("  ".join(
                [f"{x.stage + 1:<5}", x.label.ljust(width), " + ".join(x.gpus).ljust(gpus)]
                + [format(v, f) for v in x.local]
                + [format(x.summed, f), format(x.averaged, f), format(x.single, f)]))
        return "\n".join(lines)

    def report(self) -> str:
        return (f"{self.replicas} replicas x {self.schedule.stages} stages on "
                f"{len(self.ranks)} ranks ({self.schedule.name} schedule): replicas agree "
                f"{self.replicas_agree}; equal to single-process training (|diff| < 1e-6): "
                f"{self.max_grad_error < 1e-6}")


def pipeline_data_parallel(sched: Schedule, replicas: int = 2, net: Network | None = None,
                           backend: str | None = "gloo", timeout: float = 60) -> HybridRun:
    """Run ``replicas`` copies of the pipeline ``sched``, each on its share of the batch,
    then synchronize each layer's gradients across its copies (Figure 8-14)."""
    net = net or Network()
    _check_count("replicas", replicas, "copies of the pipeline")
    if net.samples % (replicas * sched.microbatches):
        raise ValueError(f"{net.samples} samples do not split into {replicas} replicas x "
                         f"{sched.microbatches} micro-batches; use a multiple of "
                         f"{replicas * sched.microbatches}")
    stage_layers(net, sched.virtual_stages, 0)
    by_step = [rec.transfers for rec in simulate(sched).records]
    from parlab.launch import run
    ranks = run(_hybrid_worker, sched.stages * replicas, sched, net, replicas, by_step,
                backend=backend, timeout=timeout)
    names = [hybrid_name(g // sched.stages, g % sched.stages, sched.stages)
             for g in range(len(ranks))]
    ref_grads, ref_loss = reference(net)
    return HybridRun(sched, replicas, ranks, names, ref_grads, ref_loss, net)


# ---------------------------------------------------------------- torch.distributed.pipelining

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
        """Largest |PyTorch gradient - our executor's gradient| (an :class:`Execution`)."""
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
    _check_count("stages", stages, "pipeline stages, one rank each")
    _check_count("microbatches", microbatches, "micro-batches per batch")
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
