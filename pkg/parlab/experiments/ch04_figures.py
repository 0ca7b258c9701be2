"""Chapter 04's figure recipes and the strategies explorer: each runs ranks or counts, then
hands the result to :mod:`parlab.viz.plots`, which only draws.

:func:`qkv_example` computes Figure 8-16's numbers from a real small model;
:func:`strategy_explorer` runs one linear layer under each of the slides' three strategies on
toy-backend ranks at every move of its sliders.
"""

from __future__ import annotations

import torch

from parlab.comm import ring_wire_bytes
from parlab.experiments.ch04_attention import run_attention, run_ffn
from parlab.experiments.ch04_layers import run_layer_strategy
from parlab.models import GPT3_175B, TransformerConfig, build_model, count_parameters
from parlab.tensor_parallel import attention_bytes, shard_spec, ShardSpec, slide_costs, total
from parlab.viz import Explorer, explore, figure
from parlab.viz.plots import (
    attention_bytes_figure, book_attention_figure, ffn_figure, local_qkv_figure,
    qkv_sharding_figure, strategy_figure, transformer_figure
)

__all__ = ["qkv_example", "qkv_shards", "strategy_rows", "strategy_explorer"]


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


def qkv_shards(d_model: int = 8, ranks: int = 2) -> dict[str, list[ShardSpec]]:
    """Figure 8-17's cuts: for "Q", "K", "V", the :class:`~parlab.tensor_parallel.ShardSpec`
    of each GPU (A1, A2, ...) of a ``d_model`` x ``d_model`` weight split by its rows, the
    output columns of the book's layout, as :class:`parlab.tensor_parallel.BookAttention`
    cuts them."""
    names = [f"A{r + 1}" for r in range(ranks)]
    return {letter: shard_spec(f"W_{letter}", (d_model, d_model), "rows", ranks, owners=names)
            for letter in "QKV"}


#: Which collective of each strategy's step carries the tensor the slide counts:
#: (phase, op) of the toy log.
_SLIDE_COLLECTIVE = {"data": ("backward", "all_reduce"),
                     "partition_output": ("forward", "all_gather"),
                     "reduce_output": ("backward", "all_gather")}


def strategy_rows(batch: int, c_in: int, c_out: int, world_size: int = 2) -> list[dict]:
    """Run one linear layer under each strategy on the toy backend; one row per strategy.

    ``formula``: the slide's count x 4 bytes; ``measured``: the payload of the collective
    that count describes (its wire bytes over the ring factor); ``wire``: every byte the
    layer's forward and backward passes put on the wire; ``max_error``: against one device.
    """
    rows = []
    for strategy, count in slide_costs(batch, c_in, c_out).items():
        c = run_layer_strategy(strategy, batch, c_in, c_out, world_size, backend="toy")
        phase, op = _SLIDE_COLLECTIVE[strategy]
        moved = c.bytes_by_op()[phase][op]
        rows.append({"strategy": strategy, "formula": 4 * count,
                     "measured": moved / ring_wire_bytes(op, 1, world_size),
                     "wire": sum(c.total_bytes().values()), "max_error": c.max_error})
    return rows


def strategy_explorer(batch: int = 8, c_in: int = 64, c_out: int = 128) -> Explorer:
    """Sliders over B, C_in and C_out; each move runs the three strategies on 2 toy ranks."""
    import ipywidgets as w

    def draw(batch, c_in, c_out):
        rows = strategy_rows(batch, c_in, c_out)
        for r in rows:
            print(f"{r['strategy']:<17} formula {r['formula']:>8,.0f} B   measured "
                  f"{r['measured']:>8,.0f} B   all traffic {r['wire']:>8,.0f} B")
        return strategy_figure(rows, f"one linear layer, B={batch}, C_in={c_in}, C_out={c_out}, "
                                     f"2 ranks, fp32")

    slider = lambda value, name: w.IntSlider(value=value, min=2, max=256, step=2, description=name,
                                             continuous_update=False)
    return explore(draw, {"batch": slider(batch, "B"), "c_in": slider(c_in, "C_in"),
                          "c_out": slider(c_out, "C_out")},
                   "sliders for B, C_in and C_out: the slides' per-layer communication beside "
                   "the bytes the toy backend measured")


# --------------------------------------------------------------------------- figure recipes


@figure("fig-8-15-transformer", "Figure 8-15: GPT-3's decoder stack, counted from its config")
def _figure_8_15():
    return transformer_figure(GPT3_175B, count_parameters(GPT3_175B))


@figure("fig-8-16-local-qkv", "Figure 8-16: Q, K, V from the embeddings on one GPU")
def _figure_8_16():
    return local_qkv_figure(qkv_example())


@figure("fig-8-17-qkv-sharding", "Figure 8-17: W_Q, W_K, W_V split by columns over A1 and A2")
def _fig_8_17():
    return qkv_sharding_figure(qkv_shards())


@figure("fig-8-18-attention-tensor-parallel",
        "Figure 8-18: the book's attention on A1 and A2, bytes per collective (toy backend)")
def _fig_8_18():
    return book_attention_figure(run_attention("book", backend="toy"))


@figure("fig-8-19-ffn-tensor-pipeline",
        "Figure 8-19: the feed-forward layer on 6 GPUs, bytes per NVLink and rail link")
def _fig_8_19():
    return ffn_figure(run_ffn(backend="toy"))


@figure("fig-04-attention-bytes", "Chapter 04: bytes of the book's, Megatron's and PyTorch's "
                                  "attention at GPT-3 size (formulas checked on the toy backend)")
def _fig_attention_bytes():
    rows = {v: total(attention_bytes(v, 1, 2048, 12288, n=8, element=2))
            for v in ("book", "megatron", "pytorch")}
    return attention_bytes_figure(rows, "one GPT-3 attention layer, 8 GPUs, fp16, 2048 tokens")
