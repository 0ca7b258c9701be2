"""Serving a model: weights and key/value cache only, and why GPT-3 needs several GPUs to answer."""
import math

import pytest

from parlab import memory
from parlab.models import get_config


def test_gpt3_weights_alone_exceed_one_gpu():
    s = memory.serving_bytes("GPT-3 175B", batch=1, seq=2048)
    d = 12288   # 96 blocks of 12 d^2 + 13 d, token and position embeddings, final norm
    params = 96 * (12 * d * d + 13 * d) + 50257 * d + 2048 * d + 2 * d
    assert s.weights == 2 * params                     # bf16, nothing else
    # K and V: 2 x 96 layers x 2,048 tokens x 12,288 features x 2 bytes
    assert s.kv_cache == 2 * 96 * 2048 * 12288 * 2
    assert s.gpus(80) == math.ceil((s.weights + s.kv_cache) / 80e9) > 1
    assert memory.serving_bytes("GPT-3 175B", batch=8).kv_cache == 8 * s.kv_cache


def test_grouped_query_attention_keeps_a_smaller_cache():
    llama = get_config("Llama-3-8B")
    s = memory.serving_bytes(llama, batch=2, seq=1024, precision="fp32")
    assert s.kv_cache == 2 * llama.n_layers * 2 * 1024 * (llama.d_model // 4) * 4  # 8 of 32
    assert "Llama-3-8B in fp32" in str(s)


@pytest.mark.parametrize("kwargs, message", [
    (dict(batch=0), "batch must be a positive integer, got 0"),
    (dict(seq=-1), "seq must be a positive integer, got -1"),
    (dict(precision="int3"), "unknown precision 'int3'"),
])
def test_bad_input_is_a_clear_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        memory.serving_bytes("GPT-3 175B", **kwargs)
    with pytest.raises(ValueError, match="gpu_memory_gb must be positive, got 0"):
        memory.serving_bytes("GPT-3 175B").gpus(0)
