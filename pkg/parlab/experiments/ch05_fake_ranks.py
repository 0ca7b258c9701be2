"""One rank of a job of hundreds, in one process: the memory estimate checked against what the
package's own tensor-parallel and ZeRO code allocates (issue 31, item 5).

Why this module exists: :func:`parlab.memory.estimate` prices the model states of a GPT-3
layout from the config alone. Here one process *becomes* one rank of that layout with
PyTorch's fake process group (``torch.testing._internal.distributed.fake_pg``: collectives
return at once and move nothing), builds that rank's part of the model on the meta device
(shapes, no memory), shards it with the package's code, takes two optimizer steps, and adds up
the bytes of the tensors the code really allocated. Nothing here reads the estimate.

What a rank of a dp x pp x tp job (:class:`parlab.comm.Mesh`) holds, built as the package's
3D job builds it (:mod:`parlab.hybrid.parallel3d`):

- **pipeline**: stage k holds the layers :func:`parlab.pipeline.split_layers` gives it (the
  embeddings ride with the first blocks, the final norm and head with the last ones). The
  blocks of a stage are alike, so the rank builds a :class:`parlab.models.GPT` with that many
  blocks and keeps the ends its stage holds; the last stage of a tied model keeps its own
  copy of the word embedding as its head (Megatron's, and what the estimate counts);
- **tensor**: :func:`parlab.tensor_parallel.parallelize` over the mesh's ``tp`` group swaps
  every block for Megatron's (whole heads, fc1 by columns, fc2 by rows; norms and the
  row-parallel biases whole on every rank);
- **data**: :class:`parlab.sharded.Zero` (stage 0 to 3, Adam) over the ``dp`` group, each
  child of the stage (the embeddings, every block, the head) one flat, padded unit.

Counted after the second backward pass, before its step (gradients present, Adam's moments
from the first step: the peak of the model states, as :meth:`parlab.sharded.Zero.state_bytes`
counts it): every distinct storage among the parameters and ZeRO's flat buffers and shards,
their gradients, and the optimizer's state tensors (Adam's scalar step counters are left out,
as the estimate leaves them out). On the meta device storages have no address, so they are
told apart by identity, and a ZeRO-3 buffer freed between uses counts its 0 bytes.

Where the package's code and the estimate differ, and why (the tests check each difference
against its own hand count, never a tolerance):

- **Vocabulary tables under tensor parallelism.** The estimate gives each tensor rank
  ceil(vocab / tp) rows of the word embedding and the head, as Megatron-LM splits them
  (Megatron first pads the vocabulary to a multiple of 128 x tp: 51200 rows for GPT's 50257
  at tp = 8, 6400 per rank against the estimate's 6283). The package's 3D job keeps the
  embeddings and the head whole on every tensor rank (``parallelize`` swaps the blocks only;
  its :class:`~parlab.tensor_parallel.VocabParallelEmbedding` checks the token ids with
  ``.tolist()``, which a meta tensor cannot answer). So the first and last stages hold
  (vocab - ceil(vocab / tp)) x d_model more of every state here: the package differs, not
  the estimate.
- **ZeRO's padding.** The estimate pads once, ceil(N / dp) elements per shard of a stage's N
  parameters (ZeRO's paper: one flat buffer). :class:`parlab.sharded.FlatShard` pads each
  unit (a block, the embeddings, the head) to a multiple of dp, so a stage holds up to dp - 1
  more elements per unit, in every part that lives in flat buffers: the parameters (even at
  stage 0, whose units are flat too), the sharded gradients and the sharded optimizer state.
  For GPT-3's widths every unit is a multiple of d_model, so any dp dividing d_model pads
  nothing; dp = 5 shows it. Megatron's distributed optimizer pads too, per gradient bucket.
- **Precision.** The package's ZeRO updates the parameters in their own dtype: it has no
  fp32 master copy. So the comparison is in fp32, where the estimate counts no master
  weights either; a bf16 run here would hold bf16 Adam moments, not the estimate's
  mixed-precision fp32 master weights and moments.

It composes three strategies, so it belongs above them; it sits with chapter 05's experiments
(the planner's layouts) rather than in :mod:`parlab.hybrid`, which it would fit as well.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from parlab.checks import check_choice, check_count
from parlab.comm import Mesh
from parlab.memory import ZERO_STAGES
from parlab.models import GPT, TransformerConfig
from parlab.pipeline import split_layers
from parlab.sharded import Zero
from parlab.tensor_parallel import parallelize

__all__ = ["FakeRank", "fake_world", "measure_rank"]


@dataclass(frozen=True)
class FakeRank:
    """The model-state bytes one rank of a dp x pp x tp job allocated (fp32, Adam), and the
    element count of each of its ZeRO units (each padded to a multiple of dp)."""

    rank: int
    stage: int
    parameters: int
    gradients: int
    optimizer_state: int
    units: tuple[int, ...]
    master_weights: int = 0   # the package's ZeRO keeps no fp32 master copy (module docstring)

    def parts(self) -> dict[str, int]:
        """The four parts the estimate names, in its order."""
        return {"parameters": self.parameters, "gradients": self.gradients,
                "master_weights": self.master_weights, "optimizer_state": self.optimizer_state}


@contextlib.contextmanager
def fake_world(rank: int, world_size: int):
    """This process as rank ``rank`` of ``world_size`` on PyTorch's fake process group; the
    group is destroyed on the way out. Refuses to run inside an existing group."""
    from torch.testing._internal.distributed.fake_pg import FakeStore
    if dist.is_initialized():
        raise RuntimeError("a process group already exists in this process; the fake one "
                           "needs a process of its own")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _stage_module(config: TransformerConfig, pp: int, stage: int, tp_group) -> nn.Sequential:
    """The layers pipeline ``stage`` holds, its blocks split over ``tp_group`` (on meta)."""
    layers = split_layers(config.n_layers + 2, pp, stage, first=1, last=1)
    first, last = 0 in layers, config.n_layers + 1 in layers
    model = GPT(config.replace(n_layers=len(layers) - first - last))
    parallelize(model, tp_group)
    chain = model.pipeline_layers()
    return nn.Sequential(*chain[0 if first else 1:len(chain) if last else -1])


def _distinct_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (scalars left out; meta-safe)."""
    seen = {}
    for t in tensors:
        if t is not None and t.dim() > 0:
            s = t.untyped_storage()
            seen[s._cdata] = s.nbytes()
    return sum(seen.values())


def _held(zero: Zero) -> dict[str, int]:
    params = ([p for u in zero.units for p in u.params] + [u.full for u in zero.units]
              + [u.shard for u in zero.units])
    state = [v for s in zero.optimizer.state.values() for v in s.values()
             if isinstance(v, torch.Tensor)]
    return {"parameters": _distinct_bytes(params),
            "gradients": _distinct_bytes(p.grad for p in params),
            "optimizer_state": _distinct_bytes(state)}


def measure_rank(config: TransformerConfig, dp: int, tp: int, pp: int, zero: int, stage: int,
                 *, seq: int = 4) -> FakeRank:
    """Be one rank of pipeline ``stage`` of a dp x pp x tp job on the fake process group, and
    count the model states the package's code allocated (module docstring).

    The rank is the last replica's last tensor rank (any other of the stage holds the same
    bytes: the blocks split evenly and ZeRO's shards are equal). One sequence of ``seq``
    tokens per step: the model states do not depend on it. Everything lives on the meta
    device, so GPT-3 175B's stages take a second, and no memory.
    """
    for name, value in (("dp", dp), ("tp", tp), ("pp", pp), ("seq", seq)):
        check_count(name, value)
    check_choice("zero", zero, ZERO_STAGES)
    mesh = Mesh(dp=dp, pp=pp, tp=tp)
    rank = mesh.rank_at(dp - 1, stage, tp - 1)
    with fake_world(rank, mesh.size):
        groups = mesh.groups(mesh.build("cpu"))
        with torch.device("meta"):
            return _measure(config, mesh, rank, stage, zero, seq, groups)


def _measure(config, mesh, rank, stage, zero, seq, groups) -> FakeRank:
    """:func:`measure_rank` inside the fake world, on the meta device."""
    pp = mesh.pp
    module = _stage_module(config, pp, stage, groups["tensor"])
    opt = Zero(module, zero, optimizer="adam", group=groups["data"])
    first, last = stage == 0, stage == pp - 1
    held = {}
    for step in range(2):
        x = (torch.zeros(1, seq, dtype=torch.long) if first
             else torch.zeros(1, seq, config.d_model, requires_grad=True))
        out = module(x)
        if last:
            F.cross_entropy(out.flatten(0, -2), torch.zeros(seq, dtype=torch.long)).backward()
        else:
            out.backward(torch.ones_like(out))
        if step == 1:
            held = _held(opt)
        # Adam makes its step counter with torch.tensor(0.0): torch 2.11 puts it on the
        # context's device (meta, where Adam's .item() fails), torch 2.13 on the CPU
        with torch.device("cpu"):
            opt.step()
    return FakeRank(rank, stage, **held, units=tuple(u.numel for u in opt.units))
