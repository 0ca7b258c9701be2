"""Figures 8-15 and 8-16: the transformer the tensor-parallel chapter splits, drawn from
real objects.

Figure 8-15 is the decoder stack, labelled with the parameter counts that
:func:`parlab.models.count_parameters` derives from a configuration (the caller counts and
passes them). Figure 8-16 is the first step of self-attention on one GPU: a few tokens'
embedding vectors times W_Q, W_K and W_V, drawn from the numbers :func:`parlab.experiments.qkv_example`
computes with a real model (its Q, K, V are what that model's projection layers return).
"""

from __future__ import annotations

from parlab.models import TransformerConfig
from parlab.viz.lazy import plt

__all__ = ["transformer_figure", "local_qkv_figure"]


def _count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return str(n)


def transformer_figure(config: TransformerConfig, counts: dict):
    """The decoder stack of ``config``: embeddings, one block opened up, the LM head, labelled
    with ``counts``, what :func:`parlab.models.count_parameters` returns for ``config``.

    The boxes are stacked bottom up with room for every label: a label too long for one
    line is broken in two, and the notes on the right sit outside the dashed block.
    """
    c = config
    head = ("shares the token embedding's weights" if c.tied_embeddings
            else f"{_count(counts['lm_head'])} weights")
    block = "block"  # the boxes inside the dashed frame of one decoder block
    # (text, colour, height, bold, where, note on the right) from the bottom up
    stack = [
        ("input words x1, x2, ...  ->  token ids", "#eeeeee", 0.7, False, None, None),
        (f"token embedding {c.vocab:,} x {c.d_model:,} ({_count(counts['token_embedding'])})\n"
         f"+ position {c.context:,} x {c.d_model:,} ({_count(counts['position_embedding'])})",
         "#d9e7f5", 1.0, False, None, None),
        ("LayerNorm", "#f3f3f3", 0.6, False, block, None),
        (f"self-attention: W_Q, W_K, W_V, W_O ({c.n_heads} heads of {c.d_head})\n"
         f"4 x {c.d_model:,} x {c.d_model:,} + biases = {_count(counts['attention'])}",
         "#c9e4c5", 1.1, True, block, "Figures\n8-16 to 8-18"),
        ("add the block's input (residual)", "#f3f3f3", 0.6, False, block, None),
        ("LayerNorm", "#f3f3f3", 0.6, False, block, None),
        (f"feed-forward: {c.d_model:,} -> {c.d_ff:,} (GELU) -> {c.d_model:,}\n"
         f"2 x {c.d_model:,} x {c.d_ff:,} + biases = {_count(counts['feed_forward'])}",
         "#f6d5c3", 1.1, True, block, "Figure\n8-19"),
        ("add (residual)", "#f3f3f3", 0.6, False, block, None),
        ("final LayerNorm", "#f3f3f3", 0.6, False, None, None),
        (f"output projection to {c.vocab:,} words, softmax\n({head})", "#e7d9f0", 1.0, False,
         None, None),
    ]
    x, w, gap, frame, label = 0.8, 8.4, 0.45, 0.35, 0.5  # label: room for "x 96 blocks"
    fig, ax = plt.subplots(figsize=(8.6, 9.0))
    y, tops, block_rows = 0.2, [], []
    for i, (text, color, h, bold, where, note) in enumerate(stack):
        if i:  # an arrow from the box below, across the gap and any edge of the frame
            below = stack[i - 1][4]
            margin = (frame if where == block and below is None else
                      frame + label if where is None and below == block else 0)
            y = tops[-1] + gap + margin
            ax.annotate("", xy=(x + w / 2, y), xytext=(x + w / 2, tops[-1]),
                        arrowprops=dict(arrowstyle="->", color="#444"))
        ax.add_patch(plt.Rectangle((x, y), w, h, facecolor=color, edgecolor="#555", lw=1))
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=9,
                weight="bold" if bold else "normal")
        if note:
            ax.text(x + w + frame + 0.2, y + h / 2, note, ha="left", va="center", fontsize=8,
                    color="#555")
        if where == block:
            block_rows.append((y, y + h))
        tops.append(y + h)
    low, high = block_rows[0][0] - frame, block_rows[-1][1] + frame + label
    ax.add_patch(plt.Rectangle((x - frame, low), w + 2 * frame, high - low, facecolor="none",
                               edgecolor="#4C72B0", lw=2, ls="--"))
    ax.text(x + w, high - 0.25, f"x {c.n_layers} blocks = {_count(counts['blocks'])}",
            ha="right", va="center", fontsize=10, color="#4C72B0", weight="bold")
    ax.set_xlim(0, 11.4)
    ax.set_ylim(0, tops[-1] + 0.2)
    ax.axis("off")
    ax.set_title(f"Figure 8-15: {c.name}, {counts['total']:,} parameters "
                 f"(about {_count(counts['total'])})", fontsize=11)
    fig.tight_layout()
    return fig


def local_qkv_figure(m: dict):
    """Figure 8-16: X times W_Q, W_K, W_V on one GPU, as heat maps of the real numbers.

    ``m`` holds X, W_Q, W_K, W_V, Q, K and V, as :func:`parlab.experiments.qkv_example`
    computes them.
    """
    # a fixed layout: constrained layout spent 0.3 s placing these ten axes (half the drawing)
    fig, axes = plt.subplots(3, 3, figsize=(10, 7.2), gridspec_kw={
        "left": 0.05, "right": 0.86, "bottom": 0.03, "top": 0.89, "wspace": 0.28, "hspace": 0.22})
    limit = max(float(t.abs().max()) for t in m.values())  # one scale for all nine panels
    for row, name in enumerate(("Q", "K", "V")):
        for col, (label, t) in enumerate((("X (embeddings)", m["X"]), (f"W_{name}", m[f"W_{name}"]),
                                          (name, m[name]))):
            ax = axes[row, col]
            image = ax.imshow(t.numpy(), cmap="RdBu_r", vmin=-limit, vmax=limit)
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
    fig.colorbar(image, cax=fig.add_axes((0.89, 0.22, 0.018, 0.5)),
                 label="value of each entry (one colour scale for all nine panels)")
    return fig
