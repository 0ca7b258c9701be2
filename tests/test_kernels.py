"""The kernel compute model (parlab.models.kernels, the planner's compute_model="kernels"),
by hand: the GPUs' measured matmul ceilings, one small GPT layer's products and bytes, the
seconds of a 22B layer, the check against Korthikanti et al.'s kept bytes, the 1/h trend of
the memory-bound share, and the flat model left as it was."""

import math

import pytest

from parlab.hardware import A100, GPUS, H100
from parlab.hybrid import KORTHIKANTI_2022, Assumptions, evaluate, predict_iteration
from parlab.hybrid.published_korthikanti_memory import paper_layer_bytes
from parlab.models import (
    MEMORY_OPS, TransformerConfig, attention_products, forward_written_bytes, head_seconds,
    layer_gemms, layer_time, memory_op_bytes
)

SMALL = TransformerConfig("small", 64, 2, 4, 256, 100, 32)   # h 64, 4 heads, d_ff 256


def _bytes(config, seq, tp, sp, phase, core=False):
    return sum(memory_op_bytes(op, config, seq, tp, sp) for op in MEMORY_OPS
               if op.phase == phase and (op.core or not core))


def test_measured_matmul_ceilings():
    """Bekman's MAMF table, bf16: A100 SXM 271.2 of 312 TFLOP/s (86.9 %), H100 SXM 794.5 of
    989 (80.3 %)."""
    assert (A100.matmul_tflops, H100.matmul_tflops) == (271.2, 794.5)
    assert round(100 * A100.matmul_share, 1) == 86.9
    assert round(100 * H100.matmul_share, 1) == 80.3
    assert all(g.matmul_tflops < g.bf16_tflops for g in GPUS.values())
    assert Assumptions(gpu="A100-80GB").matmul_tflops == 271.2
    assert Assumptions().matmul_tflops == 794.5
    assert Assumptions(matmul_tflops=200).matmul_tflops == 200


def test_small_layer_products_by_hand():
    """tp 2: QKV 64 x 96, output 32 x 64, d_ff 64 x 128 and 128 x 64, i.e. 12 h^2 / t
    multiply-adds per token; per sequence 2 heads of (32 x 16) @ (16 x 32) and
    (32 x 32) @ (32 x 16)."""
    assert layer_gemms(SMALL, 2) == [(64, 96), (32, 64), (64, 128), (128, 64)]
    assert sum(k * m for k, m in layer_gemms(SMALL, 2)) == 12 * 64 ** 2 // 2
    assert attention_products(SMALL, 32, 2) == [(2, 32, 16, 32), (2, 32, 32, 16)]


def test_small_layer_bytes_by_hand():
    """Per token, tp 2, s 32: h = 64 (replicated), h/t = 32, d_ff/t = 128, a s/t = 64.
    Forward: layer norms 2 x 4 h, softmax 4 x 64, dropout 5 x 64, transpose 4 x 32, GeLU
    4 x 128, bias + dropout + residual 2 x 7 h. Backward: 2 x 5 h, 2 x 6 h (gradient sums),
    2 x 6 h (layer norms), 6 x 128, 4 x 32, 5 x 64, 6 x 64. Sequence parallelism: h -> 32."""
    forward = 8 * 64 + 4 * 64 + 5 * 64 + 4 * 32 + 4 * 128 + 14 * 64
    backward = 10 * 64 + 12 * 64 + 12 * 64 + 6 * 128 + 4 * 32 + 5 * 64 + 6 * 64
    assert _bytes(SMALL, 32, 2, False, "forward") == forward == 2624
    assert _bytes(SMALL, 32, 2, False, "backward") == backward == 3776
    assert _bytes(SMALL, 32, 2, True, "forward") == forward - 22 * 32
    assert _bytes(SMALL, 32, 2, False, "forward", core=True) == 4 * 64 + 5 * 64 + 4 * 32


def test_22b_layer_seconds_by_hand():
    """Korthikanti et al.'s 22B layer (h 6144, 64 heads, tp 8, b 4, s 2048) on an A100:
    weight products compute-bound at 271.2 TFLOP/s, 2 n 12 h^2 / t FLOPs forward; score
    products at their roofline, intensity s d / (s + 2 d) = 87.8 FLOPs per byte (d 96)
    against the ridge 271.2 / 2.039; memory ops 22 h + 4 h/t + 4 d_ff/t + 9 a s/t bytes per
    token forward at 2.039 TB/s; selective recompute repeats the scores and the core's
    4 h/t + 9 a s/t."""
    h, a, t, b, s = 6144, 64, 8, 4, 2048
    run = KORTHIKANTI_2022[0]
    n = b * s
    lt = layer_time(run.config, b, s, t, False, "selective", True, 271.2, 2.039)
    assert lt.gemm == pytest.approx(2 * n * 12 * h ** 2 / t / 271.2e12)
    share = (s * 96 / (s + 2 * 96)) / (271.2 / 2.039)
    assert lt.scores == pytest.approx(4 * n * s * h / t / (271.2e12 * share))
    per_token = 22 * h + 4 * h // t + 4 * 4 * h // t + 9 * a * s // t
    assert lt.memory_forward == pytest.approx(n * per_token / 2.039e12)
    assert lt.recompute == pytest.approx(lt.scores + n * (4 * h / t + 9 * a * s / t) / 2.039e12)
    assert lt.backward == pytest.approx(2 * (lt.gemm + lt.scores) + lt.memory_backward)
    full = layer_time(run.config, b, s, t, False, "full", True, 271.2, 2.039)
    assert full.recompute == pytest.approx(lt.forward)
    off = layer_time(run.config, b, s, t, False, None, False, 271.2, 2.039)
    assert off.scores == 0 and off.recompute == 0
    # the output layer: three (n x h) @ (h x V/t) products, compute-bound
    assert head_seconds(run.config, n, t, 271.2, 2.039) == pytest.approx(
        3 * 2 * n * h * 51200 / t / 271.2e12)


@pytest.mark.parametrize("technique, t, sp", [("none", 1, False), ("tp", 8, False),
                                              ("tp+sp", 8, True)])
@pytest.mark.parametrize("run", KORTHIKANTI_2022, ids=lambda r: r.name)
def test_forward_writes_what_korthikanti_keeps(run, technique, t, sp):
    """Korthikanti et al. (2022), Table 2: a layer keeps s b h (34 + 5 a s/h) bytes (10 +
    24/t + 5 a s/(h t) under tp; 34/t + 5 a s/(h t) with sp). All of it is written in the
    forward: by the memory ops, and by the products Q, K, V and the first feed-forward's
    output, 14 h / t per token; nothing else is kept."""
    h, s, b = run.hidden, 2048, run.micro_batch
    written = forward_written_bytes(run.config, s, t, sp) + 14 * h / t
    assert written * s * b == paper_layer_bytes(run, technique)


def _share_by_formula(h, s=2048, d_head=128, matmul=271.2, hbm=2.039):
    """The memory-bound share of a layer (t = 1, d_ff = 4h, a = h / d_head), from the
    module's table: 104 h + 20 a s bytes per token forward and backward, against 72 h^2
    FLOPs of weight products (compute-bound) and 12 s h of score products at their roofline."""
    a = h // d_head
    memory = (104 * h + 20 * a * s) / (hbm * 1e12)
    share = min(1, s * d_head / (s + 2 * d_head) / (matmul / hbm))
    products = 72 * h ** 2 / (matmul * 1e12) + 12 * s * h / (matmul * 1e12 * share)
    return memory / (memory + products)


def test_memory_share_falls_as_one_over_h():
    """Memory bytes grow as h (with d_head fixed, a s grows as h too), product FLOPs as h^2:
    the memory-bound share of a layer falls about as 1/h, the trend of the flat model's
    misses on the published rows."""
    shares = []
    for h in (1024, 2048, 4096, 8192, 16384):
        config = TransformerConfig(f"h{h}", h, 1, h // 128, 4 * h, 51200, 2048)
        shares.append(layer_time(config, 1, 2048).memory_share)
        assert shares[-1] == pytest.approx(_share_by_formula(h))
    assert all(x > y for x, y in zip(shares, shares[1:]))
    # 35 % at h 1024 to 4.5 % at h 16384: memory over products falls as 1/h, the share
    # a little slower where memory is a large part of the layer
    assert 0.30 < shares[0] < 0.40 and 0.04 < shares[-1] < 0.05


def test_flat_is_unchanged_and_the_default():
    """GPT-2 small, one H100, 2 x 1024 tokens (compute-bound): compute = 6 N tokens at
    0.4 x 989 TFLOP/s, with compute_model left out or "flat"; "kernels" prices it otherwise."""
    from parlab.models import count_parameters
    job = dict(global_batch=2, seq=1024)
    default = evaluate("GPT-2 small", 1, 1, 1, 1, **job)
    flat = evaluate("GPT-2 small", 1, 1, 1, 1, compute_model="flat", **job)
    assert default.assumptions.compute_model == "flat"
    assert default.times == flat.times
    n = count_parameters("GPT-2 small")["total"]
    assert default.times["compute"] == pytest.approx(6 * n * 2048 / (0.4 * 989e12))
    kernels = evaluate("GPT-2 small", 1, 1, 1, 1, compute_model="kernels", **job)
    assert kernels.times["compute"] != default.times["compute"]
    assert 0 < kernels.achieved_mfu < H100.matmul_share


def test_bad_compute_model_and_non_gpt_are_errors():
    with pytest.raises(ValueError, match="compute_model must be one of"):
        Assumptions(compute_model="kernel")
    with pytest.raises(ValueError, match="matmul_tflops must be a positive"):
        Assumptions(matmul_tflops=0)
    with pytest.raises(ValueError, match="not a GPT"):
        evaluate("Llama-3-8B", 1, 1, 1, 1, global_batch=1, seq=1024, compute_model="kernels")


def test_kernel_rows_have_no_size_trend():
    """The published Korthikanti rows priced by their kernels: the error no longer grows with
    the model (the flat model's ran from +16 % on 22B to +65 % on 1T)."""
    errors = [predict_iteration(run, "full").time_error for run in KORTHIKANTI_2022]
    assert max(errors) - min(errors) < 0.10
    assert math.isclose(predict_iteration(KORTHIKANTI_2022[0], "full").layout.assumptions
                        .matmul_tflops, 271.2)
