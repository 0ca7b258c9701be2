"""How long a model's arithmetic takes on a GPU: the compute assumptions every cost model shares.

Training a transformer costs about 6 FLOPs per parameter per token: 2 in the forward pass
(a multiply and an add per weight) and 4 in the backward (the gradient with respect to the
input and with respect to the weight). The attention-score FLOPs, a few percent at the
chapter's sequence lengths, are left out, as in Kaplan et al. (2020).

A GPU does them at a share of its peak: ``MFU`` (model FLOPs utilization), 0.4 here, about
what large training runs report on H100s. Chapter 02's scaling figure and chapter 05's
planner both take their compute time from :func:`compute_seconds`.
"""

from __future__ import annotations

__all__ = ["H100_BF16_TFLOPS", "MFU", "FLOPS_PER_PARAMETER_TOKEN", "training_flops",
           "compute_seconds", "flops_seconds"]

#: NVIDIA's dense bf16 peak of an H100 SXM, TFLOP/s.
H100_BF16_TFLOPS = 989.0
#: The share of peak a GPU sustains in a training step's matrix multiplications.
MFU = 0.4
#: Forward (2) plus backward (4) FLOPs per parameter per token.
FLOPS_PER_PARAMETER_TOKEN = 6


def training_flops(params: float, tokens: float) -> float:
    """FLOPs of one forward and backward pass over ``tokens`` tokens: 6 x params x tokens."""
    return FLOPS_PER_PARAMETER_TOKEN * params * tokens


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
