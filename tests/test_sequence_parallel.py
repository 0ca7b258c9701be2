"""Megatron sequence parallelism: a transformer block whose LayerNorm regions are split by
sequence equals one process, forward and backward, and moves the bytes of plain tensor
parallelism (a reduce-scatter and an all-gather where there was one all-reduce)."""
import pytest
import torch
import torch.distributed as dist

from parlab.launch import run
from parlab.memory import forward_saved_bytes
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
    # the block's own collectives, rank by rank: an all-gather and a reduce-scatter where
    # tensor parallelism all-reduces (two forward: attention and MLP; two backward), the
    # same bytes, plus the backward pass's second all-gather of each column-parallel layer's
    # input (kept split, not gathered, for the backward pass)
    activation = BATCH * SEQ * CONFIG.d_model * 8  # one (batch, seq, d) float64 tensor
    ring = {r: 2 * (world - 1) * activation // world for r in range(world)}
    assert _sent(logs[False], world) == {r: 4 * ring[r] for r in range(world)}
    gathers = [r for r in logs[True] if r.op == "all_gather"]
    scatters = [r for r in logs[True] if r.op == "reduce_scatter"]
    assert _sent(scatters, world) == {r: 4 * ring[r] // 2 for r in range(world)}
    assert _sent(gathers, world) == {r: (4 + 2) * ring[r] // 2 for r in range(world)}


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


MEMORY = TransformerConfig(name="sp-memory", d_model=64, n_layers=1, n_heads=8, d_ff=256,
                           vocab=16, context=64)


def _saved_bytes(sequence_parallel):
    """Bytes of the distinct tensors autograd keeps for one block's backward pass on this
    rank (the block's input included, its weights not)."""
    t, r = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    tp = TensorParallelBlock(GPT(MEMORY).blocks[0], None, sequence_parallel=sequence_parallel)
    x = torch.randn(2, 64, MEMORY.d_model)
    if sequence_parallel:
        x = x.chunk(t, dim=1)[r].contiguous()
    return forward_saved_bytes(tp, x.requires_grad_())[1]


@pytest.mark.parametrize("world", [2, 4])
def test_sequence_parallel_splits_every_activation_t_ways(world):
    """Measured against Korthikanti et al.'s terms without dropout (our GPT has none), fp32:
    with sequence parallelism all of them are split t ways; with tensor parallelism alone
    the LayerNorm regions (both LayerNorms' inputs, and their outputs, which the attention's
    and the MLP's first linear layers keep) stay whole. Beyond the paper's terms: the causal
    mask (a seq x seq bool, the same on every rank) and each LayerNorm's mean and 1/std
    (2 fp32 values per token)."""
    from parlab.memory import korthikanti_terms

    batch, seq, e = 2, 64, 4
    terms = korthikanti_terms(MEMORY, batch, seq, element_bytes=e, dropout=False)
    total = sum(terms.values())
    layer_norm_regions = terms["LayerNorm: inputs"] + terms["attention: Q, K, V input"] \
        + terms["MLP: first linear input"]
    mask = seq * seq

    def ln_stats(tokens):
        return 2 * 2 * batch * tokens * e

    split = run(_saved_bytes, world, True)
    assert split == [total // world + mask + ln_stats(seq // world)] * world
    plain = run(_saved_bytes, world, False)
    assert plain == [layer_norm_regions + (total - layer_norm_regions) // world + mask
                     + ln_stats(seq)] * world


@pytest.mark.parametrize("world", [2, 4])
def test_the_calculator_counts_a_sequence_parallel_block_as_measured(world):
    """memory.block_activations(..., tp=t, sequence_parallel=...) against what each rank's
    block kept (fp32, batch 2, 64 tokens), with and without sequence parallelism."""
    from parlab.memory import block_activations

    for sp in (True, False):
        counted = sum(block_activations(MEMORY, 2, 64, "fp32", tp=world,
                                        sequence_parallel=sp).values())
        assert run(_saved_bytes, world, sp) == [counted] * world, sp


def test_the_calculator_refuses_what_it_does_not_model():
    from parlab.memory import block_activations

    with pytest.raises(ValueError, match="divides"):
        block_activations(MEMORY, 2, 63, "fp32", tp=2, sequence_parallel=True)
    with pytest.raises(TypeError, match="True or False"):
        block_activations(MEMORY, 2, 64, "fp32", tp=2, sequence_parallel=1)


def test_a_sequence_parallel_llama_block_divides_its_norms_by_tp():
    """Llama's count follows the rule measured on the GPT block: the norms' tensors (inputs,
    fp32 copies, statistics, outputs) are divided by tp, the rest is unchanged."""
    from parlab.memory import block_activations

    tp_only = block_activations("Llama-3-8B", 1, 64, "bf16", tp=2)
    sp = block_activations("Llama-3-8B", 1, 64, "bf16", tp=2, sequence_parallel=True)
    assert sp.keys() == tp_only.keys()
    for key, value in tp_only.items():
        norm = "norm" in key
        assert sp[key] == (value // 2 if norm else value), key
