"""Pipeline + data parallelism (Figure 8-14), composed from the two strategies.

Figure 8-14: when one pipeline is not enough, the pipeline is replicated. With 4 stages on
8 GPUs, replica 1 runs on A1, A2, B1, B2 (the names of the single pipeline) and replica 2 on
C1, C2, D1, D2; each gets its share of the batch and runs the same schedule on it. After the
last backward, each stage's gradients are synchronized between the GPUs that hold that stage
(A1 with C1, A2 with C2, B1 with D1, B2 with D2): one
all-reduce sums them across the replicas, and every GPU divides the sum by the number of
replicas, so every copy of a layer takes the same step. :func:`pipeline_data_parallel`
runs this on real ranks and compares it with one process training on the whole batch;
:meth:`HybridRun.sync_pairs` gives one weight per stage on every GPU, before and after the
sync.

Nothing here is a second pipeline or a second all-reduce: the ranks form a ``DeviceMesh``
(``dp`` x ``pp``, :meth:`parlab.comm.Mesh.build`), each replica runs chapter 03's executor
(:func:`parlab.pipeline.run_network`) over its ``pp`` sub-mesh, and each stage's copies
average their gradients with chapter 02's :func:`parlab.data_parallel.all_reduce_buckets`
over their ``dp`` sub-mesh.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.distributed as dist

from parlab.comm import Mesh
from parlab.data_parallel import all_reduce_buckets
from parlab.launch import rank_device
from parlab.pipeline import (Network, reference, run_network, Schedule,
                             stage_gpu_name, stage_layers)
from parlab.checks import check_count, check_index
from parlab.models import max_difference

__all__ = ["HybridRun", "SyncPair", "SYNC_FORMAT", "pipeline_data_parallel", "hybrid_name"]

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
        check_index(name, value)
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


def _hybrid_worker(sched: Schedule, net: Network, replicas: int):
    mesh = Mesh(dp=replicas, pp=sched.stages)
    groups = mesh.groups(mesh.build())
    replica = mesh.coordinates(dist.get_rank()).replica
    x, target = net.batch()
    result = run_network(sched, net, x.chunk(replicas)[replica], target.chunk(replicas)[replica],
                         peers=dist.get_process_group_ranks(groups["pipeline"]),
                         group=groups["pipeline"])
    local, summed, averaged = {}, {}, {}
    for j, (dw, db) in result["grads"].items():
        local[j] = (dw, db)
        # one all-reduce per layer, summing its copies (chapter 02's exchange, unbucketed
        # here so the sum can be shown); then every GPU divides by the number of replicas
        pair = [torch.cat([dw.flatten(), db]).to(rank_device())]
        all_reduce_buckets(pair, cap_bytes=None, average=False, group=groups["data"])
        flat = pair[0].cpu()
        summed[j] = (flat[:dw.numel()].view_as(dw).clone(), flat[dw.numel():].clone())
        flat /= replicas
        averaged[j] = (flat[:dw.numel()].view_as(dw), flat[dw.numel():])
    return {"events": result["events"], "local": local, "summed": summed,
            "averaged": averaged, "loss": result["loss"],
            "group": sorted(dist.get_process_group_ranks(groups["data"]))}


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
    check_count("replicas", replicas, "copies of the pipeline")
    if net.samples % (replicas * sched.microbatches):
        raise ValueError(f"{net.samples} samples do not split into {replicas} replicas x "
                         f"{sched.microbatches} micro-batches; use a multiple of "
                         f"{replicas * sched.microbatches}")
    stage_layers(net, sched.virtual_stages, 0)
    from parlab.launch import run
    ranks = run(_hybrid_worker, sched.stages * replicas, sched, net, replicas,
                backend=backend, timeout=timeout)
    names = [hybrid_name(g // sched.stages, g % sched.stages, sched.stages)
             for g in range(len(ranks))]
    ref_grads, ref_loss = reference(net)
    return HybridRun(sched, replicas, ranks, names, ref_grads, ref_loss, net)
