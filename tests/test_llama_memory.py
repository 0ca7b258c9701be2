"""The memory calculator on Llama-style configs (issue 16, point 4): the closed form per op,
held to a real training step, to a fake trace of the same model, and, under tensor
parallelism, to a fake trace of one rank's shard written out in this file (as Megatron-LM
splits a block: h/tp query heads, kv/tp key/value heads, d_ff/tp, norms whole)."""
import json
import math
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from parlab import memory
from parlab.models import (
    HF_PRESETS, LlamaConfig, build_model, count_parameters, from_hf_config, get_config
)

B, T = 4, 16
GQA = LlamaConfig("gqa", d_model=64, n_layers=3, n_heads=8, n_kv_heads=2, d_ff=96, vocab=100,
                  context=32)
MHA = GQA.replace(name="mha", n_kv_heads=8, tied_embeddings=True)
BIASED = GQA.replace(name="biased", attention_bias=True, mlp_bias=True, vocab=101)
ELEMENT = {"fp32": 4, "bf16": 2}
DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _tokens(c, batch=B, seq=T, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, c.vocab, (batch, seq), generator=g) for _ in "xt"]


# --- tensor parallelism: one rank's shard, written here ---------------------------------------

class RMS(nn.Module):
    """Hugging Face's LlamaRMSNorm: fp32 inside, the weight applied in the input's dtype."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.to(x.dtype) * self.weight


def rotary(t, dh, theta, dtype):
    """cos and sin of the rotary angles, as Hugging Face computes them."""
    inv = 1.0 / theta ** (torch.arange(0, dh, 2).float() / dh)
    emb = torch.outer(torch.arange(t).float(), inv).repeat(1, 2)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate(x, cos, sin):
    """Rotary positions as Hugging Face applies them (rotate_half)."""
    dh = x.shape[-1]
    return x * cos + torch.cat((-x[..., dh // 2:], x[..., :dh // 2]), dim=-1) * sin


class ShardBlock(nn.Module):
    """What one of ``tp`` ranks computes of a Llama block: Q, K, V, gate and up split by
    columns (heads, d_ff), o and down by rows (their bias whole), the norms whole. The
    all-reduces after o and down save nothing and are left out."""

    def __init__(self, c: LlamaConfig, tp: int):
        super().__init__()
        dh, bias, mlp_bias = c.d_head, c.attention_bias, c.mlp_bias
        self.h, self.kv, self.dh, self.theta = c.n_heads // tp, c.n_kv_heads // tp, dh, c.rope_theta
        self.norm1, self.norm2 = RMS(c.d_model), RMS(c.d_model)
        self.q = nn.Linear(c.d_model, self.h * dh, bias=bias)
        self.k = nn.Linear(c.d_model, self.kv * dh, bias=bias)
        self.v = nn.Linear(c.d_model, self.kv * dh, bias=bias)
        self.o = nn.Linear(self.h * dh, c.d_model, bias=bias)
        self.gate = nn.Linear(c.d_model, c.d_ff // tp, bias=mlp_bias)
        self.up = nn.Linear(c.d_model, c.d_ff // tp, bias=mlp_bias)
        self.down = nn.Linear(c.d_ff // tp, c.d_model, bias=mlp_bias)

    def forward(self, x):
        b, t, _ = x.shape
        y = self.norm1(x)
        q, k, v = (proj(y).view(b, t, n, self.dh).transpose(1, 2)
                   for proj, n in ((self.q, self.h), (self.k, self.kv), (self.v, self.kv)))
        cos, sin = rotary(t, self.dh, self.theta, q.dtype)  # once per block, as our Llama
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k = k.repeat_interleave(self.h // self.kv, dim=1)
        v = v.repeat_interleave(self.h // self.kv, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(out.transpose(1, 2).reshape(b, t, self.h * self.dh))
        y = self.norm2(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


class Scale(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * self.weight


class ShardModel(nn.Module):
    """One rank of the whole model: the embedding and the head split by vocabulary (each rank
    ceil(vocab / tp) rows, looked up with local ids, a new tensor as in Megatron-LM's
    VocabParallelEmbedding), the blocks' shards, the final norm whole."""

    def __init__(self, c: LlamaConfig, tp: int):
        super().__init__()
        self.rows = math.ceil(c.vocab / tp)
        self.embed = nn.Embedding(self.rows, c.d_model)
        self.blocks = nn.ModuleList(ShardBlock(c, tp) for _ in range(c.n_layers))
        self.norm = RMS(c.d_model)
        self.head = nn.Linear(c.d_model, self.rows, bias=False)
        if c.tied_embeddings:
            self.head.weight = self.embed.weight

    def forward(self, ids):
        x = self.embed(ids % self.rows)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def shard_loss(logits, ids):
    """Cross-entropy over the rank's slice of the vocabulary (its log-probabilities)."""
    targets = ids.flip(-1) % logits.shape[-1]
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


# --- tp = 1: the closed form equals a real step and a fake trace -----------------------------

@pytest.mark.parametrize("config", [GQA, MHA, BIASED], ids=lambda c: c.name)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_closed_form_equals_a_real_step(config, precision, optimizer):
    estimated = memory.estimate(config, (B, T), optimizer, precision)
    measured = memory.measure(config, (B, T), optimizer, precision)
    # torch's Adam also keeps a 4-byte step counter per parameter tensor (not estimated)
    counters = 4 * count_parameters(config)["tensors"] if optimizer == "adam" else 0
    assert measured.optimizer_state - estimated.optimizer_state == counters
    for part in ("parameters", "gradients", "master_weights", "activations"):
        assert getattr(estimated, part) == getattr(measured, part), part


@pytest.mark.parametrize("config", [GQA, MHA], ids=lambda c: c.name)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_closed_form_equals_the_fake_trace_of_the_built_model(config, precision):
    ids, targets = _tokens(config)
    model = build_model(config)
    traced = memory.estimate(model, example_input=ids, optimizer="sgd", precision=precision,
                             loss_fn=lambda logits, x: F.cross_entropy(
                                 logits.flatten(0, 1), x.roll(-1, dims=1).flatten()))
    closed = memory.estimate(config, (B, T), "sgd", precision)
    # the trace leaves the model's input out (it exists anyway): the token ids, 8 b T bytes
    assert closed.activations == traced.activations + 8 * B * T
    assert closed.parameters == traced.parameters


def test_block_terms_add_up_and_follow_the_precision():
    fp32 = memory.block_activations(GQA, B, T, "fp32")
    bf16 = memory.block_activations(GQA, B, T, "bf16")
    bt, d, f = B * T, GQA.d_model, GQA.d_ff
    # by hand: two RMSNorms (fp32 input, 1/rms, normalised, output), cos/sin, q, k and v with
    # every head, logsumexp, attention output, SwiGLU's four d_ff-wide tensors
    for e, terms in ((4, fp32), (2, bf16)):
        assert sum(terms.values()) == (2 * (4 * bt * d + 4 * bt + 2 * e * bt * d)
                                       + 2 * e * T * GQA.d_head + 4 * e * bt * d
                                       + 4 * bt * GQA.n_heads + 4 * e * bt * f)
    assert fp32["attention logsumexp"] == bf16["attention logsumexp"]  # fp32 either way
    assert "softmax probabilities" not in fp32                          # no T x T tensor
    per_layer = memory.activations_per_layer(GQA, B, T)
    assert per_layer["block 2"] == sum(fp32.values()) and len(per_layer) == GQA.n_layers + 2


# --- tp > 1: against one rank's shard ---------------------------------------------------------

@pytest.mark.parametrize("config", [GQA, MHA, BIASED], ids=lambda c: c.name)
@pytest.mark.parametrize("tp", [2])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_tensor_parallel_closed_form_equals_the_shard_trace(config, tp, precision):
    ids, _ = _tokens(config)
    torch.manual_seed(0)
    shard = ShardModel(config, tp)
    traced = memory.estimate(shard, example_input=ids, optimizer="adam", precision=precision,
                             loss_fn=shard_loss)
    closed = memory.estimate(config, (B, T), "adam", precision, tp=tp)
    assert closed.activations == traced.activations
    assert closed.parameters == traced.parameters  # Megatron's split, counted from the shard
    assert closed.optimizer_state == traced.optimizer_state
    # one block alone; its input must need a gradient, as inside the model: a learned scale
    # first (which saves only its own input and weight, never counted)
    block = nn.Sequential(Scale(config.d_model), ShardBlock(config, tp))
    one = memory.estimate(block, (B, T, config.d_model), "sgd", precision,
                          loss_fn=lambda out, x: out.sum())
    assert sum(memory.block_activations(config, B, T, precision, tp).values()) == \
        one.activations


@pytest.mark.parametrize("config, pp, cuts, busiest", [
    (GQA, 2, [3], "stage 0"),                                     # embed + 2 blocks | 1 + head
    (MHA.replace(vocab=2000), 3, [2, 3], "stage 2"),              # tied, the head's stage
    (BIASED.replace(vocab=2001, tied_embeddings=True), 3, [2, 3], "stage 2")],
    ids=["gqa-pp2", "tied-pp3", "biased-tied-pp3"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_pipeline_stages_equal_the_shard_cut_at_the_same_layers(config, pp, cuts, busiest,
                                                                 precision):
    # the shard's children: embed, blocks.0 .. blocks.2, norm, head; a tied embedding is
    # held by the first and the last stage (Megatron-LM keeps a copy on each)
    ids, _ = _tokens(config)
    traced = memory.estimate(ShardModel(config, 2), example_input=ids, optimizer="adam",
                             precision=precision, loss_fn=shard_loss, pp=pp, split_points=cuts,
                             microbatches=2)
    closed = memory.estimate(config, (B, T), "adam", precision, tp=2, pp=pp, microbatches=2)
    assert traced.label.endswith(busiest)
    assert closed.parts() == traced.parts()


def test_tensor_parallel_divides_per_head_and_per_d_ff_tensors_only():
    one = memory.block_activations(GQA, B, T, "bf16", tp=1)
    two = memory.block_activations(GQA, B, T, "bf16", tp=2)
    split = {"q rotated", "k heads", "v heads", "attention logsumexp", "attention output",
             "gate output", "silu output", "up output", "silu x up"}
    for key, value in one.items():
        assert two[key] == (value // 2 if key in split else value), key


# --- recomputation -----------------------------------------------------------------------------

@pytest.mark.parametrize("config", [GQA, MHA], ids=lambda c: c.name)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_recompute_estimates_equal_the_measured_step(config, precision):
    model = build_model(config, dtype=DTYPE[precision])
    x, t = _tokens(config)
    loss = ELEMENT[precision]  # the loss scalar: alive, never saved
    for r in memory.RECOMPUTE:
        m = memory.measure_recompute(model, x, t, recompute=r)
        estimated = memory.estimate(config, (B, T), "sgd", precision, recompute=r).activations
        assert estimated == m.activations + m.input_bytes + m.recomputed - loss, r


def test_full_recompute_keeps_the_block_inputs_and_rebuilds_one_block():
    x = B * T * GQA.d_model
    for precision, e in ELEMENT.items():
        block = sum(memory.block_activations(GQA, B, T, precision).values())
        plain = memory.activation_bytes(GQA, B, T, precision)
        full = memory.activation_bytes(GQA, B, T, precision, recompute="full")
        # fp32: RMSNorm keeps the input itself, so it is not rebuilt; bf16: an fp32 copy is
        rebuilt = block - (4 * x if e == 4 else 0)
        assert full == plain - GQA.n_layers * block + GQA.n_layers * e * x + rebuilt


def test_selective_recompute_gains_little_with_a_fused_attention_kernel():
    # no T x T tensor to drop: only the logsumexp, and (grouped-query attention) the key/value
    # copies in place of the un-copied k and v; rebuilding the core makes its output again
    for c in (GQA, MHA):
        plain = memory.activation_bytes(c, B, T, "bf16")
        selective = memory.activation_bytes(c, B, T, "bf16", recompute="selective")
        assert abs(selective - plain) < 0.1 * plain
    assert memory.activation_bytes(MHA, B, T, "bf16", recompute="selective") > \
        memory.activation_bytes(MHA, B, T, "bf16")


def test_recompute_flops_of_a_llama_block_match_the_counted_matmuls():
    model = build_model(GQA)
    x, t = _tokens(GQA)
    plain = memory.measure_recompute(model, x, t)
    full = memory.measure_recompute(model, x, t, recompute="full")
    formula = memory.recompute_flops(GQA, B * T, "full", seq=T).extra
    core = memory.recompute_flops(GQA, B * T, "selective", seq=T).extra
    # torch's FLOP counter has no formula for the CPU flash-attention kernel, so what it
    # counts is the projections and SwiGLU: 2 (2 d^2 + 2 d d_kv + 3 d d_ff) per token and block
    d, kv, f = GQA.d_model, GQA.d_kv, GQA.d_ff
    assert full.flops - plain.flops == formula - core == \
        2 * (2 * d * d + 2 * d * kv + 3 * d * f) * B * T * GQA.n_layers
    assert core == 4 * T * d * B * T * GQA.n_layers


# --- presets, dicts, paths, scale, and the search for the fewest GPUs -------------------------

def test_any_form_of_the_config_gives_the_same_estimate(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(HF_PRESETS["Llama-3-8B"]))
    args = ((1, 8192), "adam", "bf16")
    by_name = memory.estimate("Llama-3-8B", *args, tp=8, pp=4)
    for form in (get_config("Llama-3-8B"), HF_PRESETS["Llama-3-8B"], path, str(path),
                 from_hf_config(HF_PRESETS["Llama-3-8B"])):
        assert memory.estimate(form, *args, tp=8, pp=4).parts() == by_name.parts()


def test_an_8b_estimate_takes_milliseconds_and_its_states_are_16_bytes_per_parameter():
    start = time.perf_counter()
    b = memory.estimate("Llama-3-8B", (1, 8192), "adam", "bf16")
    assert time.perf_counter() - start < 1
    n = count_parameters("Llama-3-8B")["total"]
    assert b.parameters + b.gradients + b.optimizer_state + b.master_weights == 16 * n
    # bf16 activations of one 8192-token sequence: 32 blocks and the two ends
    block = sum(memory.block_activations("Llama-3-8B", 1, 8192, "bf16").values())
    assert b.activations == sum(memory.activations_per_layer("Llama-3-8B", 1, 8192, "bf16")
                                .values()) > 32 * block


def test_min_gpus_for_llama_3_8b_uses_tensor_degrees_that_divide_the_kv_heads():
    shape = (8, 8192)
    plan = memory.min_gpus("Llama-3-8B", shape, "adam", "bf16", max_tp=16)
    assert plan.breakdown.fits and 8 % plan.tp == 0
    assert plan.breakdown == memory.estimate("Llama-3-8B", shape, "adam", "bf16", plan.dp,
                                             plan.tp, plan.pp)
    # an exhaustive search of the smaller products finds nothing that fits
    c = get_config("Llama-3-8B")
    for dp in (1, 2, 4, 8):
        for tp in (1, 2, 4, 8):
            for pp in range(1, c.n_layers + 1):
                if dp * tp * pp < plan.gpus:
                    assert not memory.estimate(c, shape, "adam", "bf16", dp, tp, pp).fits
    full = memory.min_gpus("Llama-3-8B", shape, "adam", "bf16", recompute="full")
    assert full.gpus < plan.gpus


# --- bad input -----------------------------------------------------------------------------------

def test_tp_must_divide_the_key_value_heads():
    with pytest.raises(ValueError, match=r"tp=16 must divide n_heads=32 and n_kv_heads=8 and "
                                         r"d_ff=14336 \(Megatron-LM would replicate each of the "
                                         r"8 key/value heads over 2 ranks.*valid tp for "
                                         r"Llama-3-8B: \[1, 2, 4, 8\]"):
        memory.estimate("Llama-3-8B", (1, 8192), tp=16)
    with pytest.raises(ValueError, match="tp=4 must divide"):
        memory.block_activations(GQA, B, T, tp=4)   # 2 key/value heads
    with pytest.raises(ValueError, match="tp=3 must divide n_heads=8"):
        memory.activation_bytes(GQA, B, T, tp=3)


def test_unknown_presets_and_bad_configs_are_named():
    with pytest.raises(ValueError, match=r"unknown model 'Llama-9'; known: \[.*'Llama-3-8B'"):
        memory.estimate("Llama-9", (1, 16))
    with pytest.raises(ValueError, match="missing the required field 'num_hidden_layers'"):
        memory.estimate({k: v for k, v in HF_PRESETS["Llama-3-8B"].items()
                         if k != "num_hidden_layers"}, (1, 16))
    with pytest.raises(FileNotFoundError, match="no Hugging Face config"):
        memory.estimate("no/such/config.json", (1, 16))
    with pytest.raises(ValueError, match="seq=9000 exceeds Llama-3-8B's context of 8192"):
        memory.estimate("Llama-3-8B", (1, 9000))
    with pytest.raises(ValueError, match="pp=33 stages for 32 layers"):
        memory.estimate("Llama-3-8B", (1, 16), pp=33)
