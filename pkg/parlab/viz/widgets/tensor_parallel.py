"""Chapter 04 explorers: the bytes of the three attention splits for any model size;
parameter memory per GPU. (The slides' per-layer costs beside real toy-backend measurements
start ranks: :func:`parlab.experiments.strategy_explorer`.)

Both follow :func:`parlab.viz.explore` (static figure first, then live controls).
"""

from __future__ import annotations

from parlab.viz.explorer import Explorer, explore

__all__ = ["attention_explorer", "shard_memory_explorer"]

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
