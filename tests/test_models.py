"""Transformer configs: the book's GPT-3 counts come from the config, and match a real module."""
import pytest
import torch

from parlab.models import (
    CONFIGS, GPT2_SMALL, GPT3_175B, TINY, TransformerConfig, build_model, count_parameters,
    get_config
)


def test_gpt3_counts_match_the_book():
    c = count_parameters(GPT3_175B)
    d = GPT3_175B.d_model
    assert c["attention"] == 4 * d * d + 4 * d
    assert c["attention"] == pytest.approx(604e6, rel=0.001)       # the book: about 605 M
    assert c["feed_forward"] == pytest.approx(1.2e9, rel=0.01)     # the book: about 1.2 B
    assert c["blocks"] == 96 * c["block"]
    assert c["blocks"] == pytest.approx(174e9, rel=0.001)          # the book: about 173 B
    assert c["total"] == pytest.approx(175e9, rel=0.005)           # the book: about 175 B
    assert c["total"] - c["blocks"] == (c["token_embedding"] + c["position_embedding"]
                                        + c["final_norm"])


def test_gpt2_small_is_the_well_known_124m():
    assert count_parameters(GPT2_SMALL)["total"] == 124_439_808
    assert count_parameters("GPT-2 XL")["total"] == pytest.approx(1.56e9, rel=0.01)


@pytest.mark.parametrize("config", [TINY, TINY.replace(tied_embeddings=False),
                                    TINY.replace(n_layers=3, d_ff=48, n_heads=2)])
def test_count_equals_the_real_module(config):
    model = build_model(config)
    counts = count_parameters(config)
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    assert counts["tensors"] == len(list(model.parameters()))
    block = model.blocks[0]
    attn = sum(p.numel() for p in block.attn.parameters())
    assert attn == counts["attention"]
    assert sum(p.numel() for p in block.mlp.parameters()) == counts["feed_forward"]


def test_every_named_config_is_valid_and_counted():
    assert {"GPT-3 175B", "GPT-2 small", "GPT-2 medium", "GPT-2 large", "GPT-2 XL",
            "GPT-3 Small", "tiny"} <= set(CONFIGS)
    totals = [count_parameters(c)["total"] for c in CONFIGS.values()]
    assert all(t > 0 for t in totals)
    assert count_parameters("GPT-3 13B")["total"] == pytest.approx(12.9e9, rel=0.01)


def test_model_is_causal_and_trains():
    model = build_model(TINY)
    idx = torch.randint(0, TINY.vocab, (2, 8))
    changed = idx.clone()
    changed[:, -1] = (changed[:, -1] + 1) % TINY.vocab
    with torch.no_grad():
        a, b = model(idx), model(changed)
    assert a.shape == (2, 8, TINY.vocab)
    assert torch.allclose(a[:, :-1], b[:, :-1], atol=1e-6)   # the past cannot see the future
    assert not torch.allclose(a[:, -1], b[:, -1])
    loss = model.loss(idx, idx)
    loss.backward()
    assert model.blocks[0].attn.q_proj.weight.grad.abs().sum() > 0
    assert model.lm_head.weight is model.wte.weight


def test_bad_configs_are_clear_errors():
    with pytest.raises(ValueError, match=r"n_heads=5 does not divide d_model=32"):
        TransformerConfig("bad", 32, 2, 5, 128, 96, 16)
    with pytest.raises(ValueError, match=r"n_layers must be a positive integer, got -1"):
        TransformerConfig("bad", 32, -1, 4, 128, 96, 16)
    with pytest.raises(ValueError, match=r"d_model must be a positive integer, got 32.0"):
        TransformerConfig("bad", 32.0, 2, 4, 128, 96, 16)
    with pytest.raises(ValueError, match="unknown model 'GPT-5'"):
        get_config("GPT-5")
    with pytest.raises(ValueError, match="exceeds the context"):
        build_model(TINY)(torch.zeros(1, TINY.context + 1, dtype=torch.long))
