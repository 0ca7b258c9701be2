"""Hugging Face configs: published totals from config.json alone, and a real Llama-style decoder."""
import json
import math
import time

import pytest
import torch

from parlab.models import (
    block_matmuls,
    CONFIGS, GPT, GPT2_SMALL, HF_CONFIGS, HF_PRESETS, Llama, LlamaConfig, RMSNorm,
    SUPPORTED_MODEL_TYPES, TransformerConfig, build_model, count_parameters, from_hf_config,
    get_config
)

#: Totals as published (model cards, or ``sum(p.numel())`` of the Hugging Face checkpoint).
PUBLISHED = {"gpt2": 124_439_808, "Llama-2-7B": 6_738_415_616, "Llama-3-8B": 8_030_261_248,
             "Llama-3.2-1B": 1_235_814_400, "Mistral-7B": 7_241_732_096,
             "Mixtral-8x7B": 46_702_792_704, "Llama-3.1-405B": 405_853_388_800}

SMALL = LlamaConfig("small", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48, vocab=64,
                    context=16)


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_totals_from_config_json(name):
    assert count_parameters(from_hf_config(HF_PRESETS[name]))["total"] == PUBLISHED[name]
    assert count_parameters(name)["total"] == PUBLISHED[name]   # by name, through get_config


def test_gpt2_config_is_our_gpt2_small():
    config = from_hf_config(HF_PRESETS["gpt2"])
    assert isinstance(config, TransformerConfig)
    assert config == GPT2_SMALL.replace(name="gpt2")
    assert config.d_ff == 4 * 768                                 # n_inner absent: 4 n_embd
    assert from_hf_config({**HF_PRESETS["gpt2"], "n_inner": 1000}).d_ff == 1000
    assert not from_hf_config({**HF_PRESETS["gpt2"], "tie_word_embeddings": False}) \
        .tied_embeddings


def test_llama_fields_and_defaults():
    c = get_config("Llama-3-8B")
    assert c is HF_CONFIGS["Llama-3-8B"]
    assert (c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.d_ff, c.vocab, c.context) == \
        (4096, 32, 32, 8, 14336, 128256, 8192)
    assert c.rope_theta == 500000.0 and c.rms_norm_eps == 1e-5 and not c.tied_embeddings
    assert get_config("Llama-3.2-1B").tied_embeddings
    bare = {k: v for k, v in HF_PRESETS["Llama-2-7B"].items()
            if k not in ("num_key_value_heads", "tie_word_embeddings", "rms_norm_eps")}
    parsed = from_hf_config(bare, name="bare")
    assert parsed.name == "bare"
    assert parsed.n_kv_heads == parsed.n_heads == 32              # no kv heads: plain MHA
    assert not parsed.tied_embeddings and parsed.rope_theta == 10000.0
    assert parsed.rms_norm_eps == 1e-6
    assert from_hf_config({**bare, "_name_or_path": "me/model"}).name == "me/model"
    assert get_config("Mistral-7B") == from_hf_config(HF_PRESETS["Mistral-7B"], "Mistral-7B")


def test_hf_presets_stay_out_of_configs():
    assert all(isinstance(c, TransformerConfig) for c in CONFIGS.values())
    assert not set(HF_CONFIGS) & set(CONFIGS)
    assert get_config(SMALL) is SMALL


def test_llama_count_parts():
    c = get_config("Llama-3-8B")
    counts = count_parameters(c)
    d, kv = 4096, 8 * 128
    assert counts["attention"] == 2 * d * d + 2 * d * kv           # q, o: d x d; k, v: d x d_kv
    assert counts["feed_forward"] == 3 * d * 14336
    assert counts["layer_norms"] == 2 * d and counts["final_norm"] == d
    assert counts["position_embedding"] == 0                        # RoPE has no parameters
    assert counts["lm_head"] == counts["token_embedding"] == 128256 * d
    assert counts["blocks"] == 32 * counts["block"]
    assert count_parameters(c.replace(tied_embeddings=True))["lm_head"] == 0
    assert set(counts) == set(count_parameters(GPT2_SMALL))


@pytest.mark.parametrize("config", [
    SMALL, SMALL.replace(tied_embeddings=True), SMALL.replace(n_kv_heads=4),
    SMALL.replace(n_kv_heads=1, attention_bias=True, mlp_bias=True)])
def test_count_equals_the_real_module(config):
    model = build_model(config)
    counts = count_parameters(config)
    assert isinstance(model, Llama) and isinstance(model.blocks, torch.nn.ModuleList)
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    assert counts["tensors"] == len(list(model.parameters()))
    block = model.blocks[0]
    assert sum(p.numel() for p in block.attn.parameters()) == counts["attention"]
    assert sum(p.numel() for p in block.mlp.parameters()) == counts["feed_forward"]
    assert (model.lm_head.weight is model.embed_tokens.weight) == config.tied_embeddings


def test_build_model_still_builds_a_gpt():
    assert isinstance(build_model("tiny"), GPT)
    assert isinstance(build_model(HF_CONFIGS["gpt2"].replace(n_layers=1), device="meta"), GPT)


def test_a_7b_model_builds_on_meta_at_once():
    start = time.perf_counter()
    model = build_model("Llama-2-7B", device="meta", dtype=torch.bfloat16)
    seconds = time.perf_counter() - start
    print(f"Llama-2-7B on meta in {seconds:.3f} s")
    assert seconds < 30     # the bound; about 0.1 s idle: nothing is allocated
    params = list(model.parameters())
    assert all(p.is_meta and p.dtype == torch.bfloat16 for p in params)
    assert sum(p.numel() for p in params) == PUBLISHED["Llama-2-7B"]
    assert len(model.blocks) == 32


def test_model_is_causal_and_trains():
    model = build_model(SMALL)
    idx = torch.randint(0, SMALL.vocab, (2, 8))
    changed = idx.clone()
    changed[:, -1] = (changed[:, -1] + 1) % SMALL.vocab
    with torch.no_grad():
        a, b = model(idx), model(changed)
    assert a.shape == (2, 8, SMALL.vocab)
    assert torch.allclose(a[:, :-1], b[:, :-1], atol=1e-6)   # the past cannot see the future
    assert not torch.allclose(a[:, -1], b[:, -1])
    loss = model.loss(idx, idx)
    assert loss.item() == pytest.approx(math.log(SMALL.vocab), rel=0.5)
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    with pytest.raises(ValueError, match="exceeds the context"):
        model(torch.zeros(1, SMALL.context + 1, dtype=torch.long))


def _rope(x, theta):
    """Rotary embedding written independently: pair (x[i], x[i + d/2]) as one complex number,
    turned by position * theta ** (-2 i / d)."""
    t, d = x.shape[-2], x.shape[-1]
    i = torch.arange(d // 2, dtype=torch.float64)
    angle = torch.arange(t, dtype=torch.float64)[:, None] * theta ** (-2 * i / d)
    z = torch.complex(x[..., :d // 2].double(), x[..., d // 2:].double()) * torch.polar(
        torch.ones_like(angle), angle)
    return torch.cat((z.real, z.imag), dim=-1).float()


def _reference_attention(attn, x, config):
    """One attention layer with plain torch ops: RoPE, repeated kv heads, masked softmax."""
    b, t, d = x.shape
    h, kv, hd = config.n_heads, config.n_kv_heads, config.d_head
    q = (x @ attn.q_proj.weight.T).view(b, t, h, hd).transpose(1, 2)
    k = (x @ attn.k_proj.weight.T).view(b, t, kv, hd).transpose(1, 2)
    v = (x @ attn.v_proj.weight.T).view(b, t, kv, hd).transpose(1, 2)
    q, k = _rope(q, config.rope_theta), _rope(k, config.rope_theta)
    k, v = k.repeat_interleave(h // kv, dim=1), v.repeat_interleave(h // kv, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(hd)
    scores = scores + torch.full((t, t), float("-inf")).triu(1)
    out = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, t, d)
    return out @ attn.o_proj.weight.T


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_attention_equals_a_hand_written_reference(n_kv_heads):
    config = SMALL.replace(n_kv_heads=n_kv_heads, rope_theta=500.0)
    attn = build_model(config, seed=1).blocks[0].attn
    x = torch.randn(3, 10, config.d_model)
    with torch.no_grad():
        out = attn(x)
        assert out.shape == x.shape
        assert torch.allclose(out, _reference_attention(attn, x, config), atol=1e-5)


def test_grouped_query_attention_is_mha_with_shared_kv_heads():
    """GQA equals multi-head attention whose k and v heads are copied to their query group."""
    gqa = build_model(SMALL, seed=2).blocks[0].attn
    mha = build_model(SMALL.replace(n_kv_heads=SMALL.n_heads), seed=3).blocks[0].attn
    group, hd = SMALL.n_heads // SMALL.n_kv_heads, SMALL.d_head
    with torch.no_grad():
        for name in ("q_proj", "o_proj"):
            getattr(mha, name).weight.copy_(getattr(gqa, name).weight)
        for name in ("k_proj", "v_proj"):
            w = getattr(gqa, name).weight.view(SMALL.n_kv_heads, hd, SMALL.d_model)
            getattr(mha, name).weight.copy_(w.repeat_interleave(group, dim=0).flatten(0, 1))
        x = torch.randn(2, 9, SMALL.d_model)
        assert torch.allclose(gqa(x), mha(x), atol=1e-6)


def test_rmsnorm_and_block_follow_their_formulas():
    norm = RMSNorm(32, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(32))
    x = torch.randn(4, 5, 32)
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    assert torch.allclose(norm(x), expected, atol=1e-6)
    block = build_model(SMALL, seed=4).blocks[1]
    with torch.no_grad():
        h = x + block.attn(block.attn_norm(x))
        m = block.mlp
        swiglu = m.down_proj(torch.nn.functional.silu(m.gate_proj(block.mlp_norm(h)))
                             * m.up_proj(block.mlp_norm(h)))
        assert torch.allclose(block(x), h + swiglu, atol=1e-6)


def test_config_files_on_disk(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(HF_PRESETS["Llama-3.2-1B"]))
    assert from_hf_config(path, name="Llama-3.2-1B") == HF_CONFIGS["Llama-3.2-1B"]
    assert from_hf_config(str(path)).name == "llama"                 # no name: the model_type
    assert from_hf_config(tmp_path, name="x").n_kv_heads == 8          # a folder: its config.json
    with pytest.raises(FileNotFoundError, match="no Hugging Face config at"):
        from_hf_config(tmp_path / "missing.json")
    with pytest.raises(FileNotFoundError, match="HF_PRESETS"):
        from_hf_config("Llama-3-8B")                                   # a preset name, not a path
    path.write_text("{not json")
    with pytest.raises(ValueError, match="is not a JSON config"):
        from_hf_config(path)
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="holds a JSON list, not an object"):
        from_hf_config(path)


def test_bad_configs_are_clear_errors():
    with pytest.raises(ValueError, match=r"unsupported model_type 'bert'; supported: \['gpt2'"):
        from_hf_config({"model_type": "bert"})
    with pytest.raises(ValueError, match="unsupported model_type None"):
        from_hf_config({"hidden_size": 4096})
    assert set(SUPPORTED_MODEL_TYPES) == {"gpt2", "llama", "mistral", "mixtral", "qwen3_moe",
                                          "deepseek_v3"}
    llama = HF_PRESETS["Llama-3-8B"]
    missing = {k: v for k, v in llama.items() if k != "intermediate_size"}
    with pytest.raises(ValueError, match="llama config 'llama' is missing the required field "
                                         "'intermediate_size'"):
        from_hf_config(missing)
    with pytest.raises(ValueError, match="gpt2 config .* missing the required field 'n_embd'"):
        from_hf_config({k: v for k, v in HF_PRESETS["gpt2"].items() if k != "n_embd"})
    with pytest.raises(ValueError, match="n_kv_heads=5 does not divide n_heads=32"):
        from_hf_config({**llama, "num_key_value_heads": 5})
    with pytest.raises(ValueError, match="n_heads=5 does not divide d_model=4096"):
        from_hf_config({**llama, "num_attention_heads": 5})
    with pytest.raises(ValueError, match=r"llama config 'llama': d_model must be a positive "
                                         r"integer, got '4096'"):
        from_hf_config({**llama, "hidden_size": "4096"})
    wide = from_hf_config({**llama, "head_dim": 96})  # heads wider than d_model / n_heads:
    assert wide.d_head == 96 and wide.d_q == 32 * 96  # built and counted, but the memory
    with pytest.raises(ValueError, match="heads are 96 wide, not d_model / n_heads = 128"):
        block_matmuls(wide)                            # and speed calculators refuse it
    with pytest.raises(ValueError, match="qwen3_moe config 'q': norm_topk_prob=False"):
        from_hf_config({**HF_PRESETS["Qwen3-30B-A3B"], "norm_topk_prob": False}, name="q")
    with pytest.raises(ValueError, match="layers with a dense MLP"):
        from_hf_config({**HF_PRESETS["Qwen3-30B-A3B"], "mlp_only_layers": [0]})
    with pytest.raises(ValueError, match="hidden_act='gelu'"):
        from_hf_config({**llama, "hidden_act": "gelu"})
    with pytest.raises(ValueError, match="rope_theta must be a positive number"):
        SMALL.replace(rope_theta=0)
    with pytest.raises(ValueError, match="d_head=3 is odd"):
        LlamaConfig("odd", 12, 1, 4, 4, 8, 8, 8)
    with pytest.raises(ValueError, match="unknown model 'Llama-9'"):
        get_config("Llama-9")
