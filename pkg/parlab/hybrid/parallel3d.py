"""A real 3D-parallel training step: data 2 x tensor 2 x pipeline 2 on 8 ranks, equal to one
process, composed from the three strategies.

Why this module exists: the planner (:mod:`parlab.hybrid.planner`) reasons about layouts it
never runs. Here the smallest interesting one runs for real, so every collective the planner
counts is a real message. Nothing in it is a parallelism of its own; it only composes:

- the ranks form a ``DeviceMesh`` with dimensions ``dp``, ``pp``, ``cp`` (1 here) and ``tp``
  (:meth:`parlab.comm.Mesh.build`): tensor index fastest, then stage, then replica, as the
  planner places them (:mod:`parlab.hybrid.placement`): on servers of 2 GPUs, as in Figure
  8-19, tensor groups share a server (NVLink), stages follow a rail, replicas sit on other
  servers;
- **tensor parallel**: :func:`parlab.tensor_parallel.parallelize` swaps every block of a
  small GPT (:func:`parlab.models.build_model`) for Megatron's (whole heads per rank; fc1 by
  columns, fc2 by rows) over the ``tp`` sub-mesh; LayerNorms, embeddings and head stay
  replicated;
- **pipeline**: the model's chain of layers (:meth:`parlab.models.GPT.pipeline_layers`) is cut
  into ``pp`` stages (:func:`parlab.pipeline.split_layers`: the embeddings ride with the first
  blocks, the head with the last) and run through chapter 03's executor
  (:func:`parlab.pipeline.run_schedule`, GPipe order) over the ``pp`` sub-mesh;
- **data parallel**: each replica trains on its share of the batch, and the copies of each
  (stage, tensor index) average their gradients with chapter 02's bucketed all-reduce
  (:func:`parlab.data_parallel.all_reduce_buckets`, one bucket) over the ``dp`` sub-mesh.

On the "toy" backend every message carries its sub-mesh's kind ("tensor", "pipeline",
"data").

The model's head is *untied* from its token embedding (``tied_embeddings=False``): tied, the
first and the last stage would share one matrix and need a fourth kind of group (Megatron's
embedding all-reduce). The single-process reference uses the same untied model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from parlab.checks import check_count
from parlab.comm import GROUP_KINDS, Mesh, Topology
from parlab.data_parallel import all_reduce_buckets
from parlab.hybrid.placement import cluster, place
from parlab.models import TINY, build_model
from parlab.pipeline import run_schedule, schedule, split_layers
from parlab.tensor_parallel import merge_grads, parallelize, shard_pieces

__all__ = ["CONFIG", "Run3D", "run_3d", "rank_step", "reference_step", "make_batch"]

#: TINY (d_model 32, 4 heads, 4 layers here) with an untied head: see the module docstring.
CONFIG = TINY.replace(name="tiny 3D", n_layers=4, tied_embeddings=False)


def make_batch(batch: int, seq: int, vocab: int, seed: int = 0):
    """Token ids and their next tokens, (batch, seq) each, from a seeded generator."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def reference_step(batch: int = 8, seq: int = 8, lr: float = 0.1, seed: int = 0,
                   config=CONFIG) -> dict[str, torch.Tensor]:
    """One SGD step of the whole model on the whole batch, in one process: every parameter after."""
    model = build_model(config, seed=seed)
    x, y = make_batch(batch, seq, config.vocab, seed)
    model.loss(x, y).backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _stage_names(config, stage: int, pp: int) -> tuple[str, ...]:
    """Name prefixes (in the unsplit model) of the parameters that pipeline stage ``stage`` holds."""
    layers = config.n_layers + 2  # embeddings, the blocks, the head
    names = []
    for j in split_layers(layers, pp, stage, first=1, last=1):
        names += (["wte.", "wpe."] if j == 0 else ["ln_f.", "lm_head."] if j == layers - 1
                  else [f"blocks.{j - 1}."])
    return tuple(names)


def _check_shape(dp, tp, pp, batch, microbatches, config) -> None:
    """The degrees and the batch split, checked before any rank starts (and on each rank)."""
    for name, value in (("dp", dp), ("tp", tp), ("pp", pp), ("batch", batch),
                        ("microbatches", microbatches)):
        check_count(name, value)
    if batch % (dp * microbatches):
        raise ValueError(f"batch={batch} does not split into dp={dp} x microbatches="
                         f"{microbatches} equal micro-batches")
    if config.n_layers % pp:
        raise ValueError(f"pp={pp} does not divide the {config.n_layers} layers")


def rank_step(dp: int = 2, tp: int = 2, pp: int = 2, batch: int = 8, seq: int = 8,
              microbatches: int = 2, lr: float = 0.1, seed: int = 0, config=CONFIG) -> dict:
    """One 3D-parallel SGD step on this rank; returns its coordinates, loss and parameters."""
    _check_shape(dp, tp, pp, batch, microbatches, config)
    if dist.get_world_size() != dp * tp * pp:
        raise ValueError(f"dp x tp x pp = {dp * tp * pp} but the job has "
                         f"{dist.get_world_size()} ranks")
    mesh = Mesh(dp=dp, pp=pp, tp=tp)
    groups = mesh.groups(mesh.build())
    where = mesh.coordinates(dist.get_rank())

    model = parallelize(build_model(config, seed=seed), groups["tensor"])     # tensor
    layers, sched = model.pipeline_layers(), schedule("gpipe", pp, microbatches)
    held = split_layers(len(layers), pp, where.stage, first=1, last=1)        # pipeline
    stage = nn.Sequential(*(layers[j] for j in held))
    x, y = make_batch(batch, seq, config.vocab, seed)
    share = slice(where.replica * batch // dp, (where.replica + 1) * batch // dp)
    inputs, targets = x[share].chunk(microbatches), y[share].chunk(microbatches)
    done = run_schedule(
        sched, {where.stage: stage}, inputs, targets,
        lambda logits, t: F.cross_entropy(logits.flatten(0, 1), t.flatten()) / microbatches,
        lambda k, i: (*inputs[i].shape, config.d_model),
        peers=dist.get_process_group_ranks(groups["pipeline"]), group=groups["pipeline"])

    grads = [p.grad for p in stage.parameters() if p.grad is not None]       # data
    all_reduce_buckets(grads, cap_bytes=sum(g.numel() * g.element_size() for g in grads),
                       group=groups["data"])  # one bucket, averaged over the dp copies
    with torch.no_grad():
        for p in stage.parameters():
            if p.grad is not None:
                p -= lr * p.grad
    mine = _stage_names(config, where.stage, pp)
    return {"coordinates": tuple(where), "loss": done.loss if where.stage == pp - 1 else None,
            "params": {n: v for n, v in shard_pieces(model).items() if n.startswith(mine)}}


@dataclass
class Run3D:
    """What :func:`run_3d` found: the ranks' results, the reference, and the traffic."""

    dp: int
    tp: int
    pp: int
    backend: str
    ranks: list
    reference: dict
    topology: Topology
    traffic: object = None                # a TrafficLog on the toy backend
    gpu_of: list = field(default_factory=list)

    def replica(self, d: int) -> dict:
        """Replica ``d``'s whole model, stitched from its ranks' pieces."""
        merged, mesh = {}, Mesh(dp=self.dp, pp=self.pp, tp=self.tp)
        for k in range(self.pp):
            ranks = [mesh.rank_at(d, k, t) for t in range(self.tp)]
            merged.update(merge_grads([self.ranks[r]["params"] for r in ranks]))
        return merged

    @property
    def max_error(self) -> float:
        """Largest difference from the one-process step, over every parameter of every replica."""
        worst = 0.0
        for d in range(self.dp):
            got = self.replica(d)
            if set(got) != set(self.reference):
                raise AssertionError(f"replica {d} is missing or adds parameters: "
                                     f"{sorted(set(got) ^ set(self.reference))}")
            worst = max(worst, *(float((got[n] - v).abs().max())
                                 for n, v in self.reference.items()))
        return worst

    def matches(self, atol: float = 1e-5) -> bool:
        return self.max_error <= atol

    @property
    def loss(self) -> float:
        """The batch loss (mean over every token), from the last stages of all replicas."""
        losses = [r["loss"] for r in self.ranks if r["loss"] is not None]
        return sum(losses) / len(losses)

    def traffic_by_group(self) -> dict[str, dict[str, int]]:
        """Bytes sent per group kind and link type (toy backend only)."""
        if self.traffic is None:
            raise ValueError("run with backend='toy' to log the traffic")
        out = {kind: dict.fromkeys(("nvlink", "rail", "spine"), 0) for kind in GROUP_KINDS}
        for rec in self.traffic.records:
            if rec.group in out:
                link = self.topology.link_type(self.gpu_of[rec.src], self.gpu_of[rec.dst])
                out[rec.group][link] += rec.nbytes
        return out

    def traffic_table(self) -> str:
        rows = self.traffic_by_group()
        lines = [f"{'group':<9}{'messages':>9}{'nvlink':>9}{'rail':>9}{'spine':>9}{'total':>9}"]
        for kind, links in rows.items():
            count = len(self.traffic.filter(group=kind))
            lines.append(f"{kind:<9}{count:>9}" + "".join(f"{v:>9}" for v in links.values())
                         + f"{sum(links.values()):>9}")
        return "\n".join(lines) + "\n(bytes sent; link types on " + str(self.topology) + ")"

    def report(self, atol: float = 1e-5) -> str:
        """One line: the loss, and whether every replica equals the one-process step."""
        return (f"dp {self.dp} x tp {self.tp} x pp {self.pp} on {self.backend}: loss "
                f"{self.loss:.4f}; every parameter of all {self.dp} replicas equals one-process "
                f"training to within {atol:g}: {self.matches(atol)}")


def run_3d(dp: int = 2, tp: int = 2, pp: int = 2, batch: int = 8, seq: int = 8,
           microbatches: int = 2, lr: float = 0.1, seed: int = 0, backend: str = "gloo",
           gpus_per_server: int = 2, timeout: float = 120) -> Run3D:
    """Run :func:`rank_step` on dp x tp x pp ranks and compare with :func:`reference_step`.

    ``backend="toy"`` also logs every message; :meth:`Run3D.traffic_by_group` splits them by
    group and by the link type they would use on servers of ``gpus_per_server`` GPUs.
    """
    from parlab.launch import run
    from parlab.comm import run_with_traffic

    _check_shape(dp, tp, pp, batch, microbatches, CONFIG)
    world = dp * tp * pp
    kwargs = dict(batch=batch, seq=seq, microbatches=microbatches, lr=lr, seed=seed)
    if backend == "toy":
        ranks, log = run_with_traffic(rank_step, world, dp, tp, pp, timeout=timeout, **kwargs)
    else:
        ranks, log = run(rank_step, world, dp, tp, pp, backend=backend, timeout=timeout,
                         **kwargs), None
    topology = cluster(world, gpus_per_server)
    return Run3D(dp, tp, pp, backend, ranks, reference_step(batch, seq, lr, seed), topology,
                 log, place(dp, tp, pp, gpus_per_server))
