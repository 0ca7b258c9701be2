"""The MoE layer in one process, against plain loops written from the routers' definitions."""
import math

import pytest
import torch
import torch.nn.functional as F

from parlab.models import MoE, MoEConfig, assign_slots, expert_capacity, route


def _logits(tokens=12, experts=4, seed=0):
    torch.manual_seed(seed)
    return torch.randn(tokens, experts)


def test_switch_gate_is_the_probability_of_the_one_choice():
    logits = _logits()
    routing = route(logits, 1, "switch")
    for t in range(logits.shape[0]):
        probs = [math.exp(v) for v in logits[t].tolist()]
        best = max(range(len(probs)), key=probs.__getitem__)
        assert routing.experts[t].tolist() == [best]
        assert routing.gates[t, 0].item() == pytest.approx(probs[best] / sum(probs), rel=1e-6)


def test_topk_gates_are_the_chosen_probabilities_renormalized():
    logits = _logits()
    routing = route(logits, 2, "topk")
    for t in range(logits.shape[0]):
        probs = [math.exp(v) for v in logits[t].tolist()]
        top = sorted(range(len(probs)), key=probs.__getitem__, reverse=True)[:2]
        assert routing.experts[t].tolist() == top
        chosen = [probs[e] for e in top]
        assert routing.gates[t].tolist() == pytest.approx([p / sum(chosen) for p in chosen],
                                                          rel=1e-6)


def test_deepseek_bias_steers_the_choice_but_not_the_gate():
    logits = _logits()
    bias = torch.tensor([0.0, 0.0, 0.0, 5.0])  # expert 3 now always makes the top 2
    routing = route(logits, 2, "deepseek", bias)
    sig = lambda v: 1 / (1 + math.exp(-v))  # noqa: E731
    for t in range(logits.shape[0]):
        scores = [sig(v) for v in logits[t].tolist()]
        steer = [s + b for s, b in zip(scores, bias.tolist())]
        top = sorted(range(4), key=steer.__getitem__, reverse=True)[:2]
        assert 3 in top and routing.experts[t].tolist() == top
        chosen = [scores[e] for e in top]  # the gate uses the unbiased affinities
        assert routing.gates[t].tolist() == pytest.approx([s / sum(chosen) for s in chosen],
                                                          rel=1e-6)


def _slots_by_loop(experts, capacity):
    """First choices in token order, then second choices: each expert fills up to capacity."""
    tokens, k = experts.shape
    taken, slot, kept = {}, [[0] * k for _ in range(tokens)], [[False] * k for _ in range(tokens)]
    for j in range(k):
        for t in range(tokens):
            e = int(experts[t, j])
            slot[t][j] = taken.get(e, 0)
            kept[t][j] = capacity is None or slot[t][j] < capacity
            taken[e] = slot[t][j] + 1
    return slot, kept


@pytest.mark.parametrize("capacity", [None, 1, 3, 5])
def test_first_choices_are_served_before_second_choices(capacity):
    experts = route(_logits(tokens=16, experts=4, seed=3), 2).experts
    slot, kept = assign_slots(experts, 4, capacity)
    want_slot, want_kept = _slots_by_loop(experts, capacity)
    assert slot.tolist() == want_slot and kept.tolist() == want_kept


def test_capacity_is_k_tokens_factor_over_experts_rounded_up():
    assert expert_capacity(16, 4, 2, 1.0) == 8
    assert expert_capacity(10, 4, 2, 1.0) == 5
    assert expert_capacity(10, 8, 2, 1.25) == math.ceil(2 * 10 * 1.25 / 8) == 4
    assert expert_capacity(10, 8, 2, None) is None


def _layer_by_loop(moe, x, groups):
    """sum over a token's kept choices of gate x SwiGLU_e(x), capacity counted per group."""
    c = moe.config
    routing = moe.router(x)
    per = x.shape[0] // groups
    cap = None if c.capacity_factor is None else math.ceil(c.top_k * per * c.capacity_factor
                                                            / c.n_experts)
    out = torch.zeros_like(x)
    for g in range(groups):
        _, kept = _slots_by_loop(routing.experts[g * per:(g + 1) * per], cap)
        for i in range(per):
            t = g * per + i
            for j in range(c.top_k):
                if kept[i][j]:
                    e = moe.experts[int(routing.experts[t, j])]
                    h = F.silu(x[t] @ e.gate_proj.weight.T) * (x[t] @ e.up_proj.weight.T)
                    out[t] += routing.gates[t, j] * (h @ e.down_proj.weight.T)
    if moe.shared is not None:
        out += moe.shared(x)
    return out


@pytest.mark.parametrize("config, groups", [
    (MoEConfig(8, 16, 4, top_k=2), 1),
    (MoEConfig(8, 16, 4, top_k=2, capacity_factor=1.0), 2),
    (MoEConfig(8, 16, 4, top_k=1, router="switch", capacity_factor=0.5), 1),
    (MoEConfig(8, 16, 8, top_k=2, router="deepseek", capacity_factor=1.0, shared_experts=1), 4),
])
def test_moe_layer_equals_the_loop(config, groups):
    moe = MoE(config, seed=0)
    torch.manual_seed(1)
    x = torch.randn(2, 12, 8)
    out = moe(x, groups=groups)
    want = _layer_by_loop(moe, x.reshape(-1, 8), groups).view(2, 12, 8)
    assert (out - want).abs().max().item() < 1e-5
    stats = moe.last
    assert stats.load.sum().item() + stats.dropped == 24 * config.top_k
    if config.capacity_factor is not None and config.capacity_factor <= 1:
        assert stats.dropped > 0  # these cases really drop


@pytest.mark.parametrize("changes, message", [
    ({"top_k": 5}, "top_k=5 is larger than n_experts=4"),
    ({"capacity_factor": 0}, "capacity_factor must be a positive number"),
    ({"capacity_factor": -1.0}, "capacity_factor must be a positive number"),
    ({"router": "switch"}, "the Switch router chooses one expert"),
    ({"router": "expert-choice"}, "router must be one of ['switch', 'topk', 'deepseek']"),
    ({"n_experts": 0}, "n_experts must be a positive integer"),
])
def test_moe_config_bad_values_are_named(changes, message):
    with pytest.raises(ValueError) as info:
        MoEConfig(8, 16, 4, top_k=2).replace(**changes)
    assert message in str(info.value)


def test_router_output_of_the_wrong_shape_is_named():
    with pytest.raises(ValueError, match=r"2-D \(tokens x experts\), got shape \(2, 3, 4\)"):
        route(torch.zeros(2, 3, 4), 2)
    with pytest.raises(ValueError, match="top_k=5 must be from 1 to the number of experts"):
        route(torch.zeros(3, 4), 5)
    with pytest.raises(ValueError, match="do not split into groups=5"):
        MoE(MoEConfig(8, 16, 4))(torch.zeros(12, 8), groups=5)


def test_mixtral_counts_are_the_published_ones():
    """Mixtral-8x7B (mistralai/Mixtral-8x7B-v0.1, config.json): 46,702,792,704 parameters, of
    which 12,879,925,248 serve each token (2 of 8 experts, plus attention, router, norms and
    both embedding matrices), as the published checkpoint and model card give them."""
    from parlab.models import build_model, count_parameters
    counts = count_parameters("Mixtral-8x7B")
    assert counts["total"] == 46_702_792_704 and counts["active"] == 12_879_925_248
    meta = build_model("Mixtral-8x7B", device="meta")  # the module, built on shapes only
    assert sum(p.numel() for p in meta.parameters()) == counts["total"]
    assert len(list(meta.parameters())) == counts["tensors"]


def test_qwen3_moe_counts_are_the_published_ones():
    """Qwen3-30B-A3B (Qwen/Qwen3-30B-A3B, config.json; the model card: 30.5 B parameters,
    3.3 B activated, 29.9 B without the embeddings): 128 experts of width 768, 8 per token,
    heads of 128 (not 2048 / 32), queries and keys normalized per head. Active, counted as
    for Mixtral (both embedding matrices included), is 3.35 B: the card's 3.3 cuts the
    second decimal off rather than rounding it."""
    from parlab.models import build_model, count_parameters
    counts = count_parameters("Qwen3-30B-A3B")
    assert round(counts["total"] / 1e9, 1) == 30.5
    assert 3.3 <= counts["active"] / 1e9 < 3.4
    embeddings = counts["token_embedding"] + counts["lm_head"]
    assert round((counts["total"] - embeddings) / 1e9, 1) == 29.9
    meta = build_model("Qwen3-30B-A3B", device="meta")
    assert sum(p.numel() for p in meta.parameters()) == counts["total"]
    assert len(list(meta.parameters())) == counts["tensors"]


def test_a_small_qwen3_moe_runs_backward_and_the_calculators_refuse_it():
    from parlab.models import build_model, count_parameters, get_config
    small = get_config("Qwen3-30B-A3B").replace(d_model=32, n_layers=2, n_heads=4,
                                                n_kv_heads=2, head_dim=16, d_ff=24, vocab=64,
                                                n_experts=4, experts_per_token=2)
    model = build_model(small)
    assert sum(p.numel() for p in model.parameters()) == count_parameters(small)["total"]
    ids = torch.randint(0, 64, (2, 8))
    model.loss(ids, ids).backward()
    assert model.blocks[0].attn.q_norm.weight.grad is not None
    assert model.blocks[0].attn.q_proj.weight.shape == (4 * 16, 32)
    from parlab import memory
    with pytest.raises(ValueError, match="heads are 16 wide, not d_model / n_heads = 8"):
        memory.estimate(small, (2, 8))


def test_a_small_mixtral_trains_and_counts_what_it_builds():
    from parlab.models import build_model, count_parameters, get_config
    small = get_config("Mixtral-8x7B").replace(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                               d_ff=48, vocab=64, n_experts=4,
                                               experts_per_token=2)
    model = build_model(small)
    counts = count_parameters(small)
    assert sum(p.numel() for p in model.parameters()) == counts["total"]
    per_expert = 3 * 32 * 48
    assert counts["total"] - counts["active"] == 2 * (4 - 2) * per_expert
    ids = torch.randint(0, 64, (2, 8))
    model.loss(ids, ids).backward()
    assert all(p.grad is not None for p in model.blocks[0].mlp.router.parameters())
    with pytest.raises(ValueError, match=r"mixture of experts \(n_experts=4, 2 per token\)"):
        from parlab import memory
        memory.estimate(small, (2, 8))
    with pytest.raises(ValueError, match="experts_per_token=2 needs n_experts"):
        small.replace(n_experts=0)
    with pytest.raises(ValueError, match="top_k=5 is larger than n_experts=4"):
        small.replace(experts_per_token=5)


def test_deepseek_v3_counts_are_the_reports():
    """DeepSeek-V3 (deepseek-ai/DeepSeek-V3, config.json): the technical report (arXiv
    2412.19437, abstract) gives 671 B parameters, 37 B activated per token, without the
    multi-token-prediction module. Multi-head latent attention, 3 dense blocks, 58 blocks of
    256 routed experts + 1 shared, 8 routed per token. Active, counted as for Mixtral (both
    embedding matrices included), is 37.55 B: the report's 37 cuts the decimals off, as
    Qwen3's card does."""
    from parlab import memory
    from parlab.models import build_model, count_parameters, get_config
    counts = count_parameters("DeepSeek-V3")
    assert round(counts["total"] / 1e9) == 671 and 37 <= counts["active"] / 1e9 < 38
    c = get_config("DeepSeek-V3")
    # one expert block by hand: attention through the low-rank bottlenecks, then the experts
    mla = (7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256
           + 128 * 128 * 7168)
    assert counts["attention"] == mla
    assert counts["feed_forward"] == 257 * 3 * 7168 * 2048 + 7168 * 256 + 256
    assert c.dense_layers == 3 and c.n_layers - c.dense_layers == 58
    with pytest.raises(ValueError, match="counted .count_parameters., not built"):
        build_model("DeepSeek-V3")
    with pytest.raises(ValueError, match="the memory calculator does not model DeepSeek-V3"):
        memory.estimate("DeepSeek-V3", (8, 128))
