"""Transformer configurations (GPT-2, GPT-3 ... GPT-3 175B), their parameter counts, and a real model.

Why this module exists: the chapter says one GPT-3 block already holds about 605 M
attention parameters and 1.2 B feed-forward parameters, and that 96 blocks make about 173 B.
Here those numbers are *computed* from a configuration (``count_gpt_parameters``), and the
same configuration builds a real PyTorch decoder (``build_gpt``) whose ``parameters()`` add up
to exactly the same total, so the formula and the module cannot drift apart. The package's
``count_parameters``, ``build_model`` and ``get_config`` (:mod:`parlab.models.hf`) take a
config of any family, or its name, and hand a GPT's to these two.

The decoder is GPT-2 style, kept deliberately plain so that the tensor- and pipeline-parallel
chapters can take it apart by name::

    model.wte, model.wpe                     token and position embeddings
    model.blocks[i].ln1                      LayerNorm before attention
    model.blocks[i].attn.q_proj/k_proj/v_proj/out_proj   (separate Q, K, V, with biases)
    model.blocks[i].ln2                      LayerNorm before the feed-forward layer
    model.blocks[i].mlp.fc1/fc2              d_model -> d_ff -> d_model, GELU between
    model.ln_f, model.lm_head                final LayerNorm; the head is *tied* to wte by
                                             default (GPT-2/GPT-3), so it adds no parameters

Attention is written out (scores, causal mask, softmax, weighted sum) instead of calling a
fused kernel, because what autograd saves for it is what ``parlab.memory`` predicts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from parlab.checks import check_count

__all__ = ["TransformerConfig", "count_gpt_parameters", "build_gpt", "GPT", "MLP", "Attention",
           "Block", "CONFIGS",
           "GPT2_SMALL", "GPT2_MEDIUM", "GPT2_LARGE", "GPT2_XL", "GPT3_SMALL", "GPT3_MEDIUM",
           "GPT3_LARGE", "GPT3_XL", "GPT3_2_7B", "GPT3_6_7B", "GPT3_13B", "GPT3_175B", "TINY"]


@dataclass(frozen=True)
class TransformerConfig:
    """The shape of a GPT-style decoder; every field is checked when the config is made."""

    name: str
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    vocab: int
    context: int
    tied_embeddings: bool = True

    def __post_init__(self):
        for f in ("d_model", "n_layers", "n_heads", "d_ff", "vocab", "context"):
            check_count(f, getattr(self, f))
        if self.d_model % self.n_heads:
            valid = [h for h in range(1, min(self.d_model, 128) + 1) if self.d_model % h == 0]
            raise ValueError(f"{self.name}: n_heads={self.n_heads} does not divide "
                             f"d_model={self.d_model}; heads must split d_model evenly, "
                             f"e.g. one of {valid}")

    @property
    def d_head(self) -> int:
        """Width of one attention head."""
        return self.d_model // self.n_heads

    def replace(self, **changes) -> "TransformerConfig":
        """A copy with some fields changed (validated again)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return TransformerConfig(**values)


def _gpt(name: str, d_model: int, n_layers: int, n_heads: int, context: int) -> TransformerConfig:
    """GPT-2 and GPT-3 share the BPE vocabulary of 50257 tokens and d_ff = 4 d_model."""
    return TransformerConfig(name, d_model, n_layers, n_heads, 4 * d_model, 50257, context)


# GPT-2 sizes (Radford et al. 2019), context 1024.
GPT2_SMALL = _gpt("GPT-2 small", 768, 12, 12, 1024)
GPT2_MEDIUM = _gpt("GPT-2 medium", 1024, 24, 16, 1024)
GPT2_LARGE = _gpt("GPT-2 large", 1280, 36, 20, 1024)
GPT2_XL = _gpt("GPT-2 XL", 1600, 48, 25, 1024)
# GPT-3 sizes (Brown et al. 2020, Table 2.1), context 2048. Two rows of that table do not add
# up, and the config check would reject them: XL lists 24 heads of 128 for d_model 2048 (we use
# 16 heads of 128), and 13B lists d_model 5140 for 40 heads of 128 (we use 5120).
GPT3_SMALL = _gpt("GPT-3 Small", 768, 12, 12, 2048)
GPT3_MEDIUM = _gpt("GPT-3 Medium", 1024, 24, 16, 2048)
GPT3_LARGE = _gpt("GPT-3 Large", 1536, 24, 16, 2048)
GPT3_XL = _gpt("GPT-3 XL", 2048, 24, 16, 2048)
GPT3_2_7B = _gpt("GPT-3 2.7B", 2560, 32, 32, 2048)
GPT3_6_7B = _gpt("GPT-3 6.7B", 4096, 32, 32, 2048)
GPT3_13B = _gpt("GPT-3 13B", 5120, 40, 40, 2048)
GPT3_175B = _gpt("GPT-3 175B", 12288, 96, 96, 2048)
#: Small enough to train on a CPU in milliseconds; used by tests and measurements.
TINY = TransformerConfig("tiny", 32, 2, 4, 128, 96, 16)

CONFIGS = {c.name: c for c in (TINY, GPT2_SMALL, GPT2_MEDIUM, GPT2_LARGE, GPT2_XL, GPT3_SMALL,
                               GPT3_MEDIUM, GPT3_LARGE, GPT3_XL, GPT3_2_7B, GPT3_6_7B, GPT3_13B,
                               GPT3_175B)}


def count_gpt_parameters(config: TransformerConfig) -> dict[str, int]:
    """Parameters of ``build_gpt(config)``, part by part, from the config alone.

    Per block: ``attention`` = Q, K, V and output projections (4 d^2 weights + 4 d biases);
    ``feed_forward`` = fc1 and fc2 (2 d d_ff weights + d_ff + d biases); ``layer_norms`` =
    two LayerNorms (4 d); ``block`` = their sum. ``blocks`` = n_layers blocks. Outside the
    blocks: ``token_embedding`` (vocab d), ``position_embedding`` (context d), ``final_norm``
    (2 d) and ``lm_head`` (0 when tied to the token embedding, else vocab d). ``total`` is all
    of it (``active``, what one token uses, is the same: a GPT has no experts); ``tensors`` is
    how many parameter tensors the model has.
    """
    c = config
    d, f = c.d_model, c.d_ff
    attention = 4 * d * d + 4 * d
    feed_forward = 2 * d * f + f + d
    layer_norms = 2 * 2 * d
    block = attention + feed_forward + layer_norms
    counts = {
        "attention": attention,
        "feed_forward": feed_forward,
        "layer_norms": layer_norms,
        "block": block,
        "blocks": c.n_layers * block,
        "token_embedding": c.vocab * d,
        "position_embedding": c.context * d,
        "final_norm": 2 * d,
        "lm_head": 0 if c.tied_embeddings else c.vocab * d,
    }
    counts["total"] = sum(counts[k] for k in ("blocks", "token_embedding", "position_embedding",
                                              "final_norm", "lm_head"))
    counts["active"] = counts["total"]  # every parameter serves every token (no experts)
    counts["routed_experts"] = 0
    counts["tensors"] = 16 * c.n_layers + 4 + (0 if c.tied_embeddings else 1)
    return counts


class Attention(nn.Module):
    """Causal multi-head self-attention with separate Q, K, V projections (the book's W_Q, W_K, W_V)."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.n_heads
        q, k, v = (proj(x).view(b, t, h, d // h).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        out = self.core(q, k, v).transpose(1, 2).contiguous().view(b, t, d)
        return self.out_proj(out)

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """softmax(Q K^T / sqrt(d_head), causal) V per head: the part that stores b·h·T²
        probabilities, and the one that selective recomputation re-runs."""
        t, d_head = q.shape[-2], q.shape[-1]
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d_head)
        future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
        return F.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ v


class MLP(nn.Module):
    """The feed-forward layer: fc1 (d_model -> d_ff), GELU, fc2 (d_ff -> d_model)."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits (..., vocab) against token ids of the same leading shape."""
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten())


class Block(nn.Module):
    """Pre-norm decoder block: x + attn(ln1(x)), then + mlp(ln2(.))."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = Attention(config.d_model, config.n_heads)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config.d_model, config.d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A GPT-style decoder: embeddings, ``n_layers`` blocks, final LayerNorm, LM head."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        # Made from empty tensors, then drawn like nn.Embedding's own (N(0, 1)) unless on the
        # meta device, where a random draw would first import torch._dynamo (seconds).
        d = config.d_model
        self.wte, self.wpe = (nn.Embedding(n, d, _weight=torch.empty(n, d))
                              for n in (config.vocab, config.context))
        for table in (self.wte, self.wpe):
            if not table.weight.is_meta:
                nn.init.normal_(table.weight)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab, bias=False)
        if config.tied_embeddings:
            self.lm_head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids (batch, seq) -> logits (batch, seq, vocab)."""
        t = idx.shape[1]
        if t > self.config.context:
            raise ValueError(f"sequence length {t} exceeds the context of {self.config.context}")
        x = self.wte(idx) + self.wpe(self.positions(t, idx.device))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))

    def positions(self, t: int, device) -> torch.Tensor:
        """The positions of the ``t`` tokens this model is given, 0 .. t - 1 (context
        parallelism replaces this with its shard's positions)."""
        return torch.arange(t, device=device)

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy."""
        return next_token_loss(self(idx), targets)

    def pipeline_layers(self) -> list[nn.Module]:
        """The model as a chain of layers a pipeline can cut: the embeddings, each block,
        then the final LayerNorm with the head (logits out). They share this model's
        parameters, so a split or swapped block (tensor parallelism) shows in them."""
        return [_Embeddings(self), *self.blocks, _Head(self)]


class _Embeddings(nn.Module):
    """Token ids (batch, seq) -> token + position embeddings: a GPT's first pipeline layer."""

    def __init__(self, gpt: GPT):
        super().__init__()
        self.wte, self.wpe = gpt.wte, gpt.wpe

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))


class _Head(nn.Module):
    """Final LayerNorm, then the LM head: a GPT's last pipeline layer."""

    def __init__(self, gpt: GPT):
        super().__init__()
        self.ln_f, self.lm_head = gpt.ln_f, gpt.lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(x))


def build_gpt(config: TransformerConfig, seed: int | None = 0,
              dtype: torch.dtype = torch.float32, device="cpu") -> GPT:
    """A real, randomly initialised :class:`GPT` for ``config`` (seeded for reproducibility)."""
    if seed is not None:
        torch.manual_seed(seed)
    return GPT(config).to(device=device, dtype=dtype)
