"""A Llama-style decoder (Llama 2, Llama 3, Mistral): its configuration, parameter count and module.

Why this module exists: the GPT-2/GPT-3 decoder of :mod:`parlab.models.transformer` is not what
most models trained today look like. Llama-style decoders change four things, and each one
changes where the parameters are:

- no position embedding table: positions are *rotary* embeddings (RoPE), a rotation of each
  query and key that has no parameters;
- grouped-query attention (GQA): ``n_kv_heads`` key/value heads are shared by the
  ``n_heads`` query heads, so K and V are ``d x (n_kv_heads * d_head)`` instead of ``d x d``;
- a SwiGLU feed-forward layer with *three* matrices (gate, up, down), each ``d x d_ff``;
- RMSNorm (a weight, no bias) instead of LayerNorm, and no biases anywhere by default.

:func:`count_llama_parameters` counts them from the configuration alone, and
:func:`build_llama` builds the real PyTorch module whose ``parameters()`` add up to the same
total. The names follow Hugging Face's, so that a reader can set them beside a checkpoint::

    model.embed_tokens                         token embedding (no position table)
    model.blocks[i].attn_norm                  RMSNorm before attention
    model.blocks[i].attn.q_proj/k_proj/v_proj/o_proj   (RoPE on q and k, GQA, causal SDPA)
    model.blocks[i].mlp_norm                   RMSNorm before the feed-forward layer
    model.blocks[i].mlp.gate_proj/up_proj/down_proj    down(silu(gate(x)) * up(x))
    model.norm, model.lm_head                  final RMSNorm; the head is tied to the
                                               embedding only when ``tied_embeddings``

Each block takes only ``x`` (it computes its own rotary angles), so pipeline splits and
recomputation can run ``model.blocks`` one by one, as they do for the GPT.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from parlab.models.transformer import next_token_loss
from parlab.checks import check_count, check_positive_number
from parlab.models.ffn import SwiGLU
from parlab.models.moe import MoE, MoEConfig

__all__ = ["LlamaConfig", "Llama", "LlamaAttention", "LlamaBlock", "RMSNorm", "count_llama_parameters", "build_llama",
           "rotary_cos_sin", "apply_rotary"]

_SIZES = ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "vocab", "context")


@dataclass(frozen=True)
class LlamaConfig:
    """The shape of a Llama-style decoder; every field is checked when the config is made."""

    name: str
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    vocab: int
    context: int
    tied_embeddings: bool = False
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False
    mlp_bias: bool = False
    n_experts: int = 0           # 0: a dense feed-forward layer; else a mixture of experts,
    experts_per_token: int = 0   # each d_ff wide, of which every token uses this many
    head_dim: int = 0            # 0: d_model / n_heads (Qwen3 sets its own)
    qk_norm: bool = False        # an RMSNorm on each head's query and key (Qwen3)

    def __post_init__(self):
        for f in _SIZES:
            value = getattr(self, f)
            check_count(f, value)
        if self.head_dim:
            check_count("head_dim", self.head_dim)
        elif self.d_model % self.n_heads:
            raise ValueError(f"{self.name}: n_heads={self.n_heads} does not divide "
                             f"d_model={self.d_model}; heads must split d_model evenly")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"{self.name}: n_kv_heads={self.n_kv_heads} does not divide "
                             f"n_heads={self.n_heads}; each key/value head serves a whole "
                             f"group of query heads")
        if self.d_head % 2:
            raise ValueError(f"{self.name}: d_head={self.d_head} is odd; rotary embeddings "
                             f"rotate pairs of dimensions")
        for f in ("rope_theta", "rms_norm_eps"):
            check_positive_number(f, getattr(self, f))
        for f in ("tied_embeddings", "attention_bias", "mlp_bias", "qk_norm"):
            if not isinstance(getattr(self, f), bool):
                raise ValueError(f"{f} must be True or False, got {getattr(self, f)!r}")
        if self.n_experts:
            self.moe_config()  # checks n_experts and experts_per_token together
            if self.mlp_bias:
                raise ValueError(f"{self.name}: the experts built here have no biases "
                                 f"(mlp_bias=False)")
        elif self.experts_per_token:
            raise ValueError(f"{self.name}: experts_per_token={self.experts_per_token} needs "
                             f"n_experts (0: a dense model)")

    def check_modelled(self, what: str) -> None:
        """A ValueError if ``what`` (a memory or speed calculator) does not model this block:
        experts, a head width other than d_model / n_heads, or normalized queries and keys."""
        reasons = []
        if self.n_experts:
            reasons.append(f"it is a mixture of experts (n_experts={self.n_experts}, "
                           f"{self.experts_per_token} per token)")
        if self.d_q != self.d_model:
            reasons.append(f"its heads are {self.d_head} wide, not d_model / n_heads = "
                           f"{self.d_model / self.n_heads:g}")
        if self.qk_norm:
            reasons.append("it normalizes each head's query and key (qk_norm)")
        if reasons:
            raise ValueError(f"{what} does not model {self.name} yet: " + "; ".join(reasons)
                             + " (count_parameters counts it: total and active parameters)")

    def moe_config(self) -> MoEConfig:
        """Each block's feed-forward layer as a mixture of experts (softmax top-k, renormalized
        gates: Mixtral's router)."""
        return MoEConfig(self.d_model, self.d_ff, self.n_experts, self.experts_per_token,
                         "topk")

    @property
    def d_head(self) -> int:
        """Width of one attention head: ``head_dim``, or d_model / n_heads."""
        return self.head_dim or self.d_model // self.n_heads

    @property
    def d_q(self) -> int:
        """Width of Q (and of the attention output): ``n_heads * d_head``."""
        return self.n_heads * self.d_head

    @property
    def d_kv(self) -> int:
        """Width of K (and of V): ``n_kv_heads * d_head``."""
        return self.n_kv_heads * self.d_head

    def replace(self, **changes) -> "LlamaConfig":
        """A copy with some fields changed (validated again)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return LlamaConfig(**values)


def count_llama_parameters(config: LlamaConfig) -> dict[str, int]:
    """Parameters of ``build_llama(config)``, part by part, under the same keys as the GPT's.

    Per block: ``attention`` = Q and O (``d x d`` each) and K and V (``d x d_kv`` each, with
    ``d_kv = n_kv_heads d_head``), plus their biases if ``attention_bias``; ``feed_forward`` =
    gate, up and down (``d x d_ff`` each, plus biases if ``mlp_bias``); ``layer_norms`` = two
    RMSNorm weights (2 d); ``block`` = their sum; ``blocks`` = n_layers blocks. Outside the
    blocks: ``token_embedding`` (vocab d), ``position_embedding`` (0: RoPE has no
    parameters), ``final_norm`` (d) and ``lm_head`` (0 when tied, else vocab d). ``total`` is
    all of it; ``tensors`` is how many parameter tensors the model has. With ``n_experts``,
    ``feed_forward`` is every expert plus the router (``d x n_experts``), and ``active`` (what
    one token uses: everything but the experts it did not choose, the embedding and the
    output layer included) is ``total`` less ``n_layers (n_experts - experts_per_token)``
    experts; without experts ``active`` is ``total``. ``routed_experts``: the parameters of
    all the routed experts (what expert parallelism divides), 0 without experts.
    """
    c = config
    d, f, kv, dq = c.d_model, c.d_ff, c.d_kv, c.d_q
    attention = (2 * d * dq + 2 * d * kv + (dq + 2 * kv + d if c.attention_bias else 0)
                 + (2 * c.d_head if c.qk_norm else 0))
    expert = 3 * d * f + (2 * f + d if c.mlp_bias else 0)
    experts = max(c.n_experts, 1)
    feed_forward = experts * expert + (d * c.n_experts if c.n_experts else 0)  # + the router
    layer_norms = 2 * d
    block = attention + feed_forward + layer_norms
    counts = {
        "attention": attention,
        "feed_forward": feed_forward,
        "layer_norms": layer_norms,
        "block": block,
        "blocks": c.n_layers * block,
        "token_embedding": c.vocab * d,
        "position_embedding": 0,
        "final_norm": d,
        "lm_head": 0 if c.tied_embeddings else c.vocab * d,
    }
    counts["total"] = sum(counts[k] for k in ("blocks", "token_embedding", "position_embedding",
                                              "final_norm", "lm_head"))
    unused = (c.n_experts - c.experts_per_token) * expert if c.n_experts else 0
    counts["active"] = counts["total"] - c.n_layers * unused
    counts["routed_experts"] = c.n_layers * c.n_experts * expert
    per_block = (4 * (2 if c.attention_bias else 1) + 3 * (2 if c.mlp_bias else 1) * experts + 2
                 + (1 if c.n_experts else 0) + (2 if c.qk_norm else 0))
    counts["tensors"] = per_block * c.n_layers + 2 + (0 if c.tied_embeddings else 1)
    return counts


def rotary_cos_sin(seq: int, d_head: int, theta: float, device=None,
                   dtype: torch.dtype = torch.float32,
                   positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, each (seq, d_head): position p, pair i turns by
    ``p * theta ** (-2 i / d_head)``; pair i is dimensions ``i`` and ``i + d_head / 2``.
    ``positions``: the ``seq`` tokens' positions (default 0 .. seq - 1; a context-parallel
    shard passes its own, :func:`parlab.context_parallel.positions`)."""
    inv_freq = theta ** (-torch.arange(0, d_head, 2, device=device, dtype=torch.float32) / d_head)
    at = torch.arange(seq, device=device) if positions is None else positions.to(device)
    angles = torch.outer(at.to(torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x[i], x[i + d_head/2]) of ``x`` (..., seq, d_head) by its angle."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class RMSNorm(nn.Module):
    """``x * rsqrt(mean(x^2) + eps) * weight``, computed in float32 and cast back."""

    def __init__(self, d_model: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * self.weight


class LlamaAttention(nn.Module):
    """Causal grouped-query self-attention with rotary position embeddings."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        d, dq, kv, bias = config.d_model, config.d_q, config.d_kv, config.attention_bias
        self.n_heads, self.n_kv_heads = config.n_heads, config.n_kv_heads
        self.d_head = config.d_head
        self.rope_theta = config.rope_theta
        self.q_proj = nn.Linear(d, dq, bias=bias)
        self.k_proj = nn.Linear(d, kv, bias=bias)
        self.v_proj = nn.Linear(d, kv, bias=bias)
        self.o_proj = nn.Linear(dq, d, bias=bias)
        if config.qk_norm:  # per head, over d_head, before the rotation (Qwen3)
            self.q_norm = RMSNorm(config.d_head, config.rms_norm_eps)
            self.k_norm = RMSNorm(config.d_head, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h, kv, hd = self.n_heads, self.n_kv_heads, self.d_head
        q = self.q_proj(x).view(b, t, h, hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, kv, hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, kv, hd).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = self.rotary(t, x.device, q.dtype)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        return self.o_proj(self.core(q, k, v).transpose(1, 2).reshape(b, t, h * hd))

    def rotary(self, t: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary tables for the ``t`` tokens this module is given, at positions 0 .. t - 1
        (context parallelism replaces this with its shard's positions)."""
        return rotary_cos_sin(t, self.d_head, self.rope_theta, device, dtype)

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal softmax(Q K^T / sqrt(d_head)) V per head, each key/value head serving
        n_heads / n_kv_heads consecutive query heads: the part selective recomputation
        re-runs (``parlab.memory.measure_recompute``). On (b, heads, T, d_head) tensors."""
        h, kv = q.shape[1], k.shape[1]
        if kv != h:
            k, v = k.repeat_interleave(h // kv, dim=1), v.repeat_interleave(h // kv, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class LlamaBlock(nn.Module):
    """Pre-norm decoder block: x + attn(attn_norm(x)), then + mlp(mlp_norm(.))."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.attn_norm = RMSNorm(config.d_model, config.rms_norm_eps)
        self.attn = LlamaAttention(config)
        self.mlp_norm = RMSNorm(config.d_model, config.rms_norm_eps)
        self.mlp = (MoE(config.moe_config(), seed=None) if config.n_experts
                    else SwiGLU(config.d_model, config.d_ff, config.mlp_bias))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    """A Llama-style decoder: token embedding, ``n_layers`` blocks, final RMSNorm, LM head."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        # Made from an empty tensor, then drawn like nn.Embedding's own (N(0, 1)) unless on the
        # meta device: a random draw there would first import torch._dynamo (seconds).
        self.embed_tokens = nn.Embedding(config.vocab, config.d_model,
                                         _weight=torch.empty(config.vocab, config.d_model))
        if not self.embed_tokens.weight.is_meta:
            nn.init.normal_(self.embed_tokens.weight)
        self.blocks = nn.ModuleList(LlamaBlock(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab, bias=False)
        if config.tied_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids (batch, seq) -> logits (batch, seq, vocab)."""
        t = idx.shape[1]
        if t > self.config.context:
            raise ValueError(f"sequence length {t} exceeds the context of {self.config.context}")
        x = self.embed_tokens(idx)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm(x))

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy."""
        return next_token_loss(self(idx), targets)


def build_llama(config: LlamaConfig, seed: int | None = 0, dtype: torch.dtype = torch.float32,
                device="cpu") -> Llama:
    """A real, randomly initialised :class:`Llama` for ``config`` (seeded for reproducibility).

    The weights are drawn on the CPU, so a seed gives the same model on every device; on
    ``device="meta"`` the module is made there directly: shapes only, no memory, no time.
    """
    if seed is not None:
        torch.manual_seed(seed)
    if torch.device(device).type == "meta":
        with torch.device("meta"):
            return Llama(config).to(dtype=dtype)
    return Llama(config).to(device=device, dtype=dtype)
