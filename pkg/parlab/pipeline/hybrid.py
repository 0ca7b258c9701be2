"""Pipeline + data parallelism (Figure 8-14), and the production API beside our executor.

Figure 8-14: when one pipeline is not enough, the pipeline is replicated. Replica 1 runs
on A1, A2, ... and replica 2 on C1, C2, ...; each gets half of the batch and runs the same
schedule on it. After the last backward, each layer's gradients are synchronized
between the GPUs that hold that layer (A1 with C1, A2 with C2, ...): summed across the
replicas, divided by the number of replicas, and shared, so every copy of a layer takes
the same step. :func:`pipeline_data_parallel` runs this on real ranks (a data-parallel
group per stage, made with ``dist.new_group``) and compares it with one process
training on the whole batch.

:func:`torch_pipelining` runs the same network with ``torch.distributed.pipelining``
(``PipelineStage`` with ``ScheduleGPipe`` or ``Schedule1F1B``) on gloo, so the gradients of
our hand-written executor can be compared with PyTorch's, and our action order with the
``pipeline_order`` PyTorch builds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import torch.distributed as dist

from parlab.comm import Mesh
from parlab.launch import rank_device
from parlab.pipeline.executor import Network, max_difference, reference, run_stages, stage_layers
from parlab.pipeline.schedules import Schedule, _check_count, entry_actions
from parlab.pipeline.simulator import simulate

__all__ = ["HybridRun", "pipeline_data_parallel", "hybrid_name", "TorchRun", "torch_pipelining",
           "our_action_order"]


def hybrid_name(replica: int, stage: int, stages: int) -> str:
    """GPU names of Figure 8-14: replica 1 is A1, A2 (B1, B2); replica 2 is C1, C2 (D1, D2)."""
    servers = max(2, -(-stages // 2))
    return f"{chr(ord('A') + replica * servers + stage // 2)}{stage % 2 + 1}"


def _hybrid_worker(sched: Schedule, net: Network, replicas: int, by_step):
    p = sched.stages
    mesh = Mesh(dp=replicas, pp=p)
    replica, me, _ = mesh.coordinates(dist.get_rank())
    data_group = mesh.new_groups(kinds=("data",))["data"]  # this stage's copies
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
            "averaged": averaged, "loss": result["loss"]}


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

    def sync_table(self, layer: int = 0, index: tuple = (0, 0)) -> str:
        """One weight of ``layer`` on every GPU holding it: local, sum, average."""
        p = self.schedule.stages
        holders = [g for g in range(len(self.ranks)) if layer in self.ranks[g]["local"]]
        lines = [f"hidden layer {layer + 1}" if layer < len(self.reference_grads) - 1
                 else "output layer"]
        lines[0] += f", weight {index}: gradient on each GPU that holds it"
        for g in holders:
            value = lambda key: float(self.ranks[g][key][layer][0][index])
            lines.append(f"  {self.names[g]} (replica {g // p + 1}): local {value('local'):+.6f}"
                         f"  sum {value('summed'):+.6f}  / {self.replicas} = "
                         f"{value('averaged'):+.6f}")
        ref = float(self.reference_grads[layer][0][index])
        lines.append(f"  single process on the whole batch: {ref:+.6f}")
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
    return HybridRun(sched, replicas, ranks, names, ref_grads, ref_loss)


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
