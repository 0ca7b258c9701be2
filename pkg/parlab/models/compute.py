"""How long a model's arithmetic takes on a GPU: the compute assumptions every cost model shares.

Training a transformer costs about 6 FLOPs per parameter per token: 2 in the forward pass
(a multiply and an add per weight) and 4 in the backward (the gradient with respect to the
input and with respect to the weight). The attention-score FLOPs, a few percent at the
chapter's sequence lengths, are left out, as in Kaplan et al. (2020).

A GPU does them at a share of its peak: ``MFU`` (model FLOPs utilization), 0.4 here, about
what large training runs report on H100s. Chapter 02's scaling figure and chapter 05's
planner both take their compute time from :func:`compute_seconds`.

**Small micro-batches run slower.** The 0.4 holds for matrix products large enough to keep
the GPU's arithmetic busy. A linear layer multiplies the micro-batch's ``n`` tokens (an
``n x k`` matrix) by a ``k x m`` weight: ``2 n k m`` FLOPs for ``(n k + k m + n m)`` elements
read or written. With few tokens the weight is read for little arithmetic and the product
waits on memory. :func:`matmul_efficiency` is the *roofline* model of this (Williams,
Waterman and Patterson, "Roofline", CACM 2009): a product runs at the compute-bound speed
when its arithmetic intensity (FLOPs per byte moved) is at least the GPU's ridge point,
peak FLOP/s over memory bandwidth (H100 SXM, NVIDIA's datasheet: 989 TFLOP/s dense bf16
and 3.35 TB/s of HBM3, 295 FLOPs per byte), and at intensity / ridge of it below. The curve
rises with the micro-batch and saturates at 1; :func:`block_matmul_efficiency` weighs it
over the weight matrices one tensor-parallel rank multiplies in a transformer block. It is
an upper bound: near the ridge real kernels lose more (tiles that do not fill the GPU, kernel
launches), so it understates what small micro-batches cost, never overstates it. Chapter 05
measures the same shape with ``torch.matmul`` on the CPU.
"""

from __future__ import annotations

import math

from parlab.hardware import H100_BF16_TFLOPS, H100_HBM_TB_PER_S
from parlab.models.hf import get_config
from parlab.models.llama import LlamaConfig
from parlab.checks import check_count, check_positive_number

__all__ = ["MFU", "FLOPS_PER_PARAMETER_TOKEN", "FORWARD_FLOPS_PER_PARAMETER_TOKEN",
           "training_flops", "forward_flops", "compute_seconds", "flops_seconds",
           "matmul_efficiency", "compute_bound_tokens", "block_matmuls",
           "block_matmul_efficiency", "matmul_rates"]

#: The share of peak a GPU sustains in a training step's matrix multiplications.
MFU = 0.4
#: Forward FLOPs per parameter per token: a multiply and an add per weight.
FORWARD_FLOPS_PER_PARAMETER_TOKEN = 2
#: Forward (2) plus backward (4: the gradients of the input and of the weights) FLOPs per
#: parameter per token: the one training-FLOP formula every calculator builds on.
FLOPS_PER_PARAMETER_TOKEN = 3 * FORWARD_FLOPS_PER_PARAMETER_TOKEN


def training_flops(params: float, tokens: float) -> float:
    """FLOPs of one forward and backward pass over ``tokens`` tokens: 6 x params x tokens."""
    return FLOPS_PER_PARAMETER_TOKEN * params * tokens


def forward_flops(params: float, tokens: float) -> float:
    """FLOPs of the forward pass alone (what recomputation repeats): 2 x params x tokens."""
    return FORWARD_FLOPS_PER_PARAMETER_TOKEN * params * tokens


def compute_seconds(params: float, tokens: float, tflops: float = H100_BF16_TFLOPS,
                    mfu: float = MFU) -> float:
    """Seconds one GPU needs for :func:`training_flops` at ``tflops`` x ``mfu``."""
    return flops_seconds(training_flops(params, tokens), tflops, mfu)


def flops_seconds(flops: float, tflops: float = H100_BF16_TFLOPS, mfu: float = MFU) -> float:
    """Seconds one GPU needs for ``flops`` FLOPs at ``tflops`` x ``mfu`` (e.g. the forward
    work activation recomputation repeats)."""
    if not tflops > 0 or not 0 < mfu <= 1:
        raise ValueError(f"tflops must be positive and mfu in (0, 1], got {tflops!r} and {mfu!r}")
    return flops / (tflops * 1e12 * mfu)


def matmul_efficiency(tokens: int, k: int, m: int, element_bytes: int = 2,
                      tflops: float = H100_BF16_TFLOPS,
                      tb_per_s: float = H100_HBM_TB_PER_S) -> float:
    """Roofline share of the compute-bound speed for a ``(tokens x k) @ (k x m)`` product.

    ``min(1, intensity / ridge)``: intensity = 2 tokens k m FLOPs over ``element_bytes`` x
    (tokens k + k m + tokens m) bytes, ridge = ``tflops / tb_per_s`` FLOPs per byte. The
    backward pass's two products (input and weight gradients) have the same intensity.
    ``tb_per_s=math.inf`` switches the effect off (every product compute-bound).
    """
    for name, value in (("tokens", tokens), ("k", k), ("m", m), ("element_bytes", element_bytes),
                        ("tflops", tflops), ("tb_per_s", tb_per_s)):
        check_positive_number(name, value)
    if math.isinf(tb_per_s):
        return 1.0
    intensity = 2 * tokens * k * m / (element_bytes * (tokens * k + k * m + tokens * m))
    return min(1.0, intensity / (tflops / tb_per_s))


def compute_bound_tokens(k: int, m: int, element_bytes: int = 2,
                         tflops: float = H100_BF16_TFLOPS,
                         tb_per_s: float = H100_HBM_TB_PER_S) -> int | None:
    """The fewest tokens for which :func:`matmul_efficiency` calls a ``k x m`` product
    compute-bound (the roofline's knee), or None if no token count reaches the ridge.

    Intensity >= ridge R solves to n (2 k m - R e (k + m)) >= R e k m, e the element size:
    n = ceil(R e k m / (2 k m - R e (k + m))), then nudged so that it agrees with
    :func:`matmul_efficiency` to the last bit.
    """
    for name, value in (("k", k), ("m", m), ("element_bytes", element_bytes),
                        ("tflops", tflops), ("tb_per_s", tb_per_s)):
        check_positive_number(name, value)
    ridge = tflops / tb_per_s
    room = 2 * k * m - ridge * element_bytes * (k + m)
    if room <= 0:
        return None
    n = max(1, math.ceil(ridge * element_bytes * k * m / room))
    full = lambda t: matmul_efficiency(t, k, m, element_bytes, tflops, tb_per_s) >= 1
    while n > 1 and full(n - 1):
        n -= 1
    while not full(n):
        n += 1
    return n


def block_matmuls(config, tp: int = 1) -> list[tuple[int, int]]:
    """(k, m) of every weight product one of ``tp`` tensor-parallel ranks runs in a block.

    ``config``: a config or its name, as :func:`parlab.models.get_config` takes.
    Fused as Megatron-LM fuses them: Q, K and V in one product (GPT: d x 3d/tp; Llama:
    d x (heads + 2 key/value heads) d_head/tp), the output projection (d/tp x d), the first
    feed-forward product (d x d_ff/tp; Llama's SwiGLU gate and up together, d x 2 d_ff/tp)
    and the second (d_ff/tp x d): column-parallel, then row-parallel.
    """
    config = get_config(config)
    check_count("tp", tp, "tensor-parallel ranks")
    d, ff, heads = config.d_model, config.d_ff, config.n_heads
    llama = isinstance(config, LlamaConfig)
    if llama:
        config.check_modelled("block_matmuls")
    kv = config.n_kv_heads if llama else heads
    for name, n in (("heads", heads), ("key/value heads", kv), ("d_ff", ff)):
        if n % tp:
            raise ValueError(f"tp={tp} does not divide {config.name}'s {n} {name}")
    d_head = d // heads
    gated = 2 if llama else 1
    return [(d, (heads + 2 * kv) * d_head // tp), (heads * d_head // tp, d),
            (d, gated * ff // tp), (ff // tp, d)]


def block_matmul_efficiency(config, tokens: int, tp: int = 1, element_bytes: int = 2,
                            tflops: float = H100_BF16_TFLOPS,
                            tb_per_s: float = H100_HBM_TB_PER_S) -> float:
    """:func:`matmul_efficiency` over a block's products, weighted by their FLOPs.

    Compute-bound time over roofline time, summed over :func:`block_matmuls`: what one
    micro-batch of ``tokens`` tokens (sequences x length) gets of the compute-bound speed.
    """
    mats = block_matmuls(config, tp)
    flops = [k * m for k, m in mats]    # x 2 x tokens, the same for all: it cancels
    slowdown = [f / matmul_efficiency(tokens, k, m, element_bytes, tflops, tb_per_s)
                for f, (k, m) in zip(flops, mats)]
    return sum(flops) / sum(slowdown)


def matmul_rates(tokens=(1, 4, 16, 64, 256), k: int = 4096, m: int = 4096,
                 repeats: int = 2, dtype=None) -> list[tuple[int, float]]:
    """``(tokens, GFLOP/s)`` of ``torch.matmul`` on this machine's CPU for ``(tokens x k) @
    (k x m)``: the shape of the roofline, measured (best of ``repeats`` rounds after a warm-up;
    machine-dependent, and noisy on a busy machine). The default weight, 64 MiB (67 MB) in
    fp32, is larger than a CPU's caches, so a few tokens wait on memory as on a GPU."""
    import time

    import torch

    for name, value in (("k", k), ("m", m), ("repeats", repeats)):
        check_count(name, value)
    weight = torch.randn(k, m, dtype=dtype or torch.float32)
    rates = []
    for n in tokens:
        check_count("tokens", n, "each of the token counts")
        x = torch.randn(n, k, dtype=weight.dtype)
        flops = 2 * n * k * m
        calls = max(1, 2 ** 27 // flops)        # about 0.1 GFLOP per timed round at least
        best = math.inf
        for _ in range(repeats + 1):            # the first round warms up
            start = time.perf_counter()
            for _ in range(calls):
                torch.matmul(x, weight)
            best = min(best, (time.perf_counter() - start) / calls)
        rates.append((n, flops / best / 1e9))
    return rates
