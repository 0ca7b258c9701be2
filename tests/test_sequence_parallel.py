"""Megatron sequence parallelism: a transformer block whose LayerNorm regions are split by
sequence equals one process, forward and backward, and moves the bytes of plain tensor
parallelism (a reduce-scatter and an all-gather where there was one all-reduce)."""
import pytest
import torch
import torch.distributed as dist

from parlab.launch import run
from parlab.models import GPT, TransformerConfig
from parlab.tensor_parallel import (
    allreduce_sequence_parallel_grads, merge_grads, reduce_scatter_to_region, TensorParallelBlock
)

CONFIG = TransformerConfig(name="sp", d_model=8, n_layers=1, n_heads=4, d_ff=16, vocab=16,
                           context=12)
BATCH, SEQ = 2, 12


def _setup():
    torch.manual_seed(0)
    block = GPT(CONFIG).blocks[0].double()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, SEQ, CONFIG.d_model, generator=g, dtype=torch.float64)
    w = torch.randn(BATCH, SEQ, CONFIG.d_model, generator=g, dtype=torch.float64)
    return block, x, w


LR = 0.1


def _sgd(module):
    with torch.no_grad():
        for p in module.parameters():
            p -= LR * p.grad


def _reference():
    block, x, w = _setup()
    x.requires_grad_()
    out = block(x)
    (out * w).sum().backward()
    _sgd(block)
    return out.detach(), x.grad, {n: p.detach() for n, p in block.named_parameters()}


def _rank(sequence_parallel):
    t, r = dist.get_world_size(), dist.get_rank()
    block, x, w = _setup()
    tp = TensorParallelBlock(block, None, sequence_parallel=sequence_parallel)
    if sequence_parallel:  # this rank's tokens in, this rank's tokens out
        x, w = (a.chunk(t, dim=1)[r].contiguous() for a in (x, w))
    x.requires_grad_()
    out = tp(x)
    (out * w).sum().backward()
    allreduce_sequence_parallel_grads(tp)
    _sgd(tp)  # compared after one step: every gradient, sharded or not, shows in a weight
    return out.detach(), x.grad, {n[2:]: piece for n, piece in tp.pieces("b").items()}


@pytest.mark.parametrize("backend", ["gloo", "toy"])
@pytest.mark.parametrize("world", [2, 4])
def test_sequence_parallel_block_equals_one_process(backend, world):
    out, x_grad, ref = _reference()
    ranks = run(_rank, world, True, backend=backend)
    assert torch.allclose(torch.cat([r[0] for r in ranks], dim=1), out, atol=1e-12)
    assert torch.allclose(torch.cat([r[1] for r in ranks], dim=1), x_grad, atol=1e-12)
    merged = merge_grads([r[2] for r in ranks])
    assert set(merged) == set(ref)
    for name, weight in merged.items():
        assert torch.allclose(weight, ref[name], atol=1e-12), name


def _sent(records, world):
    sent = {r: 0 for r in range(world)}
    for rec in records:
        sent[rec.src] += rec.nbytes
    return sent


def test_sequence_parallel_moves_the_bytes_of_the_all_reduces_it_replaces():
    world = 4
    logs = {sp: [r for r in run(_rank, world, sp, backend="toy").traffic.records
                 if r.op != "barrier"] for sp in (False, True)}
    assert {r.op for r in logs[False]} == {"all_reduce"}
    assert {r.op for r in logs[True]} == {"all_gather", "reduce_scatter", "all_reduce"}
    # after the block: the all-reduce of the gradients that cover this rank's tokens only
    # (LayerNorms, row-parallel biases), a ring all-reduce of their float64 bytes
    summed = sum(p.numel() for n, p in GPT(CONFIG).blocks[0].named_parameters()
                 if n.startswith(("ln", "attn.out_proj.bias", "mlp.fc2.bias"))) * 8
    extra = _sent([r for r in logs[True] if r.op == "all_reduce"], world)
    assert extra == {r: 2 * (world - 1) * summed // world for r in range(world)}
    # the block's own collectives: rank by rank, the bytes of tensor parallelism's all-reduces
    block = _sent([r for r in logs[True] if r.op != "all_reduce"], world)
    assert block == _sent(logs[False], world)
    # two all-reduces forward (attention, MLP) and two backward, of (batch, seq, d) float64
    assert block[0] == 4 * 2 * (world - 1) * BATCH * SEQ * CONFIG.d_model * 8 // world


def _reduce_scatter_rank():
    r, t = dist.get_rank(), dist.get_world_size()
    x = torch.arange(12.0).view(1, 12, 1).repeat(1, 1, 2) * (r + 1)
    x.requires_grad_()
    y = reduce_scatter_to_region(x, dim=1)
    (y * (r + 1)).sum().backward()
    return y.detach(), x.grad


def test_reduce_scatter_to_region_sums_keeps_a_slice_and_gathers_the_gradient():
    t = 3
    ranks = run(_reduce_scatter_rank, t, backend="toy")
    total = torch.arange(12.0).view(1, 12, 1).repeat(1, 1, 2) * sum(range(1, t + 1))
    for r, (y, grad) in enumerate(ranks):
        assert torch.equal(y, total.chunk(t, dim=1)[r])
        # d/dx of sum_r (r + 1) y_r: each slice's gradient is its owner's weight
        expected = torch.cat([torch.full((1, 4, 2), float(s + 1)) for s in range(t)], dim=1)
        assert torch.equal(grad, expected)
