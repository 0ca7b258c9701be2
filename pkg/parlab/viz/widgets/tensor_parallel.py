"""Chapter 04 explorers: the slides' per-layer costs beside real toy-backend measurements; the
bytes of the three attention splits for any model size; parameter memory per GPU.

All three follow :func:`parlab.viz.explore` (static figure first, then live controls).
"""

from __future__ import annotations

from parlab.viz.explorer import Explorer, explore

__all__ = ["strategy_rows", "strategy_explorer", "attention_explorer", "shard_memory_explorer"]

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
    from parlab.comm import ring_wire_bytes
    from parlab.tensor_parallel import run_layer_strategy, slide_costs
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

    from parlab.viz.plots.tensor_parallel import strategy_figure

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


def attention_explorer(batch: int = 1, seq: int = 2048, d_model: int = 12288, ranks: int = 8,
                       precision: str = "fp16") -> Explorer:
    """Bytes of one attention layer, book vs Megatron vs PyTorch, for any size (formulas)."""
    import ipywidgets as w

    from parlab.viz.plots.tensor_parallel import attention_bytes_figure
    from parlab.tensor_parallel import attention_bytes, total

    def draw(batch, seq, d_model, ranks, precision):
        element = 2 if precision in ("fp16", "bf16") else 4
        rows = {v: total(attention_bytes(v, batch, seq, d_model, ranks, element))
                for v in ("book", "megatron", "pytorch")}
        ratio = sum(rows["book"].values()) / sum(rows["megatron"].values())
        print(f"the book's split moves {ratio:.2f}x the bytes of Megatron's")
        return attention_bytes_figure(rows, f"one attention layer: batch {batch} x {seq} tokens, "
                                            f"d_model {d_model}, {ranks} GPUs, {precision}")

    controls = {
        "batch": w.IntSlider(value=batch, min=1, max=32, description="batch",
                             continuous_update=False),
        "seq": w.Dropdown(options=[128, 512, 1024, 2048, 4096], value=seq, description="tokens"),
        "d_model": w.Dropdown(options=[768, 1600, 4096, 12288], value=d_model,
                              description="d_model"),
        "ranks": w.Dropdown(options=[2, 4, 8], value=ranks, description="GPUs"),
        "precision": w.Dropdown(options=["fp16", "fp32"], value=precision,
                                description="precision"),
    }
    return explore(draw, controls, "batch, tokens, d_model, GPUs and precision: bytes per "
                                   "attention layer for the three splits")


def shard_memory_explorer(model: str = "GPT-3 175B", precision: str = "fp16") -> Explorer:
    """Parameter memory per GPU for tensor-parallel degrees 1 to 8, any model of parlab.models."""
    import ipywidgets as w

    from parlab.models import CONFIGS
    from parlab.viz.plots.tensor_parallel import memory_figure
    from parlab.tensor_parallel import parameter_memory

    def draw(model, precision):
        rows = parameter_memory(model, (1, 2, 4, 8), precision)
        return memory_figure(rows, title=f"{model}: parameters per GPU ({precision})")

    splittable = [n for n, c in CONFIGS.items() if c.n_heads % 8 == 0 and n != "tiny"]
    controls = {"model": w.Dropdown(options=splittable, value=model, description="model"),
                "precision": w.Dropdown(options=["fp16", "bf16", "fp32"], value=precision,
                                        description="precision")}
    return explore(draw, controls, "model and precision: parameter bytes per GPU for "
                                   "tensor-parallel degrees 1, 2, 4, 8")
