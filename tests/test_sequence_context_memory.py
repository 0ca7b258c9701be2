"""Context parallelism inside whole models, and the memory calculator's count of it.

``apply_context_parallel`` puts ring, all-gather or Ulysses attention into a GPT and a Llama
(grouped-query attention, rotary positions): each rank's logits must equal its rows of one
process's, and the gradients summed over the ranks must equal one process's, in float64. The
calculator's ``cp`` / ``cp_method`` count is then held, byte for byte, to what each rank's
autograd keeps (saved-tensor hooks), for one block and for the whole model with its loss,
in fp32 and bf16, on 2 and 4 ranks.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from parlab.context_parallel import apply_context_parallel, CP_METHODS, shard
from parlab.launch import run
from parlab.memory import activation_bytes, block_activations, estimate, forward_saved_bytes
from parlab.models import build_model, get_config, LlamaConfig, SmallCNN, TransformerConfig

LLAMA = LlamaConfig("gqa", d_model=64, n_layers=2, n_heads=8, n_kv_heads=4, d_ff=96, vocab=100,
                    context=64)
GPT = TransformerConfig("gpt", 64, 2, 8, 96, 100, 64)
BATCH, SEQ = 2, 32
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class _Loss(nn.Module):
    """The model and its loss as one module, so every saved tensor of the step is counted."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, idx, targets):
        return self.model.loss(idx, targets)


def _equal_to_one_process(config, method, layout):
    """(largest logit error, largest gradient error) of this rank against one process."""
    torch.manual_seed(0)
    model = build_model(config, dtype=torch.float64)
    idx = torch.randint(0, config.vocab, (BATCH, SEQ))
    whole = model(idx)
    whole.square().sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    n, r = dist.get_world_size(), dist.get_rank()
    apply_context_parallel(model, method=method, layout=layout)
    mine = model(shard(idx, r, n, layout, dim=1))
    mine.square().sum().backward()
    error = (mine - shard(whole, r, n, layout, dim=1)).abs().max().item()
    worst = 0.0
    for name, p in model.named_parameters():
        dist.all_reduce(p.grad)
        worst = max(worst, (p.grad - grads[name]).abs().max().item())
    return error, worst


def _kept(config, method, precision, layout):
    """(one block's saved bytes, the whole model's with its loss) on this rank."""
    dtype, n = DTYPES[precision], dist.get_world_size()
    torch.manual_seed(0)
    model = apply_context_parallel(build_model(config, dtype=dtype), method=method,
                                   layout=layout)
    x = torch.randn(BATCH, SEQ // n, config.d_model, dtype=dtype, requires_grad=True)
    idx, targets = (torch.randint(0, config.vocab, (BATCH, SEQ // n)) for _ in range(2))
    return (forward_saved_bytes(model.blocks[0], x)[1],
            forward_saved_bytes(_Loss(model), idx, targets)[1])


def _all_cases(world):
    out = {}
    for config in (GPT, LLAMA):
        for method in CP_METHODS:
            for layout in ("contiguous", "zigzag"):
                out["equal", config.name, method, layout] = _equal_to_one_process(
                    config, method, layout)
            for precision, layout in (("fp32", "contiguous"), ("fp32", "zigzag"),
                                      ("bf16", "contiguous"))[:3 if world == 2 else 2]:
                out["kept", config.name, method, precision, layout] = _kept(
                    config, method, precision, layout)
    return out


@pytest.fixture(scope="module", params=[2, 4])
def cases(request):
    """Every rank's results, from one launch per world size."""
    return request.param, run(_all_cases, request.param, request.param, timeout=240)


def test_context_parallel_models_equal_one_process(cases):
    world, ranks = cases
    for key in (k for k in ranks[0] if k[0] == "equal"):
        for r, results in enumerate(ranks):
            error, grad = results[key]
            assert error < 1e-10 and grad < 1e-10, (world, r, key, error, grad)


def test_the_calculator_counts_context_parallel_memory_as_measured(cases):
    """Block by block and for the whole step, every rank keeps exactly what the calculator
    says, for each method, GPT and Llama, fp32 and bf16 (the all-gather's K and V of the whole
    sequence, Ulysses' full-sequence heads, ring's log-sum-exp: each in the count), with the
    contiguous and the zigzag layout."""
    world, ranks = cases
    configs = {c.name: c for c in (GPT, LLAMA)}
    checked = 0
    for key in (k for k in ranks[0] if k[0] == "kept"):
        _, name, method, precision, _ = key
        block = sum(block_activations(configs[name], BATCH, SEQ, precision, cp=world,
                                      cp_method=method).values())
        step = activation_bytes(configs[name], BATCH, SEQ, precision, cp=world, cp_method=method)
        if method == "ulysses" and key[-1] != "contiguous":
            # its reordering into sequence order keeps two int64 index vectors of SEQ each,
            # per layer (left out of the calculator's count, as its docstring says)
            block, step = block + 16 * SEQ, step + 16 * SEQ * LLAMA.n_layers
        for r, results in enumerate(ranks):
            assert results[key] == (block, step), (world, r, key)
            checked += 1
    assert checked == world * len(CP_METHODS) * 2 * (3 if world == 2 else 2)


def test_sequence_context_parallelism_divides_what_grows_with_the_sequence():
    """Independent of the code's sums: ring on cp ranks keeps, per block, 1/cp of every
    per-token tensor (the same keys' sizes with T/cp tokens), and trades the T x T softmax for
    a log-sum-exp; the all-gather keeps the whole sequence's K and V; Ulysses no mask."""
    e, b, t, cp, d = 2, 1, 64, 8, GPT.d_model
    ring = block_activations(GPT, b, t, "bf16", cp=cp, cp_method="ring")
    alone = block_activations(GPT, b, t // cp, "bf16")
    for key in ("ln1 input", "ln1 output", "ln2 input", "gelu input", "gelu output"):
        assert ring[key] == alone[key] == e * b * (t // cp) * (d if key[:2] == "ln" else 96)
    assert "softmax probabilities" not in ring and ring["ring logsumexp"] == e * b * 8 * t // cp
    gathered = block_activations(GPT, b, t, "bf16", cp=cp, cp_method="all-gather")
    assert gathered["gathered k, v"] == 2 * e * b * t * d
    ulysses = block_activations(GPT, b, t, "bf16", cp=cp, cp_method="ulysses")
    assert "visibility mask" not in ulysses and ulysses["q, k, v by heads"] == 3 * e * b * t * d // cp


def test_estimate_with_context_parallelism_shares_the_model_states_over_dp_x_cp():
    config = "Llama-3-8B"
    one = estimate(config, (8, 8192), "adam", "bf16", dp=2, tp=8, zero=1)
    cp = estimate(config, (8, 8192), "adam", "bf16", dp=2, tp=8, zero=1, cp=4)
    assert cp.parameters == one.parameters and cp.gradients == one.gradients
    # ZeRO-1 shards the optimizer state over the 8 GPUs (dp 2 x cp 4) that hold the same layers
    assert cp.optimizer_state == pytest.approx(one.optimizer_state / 4, rel=1e-6)
    assert cp.activations < one.activations / 3
    sp = estimate(config, (8, 8192), "adam", "bf16", dp=2, tp=8, sequence_parallel=True)
    assert sp.activations < estimate(config, (8, 8192), "adam", "bf16", dp=2, tp=8).activations
    assert "cp=4 (ring)" in cp.label and "sequence parallel" in sp.label


@pytest.mark.parametrize("kwargs, match", [
    (dict(cp=3), "cp=3 context-parallel ranks must divide the sequence of 8192"),
    (dict(cp=0), "cp"),
    (dict(cp=2, cp_method="star"), "cp_method"),
    (dict(cp=16, cp_method="ulysses"), "cp must divide the 1 key/value heads"),
    (dict(sequence_parallel="yes"), "sequence_parallel must be True or False"),
    (dict(cp=2, recompute="full"), "not modelled yet"),
])
def test_sequence_context_estimate_bad_input_is_named(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        estimate("Llama-3-8B", (8, 8192), "adam", "bf16", tp=8, **kwargs)


def test_sequence_context_methods_are_named_alike_by_the_calculator_and_the_strategy():
    from parlab.memory import CP_METHODS as COUNTED

    assert tuple(CP_METHODS) == COUNTED


def test_sequence_context_parallel_needs_a_transformer():
    with pytest.raises(ValueError, match="split a transformer config's sequence"):
        estimate(SmallCNN(), (4, 3, 32, 32), cp=2)
    with pytest.raises(ValueError, match="no parlab.models.Attention or LlamaAttention"):
        apply_context_parallel(nn.Linear(4, 4))
    with pytest.raises(ValueError, match="method"):
        apply_context_parallel(build_model(GPT), method="star")


def test_the_planner_takes_sequence_parallelism_for_memory_not_time():
    from parlab.hybrid import evaluate

    base = evaluate("GPT-3 175B", 8, 8, 8, 24)
    sp = evaluate("GPT-3 175B", 8, 8, 8, 24, sequence_parallel=True)
    assert sp.times == base.times   # the same bytes as the all-reduces it replaces
    assert sp.memory.activations < base.memory.activations
    assert sp.memory.parameters == base.memory.parameters
    with pytest.raises(TypeError, match="sequence_parallel must be True or False"):
        evaluate("GPT-3 175B", 8, 8, 8, 24, sequence_parallel="on")


def test_sequence_parallel_full_recompute_keeps_a_tp_th_of_each_block_input():
    """Full recompute keeps each block's input: b T d e bytes, split over tp with sequence
    parallelism (GPT-3 175B, 1 x 2048 tokens, bf16, tp 8: 12288 x 2048 x 2 / 8 per block)."""
    kw = dict(precision="bf16", tp=8, recompute="full")
    from parlab.memory import layer_activations
    layer = block_activations("GPT-3 175B", 1, 2048, "bf16", tp=8, sequence_parallel=True)
    kept, _ = layer_activations(get_config("GPT-3 175B"), sum(layer.values()), 1, 2048, 2, 8,
                                "full", True)
    assert kept == 12288 * 2048 * 2 // 8
    assert estimate("GPT-3 175B", (1, 2048), pp=96, sequence_parallel=True, **kw).activations \
        < estimate("GPT-3 175B", (1, 2048), pp=96, **kw).activations
