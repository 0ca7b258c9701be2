"""DeepSeek-V3's shape, counted from its ``config.json`` (not built: its attention is its own).

Why this module exists: DeepSeek-V3 is the mixture of experts a reader meets most often in
2026, and its totals are quoted everywhere: 671 B parameters, 37 B of them used per token
(DeepSeek-V3 Technical Report, arXiv 2412.19437, abstract; the published checkpoint adds a
14 B multi-token-prediction module, which is left out here as the report leaves it out).
Its blocks differ from a Llama block in two ways that change the count:

- **multi-head latent attention (MLA)**: queries and keys/values pass through low-rank
  bottlenecks. Per layer: ``q_a`` (d x q_lora), an RMSNorm (q_lora), ``q_b`` (q_lora x
  heads (nope + rope)); ``kv_a`` (d x (kv_lora + rope)), an RMSNorm (kv_lora), ``kv_b``
  (kv_lora x heads (nope + v)); ``o`` (heads v x d);
- **experts**: the first ``dense_layers`` blocks have a dense SwiGLU (``d_ff`` wide), the
  others 256 routed experts and 1 shared expert (``d_ff_expert`` wide each), a router
  (d x experts) and the per-expert bias that steers the choice (counted: the checkpoint
  stores it).

:func:`count_deepseek_parameters` returns the keys of the other families' counts.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from parlab.checks import check_count

__all__ = ["DeepSeekV3Config", "count_deepseek_parameters"]


@dataclass(frozen=True)
class DeepSeekV3Config:
    """The fields of a DeepSeek-V3 ``config.json`` that shape the parameters."""

    name: str
    d_model: int
    n_layers: int
    dense_layers: int
    d_ff: int
    d_ff_expert: int
    n_experts: int
    shared_experts: int
    experts_per_token: int
    vocab: int
    n_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_dim: int
    qk_rope_dim: int
    v_head_dim: int
    tied_embeddings: bool = False

    def __post_init__(self):
        for f in fields(self):
            if f.name not in ("name", "tied_embeddings", "shared_experts", "dense_layers"):
                check_count(f.name, getattr(self, f.name))
        if self.experts_per_token > self.n_experts:
            raise ValueError(f"{self.name}: experts_per_token={self.experts_per_token} is more "
                             f"than n_experts={self.n_experts}")
        if not 0 <= self.dense_layers <= self.n_layers:
            raise ValueError(f"{self.name}: dense_layers={self.dense_layers} must be from 0 to "
                             f"n_layers={self.n_layers}")

    def replace(self, **changes) -> "DeepSeekV3Config":
        return replace(self, **changes)

    def check_modelled(self, what: str) -> None:
        """Always a ValueError: the calculators model GPT and Llama-style blocks only."""
        raise ValueError(f"{what} does not model {self.name} yet (multi-head latent attention "
                         f"and experts); count_parameters counts it: total and active")


def count_deepseek_parameters(c: DeepSeekV3Config) -> dict[str, int]:
    """Parameters of DeepSeek-V3 (module docstring), under the keys of the other families.

    ``attention``, ``feed_forward``, ``layer_norms`` and ``block`` describe one expert block;
    ``blocks`` adds the dense blocks too; ``active`` keeps, of the routed experts, the
    ``experts_per_token`` a token uses (the shared expert, the router and everything outside
    the experts serve every token).
    """
    d, heads = c.d_model, c.n_heads
    attention = (d * c.q_lora_rank + c.q_lora_rank
                 + c.q_lora_rank * heads * (c.qk_nope_dim + c.qk_rope_dim)
                 + d * (c.kv_lora_rank + c.qk_rope_dim) + c.kv_lora_rank
                 + c.kv_lora_rank * heads * (c.qk_nope_dim + c.v_head_dim)
                 + heads * c.v_head_dim * d)
    expert = 3 * d * c.d_ff_expert
    router = d * c.n_experts + c.n_experts            # weights and the choice-steering bias
    feed_forward = (c.n_experts + c.shared_experts) * expert + router
    layer_norms = 2 * d
    block = attention + feed_forward + layer_norms
    dense_block = attention + 3 * d * c.d_ff + layer_norms
    moe_layers = c.n_layers - c.dense_layers
    counts = {
        "attention": attention, "feed_forward": feed_forward, "layer_norms": layer_norms,
        "block": block, "blocks": moe_layers * block + c.dense_layers * dense_block,
        "token_embedding": c.vocab * d, "position_embedding": 0, "final_norm": d,
        "lm_head": 0 if c.tied_embeddings else c.vocab * d,
    }
    counts["total"] = sum(counts[k] for k in ("blocks", "token_embedding", "position_embedding",
                                              "final_norm", "lm_head"))
    counts["active"] = counts["total"] - moe_layers * (c.n_experts - c.experts_per_token) * expert
    counts["routed_experts"] = moe_layers * c.n_experts * expert
    per_block = 7 + 2  # MLA's five matrices and two norms; the block's two norms
    counts["tensors"] = (c.dense_layers * (per_block + 3)
                         + moe_layers * (per_block + 3 * (c.n_experts + c.shared_experts) + 2)
                         + 2 + (0 if c.tied_embeddings else 1))
    return counts
