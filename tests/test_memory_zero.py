"""ZeRO in the memory calculator: model_state_bytes and estimate/min_gpus(..., zero=)."""
import math

import pytest

from parlab import memory
from parlab.models import GPT3_175B, TINY, BookMLP, count_parameters
from parlab.units import GB

# Rajbhandari et al., 2020, Figure 1 / section 5: Psi = 7.5 B parameters, N_d = 64, K = 12
PSI, N_D, K = 7_500_000_000, 64, 12
PAPER_GB = {0: 120, 1: 31.4, 2: 16.6, 3: 1.9}  # as printed, rounded to 0.1 GB


def test_zero_matches_the_papers_worked_example():
    formulas = {0: (2 + 2 + K) * PSI,
                1: 2 * PSI + 2 * PSI + K * PSI / N_D,
                2: 2 * PSI + (2 + K) * PSI / N_D,
                3: (2 + 2 + K) * PSI / N_D}
    for stage in memory.ZERO_STAGES:
        states = memory.model_state_bytes(PSI, "adam", "bf16", dp=N_D, zero=stage)
        assert states.total == formulas[stage]  # 7.5e9 / 64 is a whole number: exact
        assert states.total / GB == pytest.approx(PAPER_GB[stage], abs=0.05 + 1e-9)


def test_zero_mixed_precision_adam_is_2_2_and_k_12():
    s = memory.model_state_bytes(1000, "adam", "fp16")
    assert (s.parameters, s.gradients, s.master_weights + s.optimizer_state) == (2000, 2000,
                                                                                  12_000)
    assert list(s.parts()) == ["parameters", "gradients", "master_weights", "optimizer_state"]
    assert s.total == sum(s.parts().values()) == 16 * 1000


def test_zero_each_stage_shards_one_more_part():
    n, dp = 10_000, 8
    stages = [memory.model_state_bytes(n, "adam", "bf16", dp, z) for z in memory.ZERO_STAGES]
    totals = [s.total for s in stages]
    assert totals == sorted(totals, reverse=True) and len(set(totals)) == 4
    shard = n // dp
    assert stages[1].optimizer_state == 8 * shard and stages[1].master_weights == 4 * shard
    assert stages[1].gradients == 2 * n and stages[2].gradients == 2 * shard
    assert stages[2].parameters == 2 * n and stages[3].parameters == 2 * shard


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_zero_on_one_rank_changes_nothing(optimizer, precision):
    parts = {memory.model_state_bytes(12_345, optimizer, precision, 1, z)
             for z in memory.ZERO_STAGES}
    assert len(parts) == 1


def test_zero_pads_every_shard_to_the_same_size():
    n, dp = 1001, 8  # 1001 = 8 x 125 + 1: each rank holds ceil(1001 / 8) = 126
    s = memory.model_state_bytes(n, "adam", "bf16", dp, zero=3)
    assert s.parameters == 2 * 126 and s.gradients == 2 * 126
    assert s.master_weights == 4 * 126 and s.optimizer_state == 8 * 126
    assert dp * s.total >= 16 * n  # the shards cover the whole, padding included
    assert memory.model_state_bytes(n + 7, "adam", "bf16", dp, 3) == s  # 1008 = 8 x 126
    huge = 2**60 + 1  # ceil is exact on ints too large for a float
    assert memory.model_state_bytes(huge, "sgd", "fp32", 3, 3).parameters == 4 * (
        2**60 // 3 + 1)


def test_zero_fp32_has_no_master_weights_and_sgd_no_optimizer_state():
    fp32 = memory.model_state_bytes(1000, "adam", "fp32", dp=4, zero=1)
    assert fp32.master_weights == 0
    assert (fp32.parameters, fp32.gradients, fp32.optimizer_state) == (4000, 4000, 8 * 250)
    sgd = memory.model_state_bytes(1000, "sgd", "bf16", dp=4, zero=1)
    assert sgd.optimizer_state == 0 and sgd.master_weights == 4 * 250
    plain = memory.model_state_bytes(1000, "sgd", "fp32", dp=4, zero=2)
    assert plain.parts() == {"parameters": 4000, "gradients": 1000, "master_weights": 0,
                             "optimizer_state": 0}
    assert memory.model_state_bytes(1000, "momentum", "fp32", 4, 3).optimizer_state == 4 * 250


@pytest.mark.parametrize("kwargs, message", [
    (dict(zero=4), r"zero must be a ZeRO stage, one of \[0, 1, 2, 3\].*got 4"),
    (dict(zero=-1), "zero must be a ZeRO stage"),
    (dict(zero=True), "zero must be a ZeRO stage"),
    (dict(zero="3"), "zero must be a ZeRO stage"),
    (dict(optimizer="lion"), r"unknown optimizer 'lion'; choose one of \['sgd', 'momentum'"),
    (dict(precision="fp8"), r"unknown precision 'fp8'; choose one of \['fp32', 'fp16', 'bf16'"),
    (dict(precision=["bf16"]), "unknown precision"),
    (dict(parameters=0), "parameters must be a positive integer, got 0"),
    (dict(parameters=1.5e9), "parameters must be a positive integer"),
    (dict(parameters=True), "parameters must be a positive integer, got True"),
    (dict(dp=0), "dp must be a positive integer, got 0"),
    (dict(dp=False), "dp must be a positive integer"),
    (dict(dp=2.0), "dp must be a positive integer"),
])
def test_zero_bad_input_is_a_clear_error(kwargs, message):
    args = dict(parameters=1000) | kwargs
    with pytest.raises(ValueError, match=message):
        memory.model_state_bytes(**args)


# -- estimate and min_gpus with zero= -------------------------------------------------------

def _layer_params(d, f):
    """Parameters of one block (count_parameters' formula, written out again)."""
    return 4 * d * d + 4 * d + 2 * d * f + f + d + 4 * d


#: GPT-3 on dp=8 x pp=2 with 2 micro-batches (1F1B): the first stage, holding the embeddings
#: and 2 micro-batches in flight, is the busiest, so estimate reports it
SPLIT = ((16, 2048), "adam", "bf16", 8, 1, 2, 2)


def _first_stage_parameters(c=GPT3_175B):
    return c.vocab * c.d_model + c.context * c.d_model + c.n_layers // 2 * _layer_params(
        c.d_model, c.d_ff)


def test_zero_0_estimate_is_todays_formula():
    n = count_parameters(TINY)["total"]
    for precision, element, master in (("fp32", 4, 0), ("bf16", 2, 4)):
        for optimizer, values in (("sgd", 0), ("momentum", 1), ("adam", 2)):
            b = memory.estimate(TINY, (2, 16), optimizer, precision, zero=0)
            assert (b.parameters, b.gradients) == (element * n, element * n)
            assert b.master_weights == master * n and b.optimizer_state == 4 * values * n
            assert b == memory.estimate(TINY, (2, 16), optimizer, precision)
    # a pipeline split: the first of 2 stages holds the embeddings and half the blocks
    b = memory.estimate(GPT3_175B, *SPLIT, zero=0)
    first = _first_stage_parameters()
    assert (b.parameters, b.gradients, b.master_weights, b.optimizer_state) == (
        2 * first, 2 * first, 4 * first, 8 * first)


@pytest.mark.parametrize("zero", memory.ZERO_STAGES)
def test_zero_in_estimate_shards_the_parameters_on_each_gpu(zero):
    first = _first_stage_parameters()
    shard = math.ceil(first / 8)  # dp = 8
    b = memory.estimate(GPT3_175B, *SPLIT, zero=zero)
    assert b.parameters == 2 * (shard if zero >= 3 else first)
    assert b.gradients == 2 * (shard if zero >= 2 else first)
    assert b.master_weights == 4 * (shard if zero >= 1 else first)
    assert b.optimizer_state == 8 * (shard if zero >= 1 else first)
    plain = memory.estimate(GPT3_175B, *SPLIT)
    assert b.activations == plain.activations  # ZeRO leaves the activations alone
    assert (f"ZeRO-{zero}" in b.label) == (zero > 0)


def test_zero_3_shards_what_is_left_after_padding_and_tensor_parallelism():
    n = count_parameters(TINY)["total"]
    b = memory.estimate(TINY, (8, 16), "adam", "bf16", dp=8, zero=3)
    assert b.parameters == 2 * math.ceil(n / 8) and b.total - b.activations == 16 * math.ceil(
        n / 8)
    assert n % 3  # padded: 3 ranks of ceil(n / 3)
    assert memory.estimate(TINY, (6, 16), "adam", "bf16", dp=3, zero=3).parameters == 2 * (
        n // 3 + 1)
    tp_plain = memory.estimate(TINY, (8, 16), "adam", "bf16", dp=8, tp=2)
    tp_zero = memory.estimate(TINY, (8, 16), "adam", "bf16", dp=8, tp=2, zero=3)
    assert tp_zero.parameters == 2 * math.ceil(tp_plain.parameters // 2 / 8)


def test_zero_lets_min_gpus_use_data_parallelism_for_the_model_states():
    plain = memory.min_gpus(GPT3_175B, (64, 2048), "adam", "bf16", microbatches=1)
    zero3 = memory.min_gpus(GPT3_175B, (64, 2048), "adam", "bf16", microbatches=1, zero=3)
    assert zero3.gpus <= plain.gpus and zero3.breakdown.fits
    assert zero3.ideal == plain.ideal <= zero3.gpus
    assert zero3.breakdown == memory.estimate(GPT3_175B, (64, 2048), "adam", "bf16", zero3.dp,
                                              zero3.tp, zero3.pp, zero=3)
    assert memory.min_gpus(TINY, (1, 16), zero=2).gpus == 1


def test_zero_bad_stage_in_estimate_and_min_gpus():
    for fn in (memory.estimate, memory.min_gpus):
        with pytest.raises(ValueError, match=r"zero must be a ZeRO stage, one of \[0, 1, 2, 3\]"):
            fn(TINY, (2, 16), zero=5)
    with pytest.raises(ValueError, match="dp must be a positive integer"):
        memory.estimate(BookMLP((4, 2)), (2,), dp=0, zero=1)
