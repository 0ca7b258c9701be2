"""Figures 8-15 and 8-16: the transformer the tensor-parallel chapter splits, drawn from
real objects.

Figure 8-15 is the decoder stack, labelled with the parameter counts that
:func:`parlab.models.count_parameters` derives from a configuration (GPT-3 175B by
default). Figure 8-16 is the first step of self-attention on one GPU: a few tokens' embedding
vectors times W_Q, W_K and W_V. It is drawn from a real model built by
:func:`parlab.models.build_model`, and the Q, K, V it shows are what that model's projection
layers return (checked when the figure is drawn).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch

from parlab.viz.registry import figure
from parlab.models import GPT3_175B, TransformerConfig, build_model, count_parameters

__all__ = ["transformer_figure", "qkv_example", "local_qkv_figure"]


def _count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return str(n)


def transformer_figure(config: TransformerConfig = GPT3_175B):
    """The decoder stack of ``config``: embeddings, one block opened up, the LM head."""
    counts = count_parameters(config)
    c = config
    fig, ax = plt.subplots(figsize=(8.2, 8.4))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 13.0)
    ax.axis("off")

    def box(y, text, color, x=1.2, w=7.6, h=0.8, weight="normal"):
        ax.add_patch(plt.Rectangle((x, y), w, h, facecolor=color, edgecolor="#555", lw=1))
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=9, weight=weight)

    def arrow(y0, y1):
        ax.annotate("", xy=(5, y1), xytext=(5, y0), arrowprops=dict(arrowstyle="->", color="#444"))

    box(0.2, "input words x1, x2, ...  ->  token ids", "#eeeeee")
    arrow(1.0, 1.4)
    box(1.4, f"token embedding {c.vocab:,} x {c.d_model:,} ({_count(counts['token_embedding'])})"
        f"  +  position {c.context:,} x {c.d_model:,} ({_count(counts['position_embedding'])})",
        "#d9e7f5")
    arrow(2.2, 2.7)
    ax.add_patch(plt.Rectangle((0.8, 2.7), 8.4, 7.9, facecolor="none", edgecolor="#4C72B0",
                               lw=2, ls="--"))
    ax.text(9.1, 10.35, f"x {c.n_layers} blocks = {_count(counts['blocks'])}", ha="right",
            va="center", fontsize=10, color="#4C72B0", weight="bold")
    box(3.0, "LayerNorm", "#f3f3f3", h=0.6)
    arrow(3.6, 4.0)
    box(4.0, f"self-attention: W_Q, W_K, W_V, W_O ({c.n_heads} heads of {c.d_head})\n"
        f"4 x {c.d_model:,} x {c.d_model:,} + biases = {_count(counts['attention'])}",
        "#c9e4c5", h=1.2, weight="bold")
    ax.text(9.0, 4.6, "Figures\n8-16 to 8-18", ha="left", va="center", fontsize=8, color="#555")
    arrow(5.2, 5.6)
    box(5.6, "add the block's input (residual)", "#f3f3f3", h=0.6)
    arrow(6.2, 6.6)
    box(6.6, "LayerNorm", "#f3f3f3", h=0.6)
    arrow(7.2, 7.6)
    box(7.6, f"feed-forward: {c.d_model:,} -> {c.d_ff:,} (GELU) -> {c.d_model:,}\n"
        f"2 x {c.d_model:,} x {c.d_ff:,} + biases = {_count(counts['feed_forward'])}",
        "#f6d5c3", h=1.2, weight="bold")
    ax.text(9.0, 8.2, "Figure\n8-19", ha="left", va="center", fontsize=8, color="#555")
    arrow(8.8, 9.2)
    box(9.2, "add (residual)", "#f3f3f3", h=0.6)
    arrow(10.6, 11.0)
    box(11.0, "final LayerNorm", "#f3f3f3", h=0.6)
    arrow(11.6, 12.0)
    head = ("shares the token embedding's weights" if c.tied_embeddings
            else f"{_count(counts['lm_head'])} weights")
    box(12.0, f"output projection to {c.vocab:,} words ({head}), softmax", "#e7d9f0")
    ax.set_title(f"Figure 8-15: {c.name}, {counts['total']:,} parameters "
                 f"(about {_count(counts['total'])})", fontsize=11)
    return fig


def qkv_example(tokens=(3, 7, 1, 5), seed: int = 0) -> dict[str, torch.Tensor]:
    """X (the normalized embeddings of ``tokens``), the three weight matrices, and Q, K, V.

    Built from a real small model (d_model 8, 2 heads). Q, K, V are computed by hand as
    X W^T + b and checked against the model's own projection layers.
    """
    config = TransformerConfig("figure-8-16", d_model=8, n_layers=1, n_heads=2, d_ff=32,
                               vocab=16, context=len(tokens))
    model = build_model(config, seed=seed)
    attn = model.blocks[0].attn
    with torch.no_grad():
        idx = torch.tensor(tokens)
        x = model.blocks[0].ln1(model.wte(idx) + model.wpe(torch.arange(len(tokens))))
        out = {"X": x}
        for name, proj in (("Q", attn.q_proj), ("K", attn.k_proj), ("V", attn.v_proj)):
            by_hand = x @ proj.weight.T + proj.bias
            torch.testing.assert_close(by_hand, proj(x))  # the layer does what the figure shows
            out[f"W_{name}"] = proj.weight.T.detach()
            out[name] = by_hand
    return out


def local_qkv_figure(tokens=(3, 7, 1, 5), seed: int = 0):
    """Figure 8-16: X times W_Q, W_K, W_V on one GPU, as heat maps of the real numbers."""
    m = qkv_example(tokens, seed)
    fig, axes = plt.subplots(3, 3, figsize=(9, 7.2),
                             gridspec_kw={"width_ratios": [1, 1, 1]})
    limit = max(float(t.abs().max()) for t in m.values())
    for row, name in enumerate(("Q", "K", "V")):
        for col, (label, t) in enumerate((("X (embeddings)", m["X"]), (f"W_{name}", m[f"W_{name}"]),
                                          (name, m[name]))):
            ax = axes[row, col]
            ax.imshow(t.numpy(), cmap="RdBu_r", vmin=-limit, vmax=limit)
            ax.set_title(f"{label}  {tuple(t.shape)[0]} x {tuple(t.shape)[1]}", fontsize=9)
            ax.set_xticks([])
            ax.set_yticks(range(t.shape[0]) if col != 1 else [])
            if col != 1:
                ax.set_yticklabels([f"x{i + 1}" for i in range(t.shape[0])], fontsize=8)
        axes[row, 0].annotate("x", xy=(1.12, 0.5), xycoords="axes fraction", fontsize=14,
                              ha="center", va="center")
        axes[row, 1].annotate("=", xy=(1.12, 0.5), xycoords="axes fraction", fontsize=14,
                              ha="center", va="center")
    fig.suptitle("Figure 8-16: each token's vector times W_Q, W_K, W_V gives its query, key "
                 "and value\n(4 tokens, d_model 8, from a real model; one GPU holds it all)",
                 fontsize=10)
    fig.tight_layout()
    return fig


@figure("fig-8-15-transformer", "Figure 8-15: GPT-3's decoder stack, counted from its config")
def _figure_8_15():
    return transformer_figure(GPT3_175B)


@figure("fig-8-16-local-qkv", "Figure 8-16: Q, K, V from the embeddings on one GPU")
def _figure_8_16():
    return local_qkv_figure()
