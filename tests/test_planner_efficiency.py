"""Micro-batch size and GPU efficiency: the roofline curve rises and saturates, and the planner
weighs it against the bubble instead of always picking one sequence per micro-batch."""
import math

import pytest

from parlab.hardware import H100_BF16_TFLOPS, H100_HBM_TB_PER_S
from parlab.models import (
    CONFIGS, block_matmul_efficiency, block_matmuls, compute_bound_tokens, count_parameters,
    get_config, matmul_efficiency
)
from parlab.hybrid import Assumptions, evaluate, plan, search

RIDGE = H100_BF16_TFLOPS / H100_HBM_TB_PER_S       # FLOPs per byte


def _by_hand(n, k, m, e=2):
    """FLOPs over bytes moved, against the ridge, written out."""
    return min(1.0, (2 * n * k * m) / (e * (n * k + k * m + n * m)) / RIDGE)


def test_matmul_efficiency_is_the_roofline():
    for n, k, m in ((1, 4096, 4096), (64, 12288, 1536), (300, 1536, 12288), (4096, 8, 8)):
        assert matmul_efficiency(n, k, m) == pytest.approx(_by_hand(n, k, m))
    assert matmul_efficiency(10, 512, 512, element_bytes=4) == pytest.approx(
        _by_hand(10, 512, 512, 4))
    assert matmul_efficiency(1, 64, 64, tb_per_s=math.inf) == 1.0


def test_efficiency_rises_with_the_micro_batch_and_saturates():
    config = CONFIGS["GPT-3 175B"]
    curve = [block_matmul_efficiency(config, 2 ** i, tp=8) for i in range(4, 14)]
    assert all(a < b for a, b in zip(curve, curve[1:]) if a < 1)
    assert curve[0] < 0.1 and curve[-1] == 1.0
    # one 2,048-token sequence already keeps every weight product of GPT-3 compute-bound
    assert block_matmul_efficiency(config, 2048, tp=8) == 1.0
    # the smallest product of a block at tp=8 (k x m = 1,536 x 12,288) sets the knee:
    k, m = 12288 // 8, 12288
    knee = math.ceil(RIDGE * k * m / (k * m - RIDGE * (k + m)))
    assert block_matmul_efficiency(config, knee, tp=8) == 1.0
    assert block_matmul_efficiency(config, knee - 1, tp=8) < 1.0


def test_compute_bound_tokens_is_the_knee():
    # n k m / (n k + k m + n m) = ridge (2-byte elements), solved for n by hand
    for k, m in ((1536, 12288), (12288, 1536), (4096, 4096), (512, 2048)):
        knee = math.ceil(RIDGE * k * m / (k * m - RIDGE * (k + m)))
        assert compute_bound_tokens(k, m) == knee
        assert _by_hand(knee, k, m) == 1.0 and _by_hand(knee - 1, k, m) < 1.0
    # a weight too thin for any token count to reach the ridge: intensity < k m / (k + m)
    assert compute_bound_tokens(256, 256) is None
    assert compute_bound_tokens(8, 8, tb_per_s=math.inf) == 1


def test_block_matmuls_cover_every_weight_of_a_block():
    for name in ("GPT-3 175B", "Llama-3-8B"):
        config = get_config(name)
        counts = count_parameters(config)
        weights = sum(k * m for k, m in block_matmuls(config))
        # the block's parameters are its weight matrices plus biases and norms (small)
        assert 0.99 * counts["block"] < weights <= counts["block"]
        for tp in (2, 8):
            assert sum(k * m for k, m in block_matmuls(config, tp)) * tp == weights
    with pytest.raises(ValueError, match="tp=5 does not divide GPT-3 175B's 96 heads"):
        block_matmuls(get_config("GPT-3 175B"), 5)
    with pytest.raises(ValueError, match="tp=16 does not divide Llama-3-8B's 8 key/value"):
        block_matmuls(get_config("Llama-3-8B"), 16)


def test_gpt3_on_1024_gpus_still_plans_and_b1_is_no_artifact():
    best = plan("GPT-3 175B", 1024, 80)[0]
    assert best.micro_batch == 1 and best.efficiency == 1.0


def test_short_sequences_make_the_planner_pick_larger_micro_batches():
    job = dict(seq=256, global_batch=12288)          # GPT-3's tokens per step, 256 at a time
    with_roofline = search("GPT-3 175B", 1024, 80, **job)
    without = search("GPT-3 175B", 1024, 80, gpu_tb_per_s=math.inf, **job)
    assert without.ranked[0].micro_batch == 1        # the old artifact: always one sequence
    best = with_roofline.ranked[0]
    assert best.micro_batch > 1
    # one sequence of 256 tokens at the winner's tp runs below compute-bound speed
    one = evaluate("GPT-3 175B", best.dp, best.tp, best.pp, 12288 // best.dp, **job)
    assert one.efficiency < 1
    config, a = get_config("GPT-3 175B"), Assumptions(**job)
    flops = 6 * count_parameters(config)["total"] * 12288 * 256 / 1024
    assert one.times["compute"] == pytest.approx(
        flops / (a.gpu_tflops * 1e12 * a.mfu * one.efficiency))
    assert 0 < one.achieved_mfu < a.mfu * one.efficiency


@pytest.mark.parametrize("kwargs, message", [
    (dict(gpu_tb_per_s=0), "gpu_tb_per_s must be a positive memory bandwidth in TB/s"),
    (dict(gpu_tb_per_s="fast"), "gpu_tb_per_s must be a positive"),
])
def test_bad_bandwidth_is_a_clear_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Assumptions(**kwargs)


def test_bad_matmul_sizes_are_clear_errors():
    with pytest.raises(ValueError, match="tokens must be a positive number, got 0"):
        matmul_efficiency(0, 4, 4)
    with pytest.raises(ValueError, match="tb_per_s must be a positive number, got -1"):
        matmul_efficiency(4, 4, 4, tb_per_s=-1)


def test_matmul_rates_measure_something_and_refuse_bad_sizes():
    from parlab.models import matmul_rates
    rates = matmul_rates(tokens=(1, 8), k=64, m=64, repeats=1)
    assert [n for n, _ in rates] == [1, 8] and all(r > 0 for _, r in rates)
    with pytest.raises(ValueError, match="tokens must be a positive integer .*got 0"):
        matmul_rates(tokens=(0,), k=8, m=8)
    with pytest.raises(ValueError, match="k must be a positive integer"):
        matmul_rates(k=0)
