"""Run the smaller tensor-parallel pieces on real ranks: the two embeddings, and one linear layer
under each of the slide deck's three strategies (the Megatron MLP is in
:mod:`parlab.experiments.ch04_mlp`).

Why a module of its own: each run here is the same three moves as the attention runs in
:mod:`parlab.experiments.ch04_attention` (build from a single-device layer, forward and backward on
every rank, merge the pieces and compare), on the layers of :mod:`parlab.tensor_parallel.layers`.
With ``backend="toy"`` every run also returns its traffic, split into forward and backward,
which is what the chapter's byte counts are made of.

The loss is sum(output x w) with a fixed random w, the same on every rank: the output of
each layer here is replicated, and so is its gradient (see :mod:`parlab.tensor_parallel.mappings`). The
embeddings are the exception. Their ranks go on to use the vectors differently, as the
first tensor-parallel layer (the book's Q, K, V projections) does: rank r's loss uses its
own w_r, so every rank hands back its own partial gradient of the vectors, and the
reference adds up every rank's loss. Both layouts start from the same per-rank gradients,
and both must sum them: the book's broadcast does it with its reduce onto A1; the
vocabulary split takes the vectors in through Megatron's ``f`` (:func:`copy_to_region`,
the first layer's input), whose backward all-reduce does it. The forward collective of each
run belongs to the embedding, the backward one is that sum (``f``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from parlab.launch import run
from parlab.experiments.ch04_attention import Comparison, _Phases, phase_split
from parlab.tensor_parallel import (
    all_gather_cat, balanced_ranges, BroadcastEmbedding, check_degree, ColumnParallelLinear,
    copy_to_region, merge_grads, RowParallelLinear, shard_spec, VocabParallelEmbedding
)
from parlab.checks import check_count

__all__ = ["run_embedding", "run_layer_strategy", "EMBEDDINGS", "STRATEGIES", "embedding_rank",
           "strategy_rank"]

#: The two ways chapter 04 holds a word-embedding table.
EMBEDDINGS = {
    "broadcast": "the whole table on A1, which broadcasts the vectors (the book's default)",
    "vocab": "each rank owns a range of token ids; an all-reduce assembles the vectors, and "
             "the first layer's f all-reduces their gradients",
}
#: The slide deck's three ways to split one linear layer across GPUs.
STRATEGIES = {
    "data": "data parallel: full weights on every GPU, samples split, gradients all-reduced",
    "partition_output": "partition output: output features split (column-parallel)",
    "reduce_output": "reduce output: input features split, partial outputs summed (row-parallel)",
}


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _forward_backward(layer, x, weight, sync=None):
    """Forward, backward (then ``sync()``, if given), marking the traffic log between them."""
    phases = _Phases()
    phases.mark()
    out = layer(x)
    phases.mark()
    (out * weight).sum().backward()
    if sync is not None:
        sync()
    phases.mark()
    return out, phases


def _collect(results, reference: dict, name: str, info=None, holders=None) -> Comparison:
    """Check the ranks agree, merge their gradients (from ``holders``, default every rank)."""
    for rank, r in enumerate(results[1:], start=1):
        if not torch.allclose(r["output"], results[0]["output"], atol=1e-6):
            raise AssertionError(f"{name}: rank {rank}'s output differs from rank 0's")
    parallel = {"output": results[0]["output"]}
    if results[0].get("x.grad") is not None:
        parallel["x.grad"] = results[0]["x.grad"]
    holders = [results[i] for i in holders] if holders is not None else results
    parallel.update({f"{n}.grad": g for n, g in merge_grads([r["grads"] for r in holders]).items()})
    return Comparison(name, parallel, reference, phase_split(results), info or {})


# --------------------------------------------------------------------------- embeddings

def _embedding_setup(vocab, d_model, batch, seq, seed, world_size):
    torch.manual_seed(seed)
    table = nn.Embedding(vocab, d_model)
    g = _generator(seed + 1)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    weights = [torch.randn(batch, seq, d_model, generator=g) for _ in range(world_size)]
    return table, ids, weights


def embedding_rank(kind, vocab, d_model, batch, seq, seed) -> dict:
    """One rank of :func:`run_embedding`."""
    rank, size = dist.get_rank(), dist.get_world_size()
    table, ids, weights = _embedding_setup(vocab, d_model, batch, seq, seed, size)
    if kind == "vocab":
        layer = VocabParallelEmbedding.from_embedding(table)
        # the first layer's f: identity forward, all-reduce of the partial gradients backward
        out, phases = _forward_backward(lambda i: copy_to_region(layer(i)), ids, weights[rank])
        grads = {"weight": (layer.weight.grad, layer.spec)}
    else:
        layer = BroadcastEmbedding.from_embedding(table, src=0)
        out, phases = _forward_backward(layer, ids, weights[rank])
        grads = {"weight": (layer.weight.grad, None)} if rank == 0 else {}  # A1 has the table
    return {"output": out.detach(), "grads": grads, "traffic": phases.result()}


def run_embedding(kind: str, vocab: int = 10, d_model: int = 4, batch: int = 2, seq: int = 3,
                  world_size: int = 2, backend: str = "gloo", seed: int = 0) -> Comparison:
    """One of :data:`EMBEDDINGS` on ``world_size`` ranks, next to ``nn.Embedding``."""
    if kind not in EMBEDDINGS:
        raise ValueError(f"unknown embedding {kind!r}; choose one of {list(EMBEDDINGS)}")
    for name, value in (("vocab", vocab), ("d_model", d_model), ("batch", batch), ("seq", seq),
                        ("world_size", world_size)):
        check_count(name, value)
    balanced_ranges(vocab, world_size)  # more ranks than token ids is an error before launching
    results = run(embedding_rank, world_size, kind, vocab, d_model, batch, seq, seed,
                  backend=backend)
    table, ids, weights = _embedding_setup(vocab, d_model, batch, seq, seed, world_size)
    out = table(ids)
    sum((out * w).sum() for w in weights).backward()  # one loss per rank, each its own w_r
    reference = {"output": out.detach(), "weight.grad": table.weight.grad}
    return _collect(results, reference, f"{kind} embedding", {"world_size": world_size},
                    holders=[0] if kind == "broadcast" else None)


# --------------------------------------------------------------------------- the slides' strategies

def _strategy_setup(batch, c_in, c_out, seed):
    torch.manual_seed(seed)
    linear = nn.Linear(c_in, c_out, bias=False)
    g = _generator(seed + 1)
    return linear, torch.randn(batch, c_in, generator=g), torch.randn(batch, c_out, generator=g)


def strategy_rank(strategy, batch, c_in, c_out, seed) -> dict:
    """One rank of :func:`run_layer_strategy`."""
    rank, size = dist.get_rank(), dist.get_world_size()
    linear, x, weight = _strategy_setup(batch, c_in, c_out, seed)
    if strategy == "data":
        mine = shard_spec("samples", (batch,), "rows", size)[rank]
        x_mine = x[mine.start:mine.stop].clone().requires_grad_()
        w_mine = weight[mine.start:mine.stop]
        # the gradient sync is the strategy's only traffic: C_in x C_out numbers
        out, phases = _forward_backward(linear, x_mine, w_mine,
                                        sync=lambda: dist.all_reduce(linear.weight.grad))
        # gather outputs and input gradients only to compare them (not part of the strategy)
        out, x_grad = all_gather_cat(out.detach(), 0), all_gather_cat(x_mine.grad, 0)
        grads = {"weight": (linear.weight.grad, None)}
    else:
        layer = (ColumnParallelLinear.from_linear(linear, gather_output=True)
                 if strategy == "partition_output"
                 else RowParallelLinear.from_linear(linear, input_is_parallel=False))
        x.requires_grad_()
        out, phases = _forward_backward(layer, x, weight)
        x_grad, grads = x.grad, {"weight": (layer.weight.grad, layer.spec)}
    return {"output": out.detach(), "x.grad": x_grad, "grads": grads, "traffic": phases.result()}


def run_layer_strategy(strategy: str, batch: int = 4, c_in: int = 6, c_out: int = 8,
                       world_size: int = 2, backend: str = "gloo", seed: int = 0) -> Comparison:
    """One linear layer (C_in -> C_out, no bias, batch B) split by one of :data:`STRATEGIES`."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {list(STRATEGIES)}")
    for name, value in (("batch", batch), ("c_in", c_in), ("c_out", c_out)):
        check_count(name, value)
    n, what = {"data": (batch, "samples of the batch"),
               "partition_output": (c_out, "output features (C_out)"),
               "reduce_output": (c_in, "input features (C_in)")}[strategy]
    check_degree(world_size, n, what, "world_size")
    results = run(strategy_rank, world_size, strategy, batch, c_in, c_out, seed, backend=backend)
    linear, x, weight = _strategy_setup(batch, c_in, c_out, seed)
    x.requires_grad_()
    out = linear(x)
    (out * weight).sum().backward()
    reference = {"output": out.detach(), "x.grad": x.grad, "weight.grad": linear.weight.grad}
    return _collect(results, reference, STRATEGIES[strategy].split(":")[0],
                    {"strategy": strategy, "batch": batch, "c_in": c_in, "c_out": c_out,
                     "world_size": world_size})
