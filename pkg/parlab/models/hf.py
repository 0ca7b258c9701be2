"""Hugging Face ``config.json`` files, published presets, and the functions that take any config.

Why this module exists: a model on the Hugging Face Hub is described by a ``config.json``;
:func:`from_hf_config` reads one (a dict, or the path of the file) and returns our config for
it, so the memory and parallelism arithmetic of the chapters can run on the models people
actually train. ``model_type`` picks the family:

- ``"gpt2"``: a :class:`~parlab.models.transformer.TransformerConfig` (n_embd, n_layer,
  n_head, n_inner or 4 n_embd, vocab_size, n_positions, tie_word_embeddings, default True);
- ``"llama"`` and ``"mistral"`` (the same shape): a :class:`~parlab.models.llama.LlamaConfig`
  (hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads or the number of
  heads, intermediate_size, vocab_size, max_position_embeddings, tie_word_embeddings (default
  False), rope_theta, rms_norm_eps, attention_bias, mlp_bias);
- ``"mixtral"``: the same, with a mixture of experts in every block (num_local_experts
  experts of intermediate_size each, num_experts_per_tok per token);
- ``"qwen3_moe"``: the same again (num_experts experts of moe_intermediate_size each), with
  head_dim heads (not hidden_size / heads) and an RMSNorm on each head's query and key;
- ``"deepseek_v3"``: a :class:`~parlab.models.deepseek.DeepSeekV3Config`, counted but not
  built (multi-head latent attention).

Fields that change no parameter are not kept: ``rope_scaling`` (Llama 3.1+), Mistral's
``sliding_window`` (the built model attends to the whole context), dropout, token ids.

:data:`HF_PRESETS` holds the published ``config.json`` of a few models (the fields that shape
the model); :data:`HF_CONFIGS` is them parsed. :func:`get_config` finds a name in
:data:`~parlab.models.transformer.CONFIGS` or in :data:`HF_CONFIGS` (and reads a config dict
or a ``config.json`` path), and :func:`count_parameters` and :func:`build_model` take a
config of either family, or anything :func:`get_config` reads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from parlab.models.deepseek import count_deepseek_parameters, DeepSeekV3Config
from parlab.models.llama import LlamaConfig, build_llama, count_llama_parameters
from parlab.models.transformer import CONFIGS, TransformerConfig, build_gpt, count_gpt_parameters

__all__ = ["from_hf_config", "HF_PRESETS", "HF_CONFIGS", "DENSE_HF_CONFIGS", "get_config", "count_parameters",
           "build_model", "SUPPORTED_MODEL_TYPES"]

#: The published config.json of a few models (huggingface.co/<repo>/blob/main/config.json),
#: the fields that shape the model; parsed in :data:`HF_CONFIGS`.
HF_PRESETS: dict[str, dict] = {
    "gpt2": {  # openai-community/gpt2: GPT-2 small, 124 M
        "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
        "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768,
        "n_head": 12, "n_layer": 12, "n_positions": 1024, "vocab_size": 50257},
    "Llama-2-7B": {  # meta-llama/Llama-2-7b-hf
        "architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
        "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "llama",
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
        "rms_norm_eps": 1e-05, "rope_scaling": None, "tie_word_embeddings": False,
        "torch_dtype": "float16", "vocab_size": 32000},
    "Llama-3-8B": {  # meta-llama/Meta-Llama-3-8B
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "hidden_act": "silu",
        "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 8192,
        "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_scaling": None,
        "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "vocab_size": 128256},
    "Llama-3.2-1B": {  # meta-llama/Llama-3.2-1B
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "head_dim": 64,
        "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 8192,
        "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
        "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "vocab_size": 128256},
    "Llama-3.1-405B": {  # meta-llama/Llama-3.1-405B
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "hidden_act": "silu",
        "hidden_size": 16384, "intermediate_size": 53248, "max_position_embeddings": 131072,
        "mlp_bias": False, "model_type": "llama", "num_attention_heads": 128,
        "num_hidden_layers": 126, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "vocab_size": 128256},
    "Mistral-7B": {  # mistralai/Mistral-7B-v0.1
        "architectures": ["MistralForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
        "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 32000},
    "Mixtral-8x7B": {  # mistralai/Mixtral-8x7B-v0.1
        "architectures": ["MixtralForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
        "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
        "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "num_local_experts": 8, "rms_norm_eps": 1e-05,
        "rope_theta": 1e6, "router_aux_loss_coef": 0.02, "sliding_window": None,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 32000},
    "Qwen3-30B-A3B": {  # Qwen/Qwen3-30B-A3B
        "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False,
        "decoder_sparse_step": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
        "intermediate_size": 6144, "max_position_embeddings": 40960, "mlp_only_layers": [],
        "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": True,
        "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
        "num_hidden_layers": 48, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "vocab_size": 151936},
    "DeepSeek-V3": {  # deepseek-ai/DeepSeek-V3
        "architectures": ["DeepseekV3ForCausalLM"], "first_k_dense_replace": 3,
        "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432,
        "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3",
        "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8,
        "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
        "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
        "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
        "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
        "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16", "v_head_dim": 128, "vocab_size": 129280},
}


def _gpt2(cfg: dict, name: str, need, opt) -> TransformerConfig:
    d = need("n_embd")
    return TransformerConfig(name, d, need("n_layer"), need("n_head"), opt("n_inner", 4 * d),
                             need("vocab_size"), need("n_positions"),
                             opt("tie_word_embeddings", True))


def _llama(cfg: dict, name: str, need, opt) -> LlamaConfig:
    if opt("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act={cfg['hidden_act']!r}: the MLP built here is SwiGLU "
                         f"(silu)")
    heads = need("num_attention_heads")
    n_experts, per_token, expert_width = _experts(cfg, need, opt)
    return LlamaConfig(
        name, need("hidden_size"), need("num_hidden_layers"), heads,
        opt("num_key_value_heads", heads), expert_width or need("intermediate_size"),
        need("vocab_size"), need("max_position_embeddings"), opt("tie_word_embeddings", False),
        opt("rope_theta", 10000.0), opt("rms_norm_eps", 1e-6), opt("attention_bias", False),
        opt("mlp_bias", False), n_experts, per_token, opt("head_dim", 0),
        cfg.get("model_type") == "qwen3_moe")


def _experts(cfg: dict, need, opt) -> tuple[int, int, int]:
    """(n_experts, experts_per_token, expert width or 0) of a Mixtral or Qwen3-MoE config;
    (0, 0, 0) for a dense one."""
    kind = cfg.get("model_type")
    if kind == "mixtral":
        return need("num_local_experts"), need("num_experts_per_tok"), 0
    if kind != "qwen3_moe":
        return 0, 0, 0
    if opt("decoder_sparse_step", 1) != 1 or opt("mlp_only_layers", []):
        raise ValueError("layers with a dense MLP (decoder_sparse_step > 1 or mlp_only_layers) "
                         "are not modelled: every block here is a mixture of experts")
    if not opt("norm_topk_prob", False):
        raise ValueError("norm_topk_prob=False (gates not renormalized) is not modelled; the "
                         "router built here renormalizes the top-k probabilities")
    return need("num_experts"), need("num_experts_per_tok"), need("moe_intermediate_size")


def _deepseek(cfg: dict, name: str, need, opt) -> DeepSeekV3Config:
    if opt("moe_layer_freq", 1) != 1:
        raise ValueError("moe_layer_freq other than 1 is not modelled: every block after the "
                         "first_k_dense_replace dense ones is a mixture of experts")
    return DeepSeekV3Config(
        name, need("hidden_size"), need("num_hidden_layers"), opt("first_k_dense_replace", 0),
        need("intermediate_size"), need("moe_intermediate_size"), need("n_routed_experts"),
        opt("n_shared_experts", 0), need("num_experts_per_tok"), need("vocab_size"),
        need("num_attention_heads"), need("q_lora_rank"), need("kv_lora_rank"),
        need("qk_nope_head_dim"), need("qk_rope_head_dim"), need("v_head_dim"),
        opt("tie_word_embeddings", False))


_PARSERS = {"gpt2": _gpt2, "llama": _llama, "mistral": _llama, "mixtral": _llama,
            "qwen3_moe": _llama, "deepseek_v3": _deepseek}
#: The ``model_type`` values :func:`from_hf_config` reads.
SUPPORTED_MODEL_TYPES = tuple(_PARSERS)


def _read(path: str | os.PathLike) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no Hugging Face config at {str(path)!r} (expected a "
                                f"config.json file; the published presets are in HF_PRESETS: "
                                f"{list(HF_PRESETS)})")
    try:
        cfg = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{str(path)!r} is not a JSON config: {err}") from err
    if not isinstance(cfg, dict):
        raise ValueError(f"{str(path)!r} holds a JSON {type(cfg).__name__}, not an object")
    return cfg


def from_hf_config(config: dict | str | os.PathLike,
                   name: str | None = None) -> TransformerConfig | LlamaConfig:
    """Our config for a Hugging Face ``config.json``: the dict itself, or its path (or folder).

    ``name`` defaults to the config's ``_name_or_path``, else its ``model_type``. An unknown
    ``model_type``, a missing field, or a bad value is a ValueError that names it.
    """
    cfg = config if isinstance(config, dict) else _read(config)
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or model_type not in _PARSERS:
        raise ValueError(f"unsupported model_type {model_type!r}; supported: "
                         f"{list(SUPPORTED_MODEL_TYPES)}")
    name = name or cfg.get("_name_or_path") or model_type

    def need(field):
        if cfg.get(field) is None:
            raise ValueError(f"{model_type} config {name!r} is missing the required field "
                             f"{field!r}")
        return cfg[field]

    def opt(field, default):  # absent or null: Hugging Face's default
        return default if cfg.get(field) is None else cfg[field]

    try:
        return _PARSERS[model_type](cfg, name, need, opt)
    except ValueError as err:
        if str(err).startswith(f"{model_type} config"):
            raise
        raise ValueError(f"{model_type} config {name!r}: {err}") from err


#: :data:`HF_PRESETS` parsed, by the same names; kept apart from ``CONFIGS`` (GPTs only).
HF_CONFIGS: dict[str, TransformerConfig | LlamaConfig] = {
    n: from_hf_config(cfg, name=n) for n, cfg in HF_PRESETS.items()}
#: The dense ones: what the memory and speed calculators model so far (not Mixtral's experts).
DENSE_HF_CONFIGS = {n: c for n, c in HF_CONFIGS.items() if not getattr(c, "n_experts", 0)}


def get_config(name) -> TransformerConfig | LlamaConfig:
    """A config: the config itself; a name (as in ``CONFIGS`` or :data:`HF_CONFIGS`); a
    Hugging Face ``config.json`` as a dict, or its path (a ``Path``, or a string naming a file
    or folder that exists, or ending in ``.json``), read by :func:`from_hf_config`."""
    if isinstance(name, (TransformerConfig, LlamaConfig, DeepSeekV3Config)):
        return name
    if isinstance(name, dict) or isinstance(name, os.PathLike):
        return from_hf_config(name)
    if not isinstance(name, str):
        raise TypeError(f"a model is a config, its name, a Hugging Face config dict or the "
                        f"path of a config.json, got {type(name).__name__}")
    for known in (CONFIGS, HF_CONFIGS):
        if name in known:
            return known[name]
    if name.endswith(".json") or Path(name).exists():
        return from_hf_config(name)
    raise ValueError(f"unknown model {name!r}; known: {list(CONFIGS) + list(HF_CONFIGS)} (or a "
                     f"Hugging Face config dict, or the path of its config.json)")


def count_parameters(config: TransformerConfig | LlamaConfig | str) -> dict[str, int]:
    """Parameters of ``build_model(config)``, part by part, from the config alone.

    The same keys for every family: ``attention``, ``feed_forward``, ``layer_norms``,
    ``block``, ``blocks``, ``token_embedding``, ``position_embedding``, ``final_norm``,
    ``lm_head``, ``total``, ``active`` (what one token uses), ``routed_experts`` (what
    expert parallelism divides), ``tensors`` (see ``count_gpt_parameters`` and
    ``count_llama_parameters`` for what each holds).
    """
    config = get_config(config)
    if isinstance(config, LlamaConfig):
        return count_llama_parameters(config)
    if isinstance(config, DeepSeekV3Config):
        return count_deepseek_parameters(config)
    return count_gpt_parameters(config)


def build_model(config: TransformerConfig | LlamaConfig | str, seed: int | None = 0,
                dtype: torch.dtype = torch.float32, device="cpu") -> nn.Module:
    """A real, randomly initialised model for ``config``: a ``GPT`` or a ``Llama``.

    Both have ``.blocks`` (an ``nn.ModuleList``), ``.lm_head`` and ``.loss(ids, targets)``.
    """
    config = get_config(config)
    if isinstance(config, DeepSeekV3Config):
        raise ValueError(f"{config.name} is counted (count_parameters), not built: its "
                         f"multi-head latent attention is not among the blocks built here")
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype such as torch.float32 or torch.bfloat16, "
                        f"got {dtype!r}")
    if isinstance(config, LlamaConfig):
        return build_llama(config, seed=seed, dtype=dtype, device=device)
    return build_gpt(config, seed=seed, dtype=dtype, device=device)
