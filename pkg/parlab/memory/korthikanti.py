"""Our activation count for one transformer block beside the textbook formula of Korthikanti et al.

Why this module exists: the formula most often quoted for a transformer layer's activations is
the one in section 4.1 of Korthikanti et al. (2022), "Reducing Activation Recomputation in
Large Transformer Models": s b h (34 + 5 a s / h) bytes per layer. Our own count
(:func:`parlab.memory.block_activations`, checked against a measured step) gives a different
number for the same shape, and :func:`compare_block` lays the two side by side, term by term,
with the reason for each difference: the paper counts Megatron's GPT, which has dropout, and
ours has none.

The paper's terms, for s = sequence length, b = micro-batch, h = hidden size, a = attention
heads, 16-bit activations (2 bytes an element) and 1-byte dropout masks, the feed-forward
width being 4h. Each matrix multiply keeps its inputs, each non-linearity what its backward
needs:

attention block, 11 s b h + 5 a s^2 b:

- Q, K, V projections: their one shared input, 2 s b h;
- Q K^T: both of its inputs, Q and K, 4 s b h;
- softmax: its output, 2 a s^2 b;
- dropout on the softmax output: its mask, a s^2 b;
- the product with V: its two inputs, the dropout's output, 2 a s^2 b, and V, 2 s b h;
- output projection: its input, 2 s b h;
- dropout after the attention: its mask, s b h;

MLP block, 19 s b h:

- first linear layer: its input, 2 s b h;
- GeLU: its input, 8 s b h (the first layer's output, 4h wide);
- second linear layer: its input (GeLU's output), 8 s b h;
- dropout after the MLP: its mask, s b h;

LayerNorms, 4 s b h: each of the two keeps its input, 2 s b h.

That sums to s b h (34 + 5 a s / h). The paper leaves out small buffers such as LayerNorm's
mean and variance. :func:`korthikanti_terms` returns these terms in bytes for any
:class:`~parlab.models.TransformerConfig` (its own d_ff in place of 4h, ``element_bytes`` in
place of 2; masks stay 1 byte); ``dropout=False`` drops the three masks and the dropout's
output, since the product with V then reads the softmax output, which is already kept.
"""

from __future__ import annotations

from parlab.memory.calculator import block_activations
from parlab.memory.states import check_precision
from parlab.models import get_config, TransformerConfig
from parlab.checks import check_count

__all__ = ["korthikanti_terms", "compare_block"]

_NO_DROPOUT = "no dropout in our GPT"

#: (term, the keys of :func:`parlab.memory.block_activations` it matches, why they differ).
#: The first thirteen are the paper's terms, in the paper's order; the last two it leaves out.
_ROWS = (
    ("attention: Q, K, V input", ("ln1 output",),
     "same tensor: ln1's output, kept once for the three projections"),
    ("attention: Q and K for QK^T", ("q heads", "k heads"),
     "same: copies of the Q and K heads, kept by the matmul"),
    ("attention: softmax output", ("softmax probabilities",),
     "same b·h·T² probabilities; fused SDPA (flash) keeps a logsumexp instead"),
    ("attention: softmax dropout mask", (), _NO_DROPOUT),
    ("attention: dropout output for V", (),
     "no dropout: the V product reads the softmax output, already kept"),
    ("attention: V", ("v heads",), "same: a copy of the V heads"),
    ("attention: output projection input", ("attention output",),
     "same: the heads put back together"),
    ("attention: dropout mask", (), _NO_DROPOUT),
    ("MLP: first linear input", ("ln2 output",), "same tensor: ln2's output"),
    ("MLP: GeLU input", ("gelu input",), "same: fc1's output, d_ff wide"),
    ("MLP: second linear input", ("gelu output",), "same: GELU's output, d_ff wide"),
    ("MLP: dropout mask", (), _NO_DROPOUT),
    ("LayerNorm: inputs", ("ln1 input", "ln2 input"), "same: both LayerNorms' inputs"),
    ("LayerNorm: mean and rstd", ("ln mean/rstd",),
     "left out by the paper: 4 values per token, fp32 on CUDA"),
    ("attention: causal mask", ("causal mask",),
     "not in the paper: our T×T bool mask, kept by masked_fill"),
)


def korthikanti_terms(config, batch: int, seq: int, element_bytes: int = 2,
                      dropout: bool = True) -> dict[str, int]:
    """Korthikanti et al.'s activation bytes of one layer, term by term (module docstring).

    ``config``: a :class:`~parlab.models.TransformerConfig` or its name; ``batch`` = b,
    ``seq`` = s, h = d_model, a = n_heads, and the MLP terms use d_ff (4h in the paper, and
    in every GPT config). With ``element_bytes=2`` and ``dropout=True`` (the paper's case) and
    d_ff = 4h the values add up to s b h (34 + 5 a s / h). ``dropout=False``: the three masks
    and the softmax dropout's output are 0.
    """
    c = get_config(config) if isinstance(config, str) else config
    if not isinstance(c, TransformerConfig):
        raise TypeError(f"config must be a TransformerConfig or its name, got {config!r}")
    for name, value in (("batch", batch), ("seq", seq), ("element_bytes", element_bytes)):
        check_count(name, value)
    if not isinstance(dropout, bool):
        raise TypeError(f"dropout must be True or False, got {dropout!r}")
    e, mask = element_bytes, int(dropout)
    sbh, as2b, sbf = seq * batch * c.d_model, c.n_heads * seq * seq * batch, seq * batch * c.d_ff
    values = (e * sbh, 2 * e * sbh, e * as2b, mask * as2b, mask * e * as2b, e * sbh, e * sbh,
              mask * sbh, e * sbh, e * sbf, e * sbf, mask * sbh, 2 * e * sbh)
    return {term: v for (term, _, _), v in zip(_ROWS, values)}


def compare_block(config, batch: int, seq: int, precision: str = "bf16"):
    """One row per term: ``Korthikanti`` bytes (with dropout, as in the paper), ``ours`` (what
    autograd saves for one block of our GPT, :func:`parlab.memory.block_activations`) and
    ``why they differ``, as a ``pandas.DataFrame`` indexed by term. Both columns use the
    element size of ``precision``; the rows add up to each count's total for the block.
    """
    import pandas as pd

    e = check_precision(precision).bytes
    theirs = korthikanti_terms(config, batch, seq, e)
    ours = block_activations(config, batch, seq, precision)
    rows = [(term, theirs.get(term, 0), sum(ours[k] for k in keys), why)
            for term, keys, why in _ROWS]
    return pd.DataFrame(rows, columns=["term", "Korthikanti", "ours", "why they differ"]
                        ).set_index("term")
