"""What serving a trained model needs on GPUs: its weights and its key/value cache.

Why this module exists: the book says a model needs no pipeline parallelism to answer
questions, because generation runs one token after another. Generation is sequential, but
the memory is not smaller for it: the weights still have to sit on GPUs, and with them the
*key/value cache*, the K and V vectors of every token generated so far, kept in every
layer so that the next token does not recompute them. :func:`serving_bytes` counts both,
with no gradients, no optimizer state and no master weights (nothing trains). When they do
not fit one GPU the model is split for serving too: tensor parallelism inside a server,
pipeline stages across servers, as serving systems such as vLLM and NVIDIA's TensorRT-LLM
offer.

KV cache: 2 (K and V) x layers x sequences x tokens x key/value heads x d_head elements (a
Llama's grouped-query attention keeps fewer key/value heads than query heads).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from parlab.hardware import GPU_MEMORY_GB
from parlab.memory.states import check_precision
from parlab.models import LlamaConfig, count_parameters, get_config
from parlab.units import GB
from parlab.checks import check_count

__all__ = ["Serving", "serving_bytes"]


@dataclass(frozen=True)
class Serving:
    """Bytes to serve ``batch`` sequences of ``seq`` tokens: weights and key/value cache."""

    model: str
    precision: str
    batch: int
    seq: int
    weights: int
    kv_cache: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache

    def gpus(self, gpu_memory_gb: float = GPU_MEMORY_GB) -> int:
        """The fewest GPUs of ``gpu_memory_gb`` that hold it, split perfectly evenly."""
        if isinstance(gpu_memory_gb, bool) or not isinstance(gpu_memory_gb, (int, float)) \
                or not gpu_memory_gb > 0:
            raise ValueError(f"gpu_memory_gb must be positive, got {gpu_memory_gb!r}")
        return math.ceil(self.total / (gpu_memory_gb * GB))

    def __str__(self) -> str:
        return (f"{self.model} in {self.precision}, {self.batch} x {self.seq} tokens: weights "
                f"{self.weights / GB:,.1f} GB + KV cache {self.kv_cache / GB:,.1f} GB = "
                f"{self.total / GB:,.1f} GB")


def serving_bytes(model, batch: int = 1, seq: int | None = None,
                  precision: str = "bf16") -> Serving:
    """Weights and key/value cache of ``model`` (a GPT or Llama config, or its name) serving
    ``batch`` sequences of ``seq`` tokens (default: the model's context) in ``precision``.
    ``batch=0`` is not allowed; for the weights alone read ``.weights``."""
    config = get_config(model)
    check_count("batch", batch)
    seq = config.context if seq is None else seq
    check_count("seq", seq)
    e = check_precision(precision).bytes
    kv_heads = config.n_kv_heads if isinstance(config, LlamaConfig) else config.n_heads
    d_head = config.d_model // config.n_heads
    weights = count_parameters(config)["total"] * e
    kv_cache = 2 * config.n_layers * batch * seq * kv_heads * d_head * e
    return Serving(config.name, precision, batch, seq, weights, kv_cache)
