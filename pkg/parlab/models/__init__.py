"""The models the chapters take apart: transformer configurations, the book-named MLP, a small CNN.

``transformer`` (GPT-2/GPT-3 configurations, their parameter counts, and a real decoder built
from the same numbers), ``llama`` (the same for a Llama-style decoder: RoPE, grouped-query
attention, SwiGLU, RMSNorm), ``hf`` (Hugging Face ``config.json`` files and published presets,
and ``get_config``, ``count_parameters`` and ``build_model``, which take a config of either
family or its name), ``book_mlp`` (the MLP whose training step keeps the book's names: W,
z, y, E, local and remote gradients), ``cnn`` (where a CNN's compute and parameters live),
``compute`` (FLOPs per token and the GPU-speed assumptions every cost model shares, with the
roofline share of that speed a micro-batch of n tokens reaches, and the token count
from which a product is compute-bound), ``kernels`` (one GPT layer's compute as its kernels: weight and score
products at the GPU's measured matmul speed and the roofline of their shapes, memory-bound
ops at its HBM bandwidth, byte by byte), ``compare``
(``max_difference``: how far two runs' tensors are apart), ``moe`` (a mixture-of-experts layer:
three routers, expert capacity and dropping, SwiGLU experts behind a swappable dispatcher),
``moe_balance`` (keeping experts evenly loaded: the Switch auxiliary loss and DeepSeek-V3's
router-bias update, their statistics added up over a process group). Imports only the bottom modules
of parlab (``checks``, ``hardware``).
"""

from parlab.models.transformer import (
    Attention, Block, CONFIGS, GPT, GPT2_SMALL, GPT3_175B, GPT3_6_7B, MLP, TINY, TransformerConfig
)
from parlab.models.ffn import SwiGLU
from parlab.models.llama import (
    Llama, LlamaAttention, LlamaBlock, LlamaConfig, RMSNorm, rotary_cos_sin
)
from parlab.models.hf import (
    build_model, count_parameters, DENSE_HF_CONFIGS, from_hf_config, get_config, HF_CONFIGS,
    HF_PRESETS,
    SUPPORTED_MODEL_TYPES
)
from parlab.models.book_mlp import (
    ACTIVATIONS, BOOK_NAMES, book_table, BookMLP, bytes_by_scaling, held_bytes, tensor_bytes
)
from parlab.models.cnn import (
    communication_per_layer, LayerProfile, profile, share_by_kind, SmallCNN
)
from parlab.models.compare import max_difference
from parlab.models.kernels import (
    attention_products, forward_written_bytes, head_seconds, layer_gemms, layer_time, LayerTime,
    MEMORY_OPS, memory_op_bytes, MemoryOp
)
from parlab.models.deepseek import count_deepseek_parameters, DeepSeekV3Config
from parlab.models.moe import (
    assign_slots, even_rows, expert_capacity, expert_parameters, LocalExperts, MoE, MoEConfig,
    Router, ROUTERS, route, Routing, RoutingStats
)
from parlab.models.moe_balance import (
    assignment_counts, BalancingLoss, BiasUpdate, load_balancing_loss, load_ratio,
    update_router_bias
)
from parlab.models.compute import (
    block_matmul_efficiency, block_matmuls, compute_bound_tokens, FLOPS_PER_PARAMETER_TOKEN,
    FORWARD_FLOPS_PER_PARAMETER_TOKEN, forward_flops, H100_BF16_TFLOPS, matmul_efficiency,
    matmul_rates, MFU, compute_seconds, flops_seconds, training_flops
)

__all__ = ["TransformerConfig", "count_parameters", "build_model", "GPT", "MLP", "Attention",
           "Block", "LlamaAttention", "LlamaBlock", "rotary_cos_sin", "CONFIGS",
           "get_config", "GPT2_SMALL", "GPT3_6_7B", "GPT3_175B", "TINY", "LlamaConfig", "Llama",
           "RMSNorm", "from_hf_config", "HF_PRESETS", "HF_CONFIGS", "DENSE_HF_CONFIGS", "SUPPORTED_MODEL_TYPES",
           "BookMLP", "ACTIVATIONS", "BOOK_NAMES", "book_table", "bytes_by_scaling", "held_bytes",
           "tensor_bytes", "SmallCNN", "LayerProfile", "profile", "share_by_kind",
           "communication_per_layer", "MFU", "FLOPS_PER_PARAMETER_TOKEN", "training_flops",
           "FORWARD_FLOPS_PER_PARAMETER_TOKEN", "forward_flops",
           "compute_seconds", "flops_seconds", "matmul_efficiency", "block_matmuls",
           "block_matmul_efficiency", "compute_bound_tokens", "matmul_rates", "max_difference",
           "MemoryOp", "MEMORY_OPS", "LayerTime", "layer_gemms", "attention_products",
           "memory_op_bytes", "forward_written_bytes", "layer_time", "head_seconds",
           "MoEConfig", "MoE", "Router", "ROUTERS", "route", "Routing", "RoutingStats",
           "expert_capacity", "assign_slots", "LocalExperts", "SwiGLU", "DeepSeekV3Config",
           "count_deepseek_parameters", "even_rows", "expert_parameters", "load_balancing_loss",
           "BalancingLoss", "update_router_bias", "BiasUpdate", "assignment_counts", "load_ratio"]
