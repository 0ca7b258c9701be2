"""A real 3D-parallel training step: data 2 x tensor 2 x pipeline 2 on 8 ranks, equal to one
process.

Why this module exists: the planner (:mod:`parlab.planner`) reasons about layouts it never
runs. Here the smallest interesting one runs for real, so every collective the planner
counts is a real message: a small GPT from :func:`parlab.models.build_model` is

- cut into ``pp`` **pipeline** stages (stage 0: embeddings and the first blocks; the last
  stage: the last blocks, final LayerNorm, head and loss); micro-batches go forward with
  ``dist.send``/``dist.recv`` of activations and come back as gradients (GPipe order);
- split inside each stage over ``tp`` ranks, **tensor parallel** as Megatron does it
  (:class:`~parlab.tensor_parallel.attention.MegatronAttention`: whole heads per rank;
  :class:`~parlab.tensor_parallel.layers.TensorParallelMLP`: fc1 by columns, fc2 by rows); LayerNorms,
  embeddings and head stay replicated and get identical gradients on the tensor ranks;
- copied ``dp`` times, **data parallel**: each replica trains on its share of the batch, and
  the replicas sum their gradients (one bucketed all-reduce per stage and tensor index,
  as DDP does) and divide by ``dp``, as Figure 8-2 describes.

Ranks are numbered and placed as the planner places them (:mod:`parlab.hybrid.placement`):
tensor index fastest, then stage, then replica; on servers of 2 GPUs, as in Figure 8-19,
tensor groups share a server (NVLink), stages follow a rail, replicas sit on other servers.
The groups are made with ``dist.new_group(..., group_desc=kind)``, so on the "toy" backend
every message carries its group's name ("tensor", "pipeline", "data").

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

from parlab.models import TINY, build_model
from parlab.comm import GROUP_KINDS, Mesh
from parlab.hybrid.placement import cluster, place
from parlab.comm import Topology
from parlab.tensor_parallel import MegatronAttention, SelfAttention, TensorParallelMLP

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


class _TensorParallelBlock(nn.Module):
    """A :class:`parlab.models.Block` with Megatron attention and MLP over ``group``."""

    def __init__(self, block: nn.Module, group):
        super().__init__()
        self.ln1, self.ln2 = block.ln1, block.ln2
        self.attn = MegatronAttention(SelfAttention.from_module(block.attn), group=group)
        self.mlp = TensorParallelMLP.from_mlp(block.mlp, group=group)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))

    def pieces(self, prefix: str) -> dict:
        """``{reference name: (local tensor, ShardSpec or None)}`` of this rank's parameters."""
        out = {f"{prefix}.{n}": (p.detach(), None) for n, p in
               (*self.ln1.named_parameters("ln1"), *self.ln2.named_parameters("ln2"))}
        attn = self.attn
        weights, biases = attn.qkv.weight.detach().chunk(3), attn.qkv.bias.detach().chunk(3)
        for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
            spec = attn.specs[name]
            out[f"{prefix}.attn.{name}.weight"] = (weights[i], spec)
            out[f"{prefix}.attn.{name}.bias"] = (biases[i], spec.bias())
        out[f"{prefix}.attn.out_proj.weight"] = (attn.out_proj.weight.detach(), attn.out_proj.spec)
        out[f"{prefix}.attn.out_proj.bias"] = (attn.out_proj.bias.detach(), None)
        fc1, fc2 = self.mlp.fc1, self.mlp.fc2
        out[f"{prefix}.mlp.fc1.weight"] = (fc1.weight.detach(), fc1.spec)
        out[f"{prefix}.mlp.fc1.bias"] = (fc1.bias.detach(), fc1.spec.bias())
        out[f"{prefix}.mlp.fc2.weight"] = (fc2.weight.detach(), fc2.spec)
        out[f"{prefix}.mlp.fc2.bias"] = (fc2.bias.detach(), None)
        return out


class _Stage(nn.Module):
    """The layers of one pipeline stage on one tensor rank: embeddings, blocks, head."""

    def __init__(self, model, stage: int, stages: int, group):
        super().__init__()
        per = model.config.n_layers // stages
        self.first, self.last, self.start = stage == 0, stage == stages - 1, stage * per
        self.blocks = nn.ModuleList(_TensorParallelBlock(model.blocks[i], group)
                                    for i in range(self.start, self.start + per))
        self.embed = nn.ModuleDict({"wte": model.wte, "wpe": model.wpe}) if self.first else None
        self.head = nn.ModuleDict({"ln_f": model.ln_f, "lm_head": model.lm_head}) \
            if self.last else None

    def forward(self, x):
        if self.first:
            x = self.embed["wte"](x) + self.embed["wpe"](torch.arange(x.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head["lm_head"](self.head["ln_f"](x)) if self.last else x

    def pieces(self) -> dict:
        out = {}
        for part in (self.embed, self.head):
            if part is not None:
                out.update({n: (p.detach(), None) for n, p in part.named_parameters()})
        for i, block in enumerate(self.blocks):
            out.update(block.pieces(f"blocks.{self.start + i}"))
        return out


def _pipeline(stage: _Stage, inputs, targets, prev: int, nxt: int, group, width: int):
    """Every micro-batch forward, then every one backward (GPipe); the loss on the last stage.

    A stage receives its input from rank ``prev`` and sends its output to rank ``nxt`` (its
    neighbours in the pipeline ``group``), and the gradients come back the same way.
    """
    saved, loss = [], 0.0
    for x, target in zip(inputs, targets):                          # forward
        if stage.first:
            inp = x
        else:
            inp = torch.empty(x.shape + (width,))
            dist.recv(inp, src=prev, group=group)
            inp.requires_grad_()
        out = stage(inp)
        if stage.last:
            out = F.cross_entropy(out.flatten(0, 1), target.flatten()) / len(inputs)
            loss += out.item()
        else:
            dist.send(out.detach().contiguous(), dst=nxt, group=group)
        saved.append((inp, out))
    for inp, out in reversed(saved):                                # backward
        if stage.last:
            out.backward()
        else:
            grad = torch.empty_like(out)
            dist.recv(grad, src=nxt, group=group)
            out.backward(grad)
        if not stage.first:
            dist.send(inp.grad.contiguous(), dst=prev, group=group)
    return loss if stage.last else None


def rank_step(dp: int = 2, tp: int = 2, pp: int = 2, batch: int = 8, seq: int = 8,
              microbatches: int = 2, lr: float = 0.1, seed: int = 0, config=CONFIG) -> dict:
    """One 3D-parallel SGD step on this rank; returns its coordinates, loss and parameters."""
    if dist.get_world_size() != dp * tp * pp:
        raise ValueError(f"dp x tp x pp = {dp * tp * pp} but the job has "
                         f"{dist.get_world_size()} ranks")
    if batch % (dp * microbatches):
        raise ValueError(f"batch={batch} does not split into dp={dp} x microbatches="
                         f"{microbatches} equal micro-batches")
    if config.n_layers % pp:
        raise ValueError(f"pp={pp} does not divide the {config.n_layers} layers")
    mesh = Mesh(dp=dp, pp=pp, tp=tp)
    where = mesh.coordinates(dist.get_rank())
    groups = mesh.new_groups()
    stage = _Stage(build_model(config, seed=seed), where.stage, pp, groups["tensor"])
    pipe_group = groups["pipeline"]
    prev = mesh.rank_at(where.replica, where.stage - 1, where.tensor) if where.stage else None
    nxt = (mesh.rank_at(where.replica, where.stage + 1, where.tensor) if where.stage < pp - 1
           else None)

    x, y = make_batch(batch, seq, config.vocab, seed)
    share = slice(where.replica * batch // dp, (where.replica + 1) * batch // dp)
    loss = _pipeline(stage, x[share].chunk(microbatches), y[share].chunk(microbatches),
                     prev, nxt, pipe_group, config.d_model)

    params = [p for p in stage.parameters() if p.grad is not None]
    bucket = torch.cat([p.grad.flatten() for p in params])         # one all-reduce, as DDP
    dist.all_reduce(bucket, group=groups["data"])
    bucket /= dp
    with torch.no_grad():
        for p, g in zip(params, bucket.split([p.numel() for p in params])):
            p -= lr * g.view_as(p)
    return {"coordinates": tuple(where), "loss": loss,
            "params": stage.pieces()}


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
        from parlab.tensor_parallel import merge_grads
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
