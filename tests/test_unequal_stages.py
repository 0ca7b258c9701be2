"""Pipeline stages that hold unequal numbers of layers (issue 31): the memory estimate, the
planner and the pipeline's own split accept them.

References are independent of the code under test: parameters are counted on the modules of
a real GPT (``build_model``) cut by hand, activations add one block's bytes
(:func:`parlab.memory.block_activations`) per layer a stage holds, and the planner's step
time is rebuilt from 6 x parameters x tokens at the GPU's peak.
"""

from __future__ import annotations

import pytest
import torch.nn as nn

from parlab import memory
from parlab.hybrid import evaluate, search
from parlab.hybrid.assumptions import Assumptions, split_problem
from parlab.memory import activations_per_layer, block_activations, estimate, estimate_ranks
from parlab.models import TINY, build_model, count_parameters, get_config
from parlab.pipeline import split_layers

SEVEN = TINY.replace(name="tiny 7", n_layers=7)   # d 32, 2 heads, d_ff 128, vocab 96, seq 16
B, T, M = 4, 16, 4                                 # micro-batch, sequence, micro-batches


def _hand_parameters(counts) -> list[int]:
    """Parameters of each stage, counted on the modules of a real GPT cut by hand: stage k
    holds blocks sum(counts[:k]) ... and the first the embeddings, the last the final norm
    and the head (a tied head is a copy of the token embedding there, as Megatron keeps)."""
    model = build_model(SEVEN, seed=0)
    size = lambda mods: sum(p.numel() for m in mods for p in m.parameters())  # noqa: E731
    out, start = [], 0
    for k, n in enumerate(counts):
        mods = list(model.blocks[start:start + n])
        if k == 0:
            mods += [model.wte, model.wpe]
        if k == len(counts) - 1:
            mods += [model.ln_f, model.lm_head]
        out.append(size(mods))
        start += n
    return out


def _hand_activations(counts) -> list[int]:
    """1F1B: stage k holds min(pp - k, m) micro-batches, each one block's saved bytes per
    layer it holds, plus the embedding's on the first stage and the head's on the last."""
    pp = len(counts)
    block = sum(block_activations(SEVEN, B, T).values())
    ends = activations_per_layer(SEVEN, B, T)
    out = []
    for k, n in enumerate(counts):
        kept = n * block + (ends["embedding"] if k == 0 else 0) \
            + (ends["head"] if k == pp - 1 else 0)
        out.append(min(pp - k, M) * kept)
    return out


@pytest.mark.parametrize("pp,counts,given", [
    (2, (4, 3), None),        # 7 on 2: the default split, the extra layer first
    (3, (3, 2, 2), None),     # 7 on 3: the default split
    (3, (1, 5, 1), (1, 5, 1)),  # Megatron-style: fewer layers on the first and last stage
    (2, (2, 5), (2, 5)),
])
def test_the_estimate_prices_each_stage_with_its_own_layers(pp, counts, given):
    ranks = estimate_ranks(SEVEN, (B * M, T), "adam", "fp32", pp=pp, microbatches=M,
                           stage_layers=given)
    params, acts = _hand_parameters(counts), _hand_activations(counts)
    for k, b in enumerate(ranks):
        assert b.parameters == 4 * params[k]          # fp32
        assert b.gradients == 4 * params[k]
        assert b.optimizer_state == 8 * params[k]     # Adam's two moments
        assert b.activations == acts[k]
    busiest = max(range(pp), key=lambda k: 16 * params[k] + acts[k])
    whole = estimate(SEVEN, (B * M, T), "adam", "fp32", pp=pp, microbatches=M,
                     stage_layers=given)
    assert whole.total == 16 * params[busiest] + acts[busiest]


def test_a_middle_stage_can_be_the_busiest():
    # GPipe holds all m micro-batches on every stage, so the 5-block middle stage outweighs
    # the 1-block ends (their embedding and head are small in this tiny model)
    counts = (1, 5, 1)
    params = _hand_parameters(counts)
    block = sum(block_activations(SEVEN, B, T).values())
    assert 16 * params[1] + M * 5 * block > max(16 * params[0], 16 * params[2]) + M * 3 * block
    b = estimate(SEVEN, (B * M, T), "adam", "fp32", pp=3, microbatches=M, schedule="gpipe",
                 stage_layers=counts)
    assert "stage layers [1, 5, 1]" in b.label
    assert b.parameters == 4 * params[1] and b.activations == M * 5 * block


@pytest.mark.parametrize("counts,given", [((4, 3), None), ((2, 5), (2, 5)),
                                          ((3, 2, 2), None), ((2, 3, 2), (2, 3, 2))])
def test_activation_bytes_takes_the_same_counts(counts, given):
    pp, block = len(counts), sum(block_activations(SEVEN, B, T).values())
    ends = activations_per_layer(SEVEN, B, T)
    got = [memory.activation_bytes(SEVEN, B, T, stage=k, pp=pp, stage_layers=given)
           for k in range(pp)]
    assert got == [n * block + (ends["embedding"] if k == 0 else 0)
                   + (ends["head"] if k == pp - 1 else 0) for k, n in enumerate(counts)]


@pytest.mark.parametrize("bad,message", [
    ((3, 4, 1), r"stage_layers=\[3, 4, 1\] sums to 8, but tiny 7 has 7 layers"),
    ((3, 4), r"stage_layers=\[3, 4\] gives 2 stage\(s\) but pp=3"),
    ((0, 4, 3), r"stage_layers=\[0, 4, 3\]: every stage needs at least one layer"),
    ((-1, 5, 3), r"every stage needs at least one layer \(counts >= 1\)"),
    ((2.5, 2.5, 2), r"stage_layers must be a tuple of pp=3 ints"),
    ("232", r"stage_layers must be a tuple of pp=3 ints"),
])
def test_a_bad_split_names_its_values_and_what_is_valid(bad, message):
    with pytest.raises(ValueError, match=message):
        estimate(SEVEN, (8, T), pp=3, stage_layers=bad)


def test_stage_layers_refuses_what_it_cannot_describe():
    with pytest.raises(ValueError, match="schedule='zbv' cuts 2 x pp chunks"):
        estimate(SEVEN, (8, T), pp=2, microbatches=4, schedule="zbv", stage_layers=(3, 4))
    with pytest.raises(ValueError, match="a torch.nn.Module's stages are cut at split_points"):
        estimate(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)), (8, 4), pp=2,
                 stage_layers=(1, 1))
    with pytest.raises(ValueError, match="virtual_stages=2 cuts each rank's layers"):
        Assumptions(virtual_stages=2, stage_layers=(16, 16))


# ---------------------------------------------------------------------------- the planner

def test_the_planner_accepts_llama_3_8b_on_three_stages():
    # 32 layers on pp=3 used to be refused ("pp=3 does not divide the 32 layers")
    assert split_problem(get_config("Llama-3-8B"), 1, 3, 8) == ""
    found = search("Llama-3-8B", 3, global_batch=24, seq=2048, microbatches=(8,))
    assert not [r for r in found.rejected if r.pp == 3 and r.kind == "split"]
    assert any(lay.pp == 3 for lay in found.layouts)


def test_the_step_runs_at_the_slowest_stages_pace():
    """Hand reference: Llama-3-8B, pp=3 (11, 11, 10 layers), m=8 micro-batches of b=1.

    An even split would give each stage 32/3 layers' worth of the model's 6 N FLOPs per
    token; the slowest stage holds 11, so each slot takes 11 / (32/3) = 33/32 of that. With
    tp=1 there is no tensor traffic; 1F1B's bubble is (p-1) slots of (compute + sends)."""
    m, b, seq = 8, 1, 2048
    lay = evaluate("Llama-3-8B", 1, 1, 3, m, global_batch=m * b, seq=seq)
    a = lay.assumptions
    n = count_parameters(lay.config)["total"]
    even = 6 * n / 3 * b * seq / (a.gpu_tflops * 1e12 * a.mfu * lay.efficiency)
    assert lay.times["compute"] == pytest.approx(m * even * 33 / 32, rel=1e-12)
    slot = (lay.times["compute"] + lay.times["pipeline"]) / m
    assert lay.times["bubble"] == pytest.approx(2 * slot, rel=1e-12)
    assert lay.step_time_s == pytest.approx((m + 2) * slot + lay.times["data"], rel=1e-12)
    # the memory is the busiest stage's: stage 0, 11 layers and the embedding
    assert lay.memory.total == max(x.total for x in estimate_ranks(
        "Llama-3-8B", (m * b, seq), "adam", "bf16", pp=3, microbatches=m))


def test_explicit_stage_layers_set_the_slowest_stage():
    m, seq = 4, 2048
    even = evaluate("Llama-3-8B", 1, 1, 4, m, global_batch=m, seq=seq)           # 8 each
    uneven = evaluate("Llama-3-8B", 1, 1, 4, m, global_batch=m, seq=seq,
                      stage_layers=(6, 10, 10, 6))                                # slowest 10
    assert uneven.times["compute"] == pytest.approx(even.times["compute"] * 10 / 8, rel=1e-12)
    assert uneven.times["pipeline"] == even.times["pipeline"]
    slot = (uneven.times["compute"] + uneven.times["pipeline"]) / m   # 1F1B: p - 1 idle slots
    assert uneven.times["bubble"] == pytest.approx(3 * slot, rel=1e-12)
    assert "stage layers [6, 10, 10, 6]" in uneven.memory.label
    with pytest.raises(ValueError, match=r"stage_layers=\[6, 10, 10, 6\] gives 4 stage\(s\) "
                                         r"but pp=2"):
        evaluate("Llama-3-8B", 1, 1, 2, m, global_batch=m, seq=seq, stage_layers=(6, 10, 10, 6))


def test_a_search_with_stage_layers_tries_only_that_depth():
    found = search("Llama-3-8B", 4, global_batch=16, seq=2048, microbatches=(4,),
                   stage_layers=(6, 10, 10, 6))
    assert {lay.pp for lay in found.layouts} <= {4}
    assert any(r.kind == "split" and "gives 4 stages, not pp=2" in r.reason
               for r in found.rejected)


# ------------------------------------------------------------------- the executor's split

@pytest.mark.parametrize("counts", [(4, 3), (3, 2, 2), (1, 5, 1), (2, 2, 2, 1)])
def test_the_executors_split_holds_the_parameters_the_estimate_counts(counts):
    """Cut the real model's chain of layers with split_layers and count the parameters of
    each stage's modules; the estimate, which never sees the modules, must agree."""
    model = build_model(SEVEN, seed=0)
    chain = model.pipeline_layers()                 # embeddings, 7 blocks, head
    pp = len(counts)
    held = []
    for k in range(pp):
        mods = [chain[j] for j in split_layers(len(chain), pp, k, first=1, last=1,
                                               stage_layers=counts)]
        assert sum(isinstance(x, type(model.blocks[0])) for x in mods) == counts[k]
        held.append(sum(p.numel() for p in nn.ModuleList(mods).parameters()))
    ranks = estimate_ranks(SEVEN, (B * M, T), "adam", "fp32", pp=pp, microbatches=M,
                           stage_layers=counts)
    assert [r.parameters // 4 for r in ranks] == held


def test_split_layers_names_a_bad_split():
    with pytest.raises(ValueError, match=r"stage_layers=\[4, 4\] sums to 8, but the model "
                                         r"has 7 layers"):
        split_layers(9, 2, 0, first=1, last=1, stage_layers=(4, 4))
    with pytest.raises(ValueError, match="choose a divisor of 7, or give stage_layers"):
        split_layers(9, 2, 0, first=1, last=1)


def test_the_verdict_in_words_names_unequal_stages():
    """96 layers on 64 stages are 32 stages of 2 and 32 of 1, not "64 stages of 1 layers"."""
    from parlab.hybrid import evaluate

    words = evaluate("GPT-3 175B", 2, 8, 64, 768).explain()
    assert "64 pipeline stages of 1 to 2 layers" in words
    assert "16 pipeline stages of 6 layers" in evaluate("GPT-3 175B", 8, 8, 16, 192).explain()
