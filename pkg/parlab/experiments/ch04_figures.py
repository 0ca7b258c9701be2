"""Chapter 04's figure recipes and the strategies explorer: each runs ranks or counts, then
hands the result to :mod:`parlab.viz.plots`, which only draws.

:func:`qkv_example` computes Figure 8-16's numbers from a real small model;
:func:`book_names` maps the book's matrix names (Eepv, Eevp, ynA1+B1, ...) in Figures 8-16 to
8-19 to the notebook's, with their sizes here; :func:`cross_rail_bytes` takes Figure 8-19's
messages between servers across rails, by the spine or relayed over the High-speed Domain;
:func:`strategy_explorer` runs one linear layer under each of the slides' three strategies on
toy-backend ranks at every move of its sliders.
"""

from __future__ import annotations

import torch

from parlab.comm import NETWORK_SWITCHES, ring_wire_bytes, ROUTES, Topology
from parlab.experiments.ch04_attention import run_attention, run_ffn
from parlab.experiments.ch04_layers import run_layer_strategy
from parlab.models import GPT3_175B, TransformerConfig, build_model, count_parameters
from parlab.tensor_parallel import (
    attention_bytes, FIGURE_8_19_SIZES, layout, shard_spec, ShardSpec, slide_costs, total
)
from parlab.viz import Explorer, explore, figure
from parlab.viz.plots import (
    attention_bytes_figure, book_attention_figure, ffn_figure, local_qkv_figure,
    qkv_sharding_figure, strategy_figure, transformer_figure
)

__all__ = ["qkv_example", "qkv_shards", "book_names", "book_names_table", "cross_rail_bytes",
           "strategy_rows", "strategy_explorer"]


def qkv_example(tokens=(3, 7, 1, 5), seed: int = 0) -> dict[str, torch.Tensor]:
    """X (the normalized embeddings of ``tokens``), the three weight matrices, and Q, K, V.

    Built from a real small model (d_model 8, 2 heads). Q, K, V are computed by hand as
    X W^T + b and checked against the model's own projection layers.
    """
    if not tokens or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 16
                             for t in tokens):
        raise ValueError(f"tokens must be one or more token ids from 0 to 15 (the figure's "
                         f"vocabulary of 16), got {tokens!r}")
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
            if not torch.allclose(by_hand, proj(x), rtol=1.3e-6, atol=1e-5):
                raise AssertionError(f"{name} by hand differs from the model's layer")
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


def book_names(sizes=FIGURE_8_19_SIZES, batch: int = 4, micro_batches: int = 2) -> list[dict]:
    """The book's names in Figures 8-16 to 8-19, each with the notebook's name and its size here.

    One dict per name: ``book`` (as the book spells it), ``figure``, ``what`` it is,
    ``notebook`` (where the notebook holds it) and ``here`` (its shape or split with the
    sizes chapter 04 runs: :func:`qkv_example`, :func:`qkv_shards` and ``run_ffn(sizes,
    batch=batch, micro_batches=micro_batches)``).
    """
    if batch % micro_batches:
        raise ValueError(f"batch={batch} must split into micro_batches={micro_batches} equal "
                         f"micro-batches")
    qkv, shards = qkv_example(), qkv_shards()
    places = layout(sizes, 2)
    rows_per_micro_batch = batch // micro_batches

    def split(layer):
        return ", ".join(f"{p.neurons[0]}-{p.neurons[1]} on {p.gpu}" if p.neurons[0] != p.neurons[1]
                         else f"{p.neurons[0]} on {p.gpu}" for p in places if p.layer == layer)

    def columns(spec):
        return f"{spec.owner} columns {spec.start}-{spec.stop - 1}"

    def shape(t):
        return " x ".join(map(str, t.shape))

    return [
        {"book": "Eepv", "figure": "8-16", "what": "word + position embeddings, normalized",
         "notebook": "X (x in the runs)", "here": shape(qkv["X"])},
        {"book": "Eevp", "figure": "8-17", "what": "the same matrix",
         "notebook": "X, broadcast A1->A2", "here": shape(qkv["X"])},
        {"book": "Q, K, V matrices", "figure": "8-16", "what": "the weights",
         "notebook": "W_Q, W_K, W_V", "here": shape(qkv["W_Q"])},
        {"book": "Q, K, V vectors", "figure": "8-16", "what": "Eepv times the weights",
         "notebook": "Q, K, V", "here": shape(qkv["Q"])},
        {"book": "first/second fragments", "figure": "8-17", "what": "the weights' shards",
         "notebook": "qkv_shards()", "here": "; ".join(columns(s) for s in shards["Q"])},
        {"book": "Cv", "figure": "8-18", "what": "softmax weights times V",
         "notebook": "context (W_O's input)", "here": shape(qkv["V"])},
        {"book": "C1, C2", "figure": "8-19", "what": "context vectors, in turn",
         "notebook": "run_ffn's micro-batches",
         "here": f"{rows_per_micro_batch} x {sizes[0]} each"},
        {"book": "H1, H2", "figure": "8-19", "what": "hidden layers, a stage each",
         "notebook": "layout()'s H1, H2", "here": f"neurons {split('H1')}; {split('H2')}"},
        {"book": "ynA1+B1", "figure": "8-19", "what": "H1's output, all-gathered",
         "notebook": "y, sent A1->A2, B1->B2", "here": f"{rows_per_micro_batch} x {sizes[1]}"},
        {"book": "ynA2+B2", "figure": "8-19", "what": "H2's output, all-gathered",
         "notebook": "y, sent A2->A3, B2->B3", "here": f"{rows_per_micro_batch} x {sizes[2]}"},
    ]


def book_names_table(rows: list[dict] | None = None) -> str:
    """:func:`book_names` as a text table, one line per name."""
    rows = book_names() if rows is None else rows
    head = {"book": "the book", "figure": "figure", "what": "what it is",
            "notebook": "in this notebook", "here": "here"}
    keys = ("book", "figure", "what", "notebook", "here")
    widths = {k: max(len(r[k]) for r in [head, *rows]) for k in keys}
    return "\n".join("  ".join(f"{r[k]:<{widths[k]}}" for k in keys).rstrip()
                     for r in [head, *rows])


def cross_rail_bytes(comparison, topology: Topology) -> dict:
    """Figure 8-19's messages between servers, moved across rails, by each way between rails.

    ``comparison`` is a ``run_ffn(..., backend="toy")`` run, whose sends between servers
    all stay on one rail. Each is re-addressed to the other rail's GPU of the receiving
    server (A1 -> B2 instead of A1 -> A2), then routed by :meth:`Topology.route` both ways.
    Per phase: ``messages`` and their ``bytes``, and per way (``"spine"``, ``"relay"``) the
    bytes on each link type and ``switches``, the passes of a message through a network switch
    (:data:`parlab.comm.NETWORK_SWITCHES`), all messages together.
    """
    if comparison.traffic is None:
        raise ValueError("no traffic was logged: run run_ffn(..., backend='toy')")
    g = topology.gpus_per_server
    if g < 2:
        raise ValueError("one GPU per server has no other rail to cross to")
    out = {}
    for phase, log in comparison.traffic.items():
        sends = [t for t in log.records
                 if t.op == "send" and topology.link_type(t.src, t.dst) == "rail"]
        row = {"messages": len(sends), "bytes": sum(t.nbytes for t in sends)}
        for via in ROUTES:
            per = {"nvlink": 0, "rail": 0, "spine": 0, "switches": 0}
            for t in sends:
                for _, _, kind in topology.route(t.src, t.dst - t.dst % g + (t.dst + 1) % g, via):
                    per[kind] += t.nbytes
                    per["switches"] += NETWORK_SWITCHES[kind]
            row[via] = per
        out[phase] = row
    return out


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
