"""Chapter 08 explorer: what each way of splitting one sequence sends and computes per rank."""

from __future__ import annotations

from parlab.context_parallel import (
    LAYOUTS, all_gather_bytes, causal_pairs, ring_bytes, ring_schedule, ulysses_bytes
)
from parlab.models import get_config
from parlab.units import format_bytes
from parlab.viz.explorer import Explorer, explore

__all__ = ["draw_context", "context_explorer", "HEADS", "KV_HEADS", "D_HEAD"]

#: The explorer's attention: Llama-3-8B's heads (query, key/value, width), in bf16.
_LLAMA = get_config("Llama-3-8B")
HEADS, KV_HEADS, D_HEAD, ELEMENT = (_LLAMA.n_heads, _LLAMA.n_kv_heads,
                                    _LLAMA.d_model // _LLAMA.n_heads, 2)
METHODS = ("ring", "all-gather", "ulysses")


def draw_context(seq_k: int, ranks: int, method: str, layout: str, causal: bool):
    """One sequence of ``seq_k`` thousand tokens (1024 each) on ``ranks`` ranks: each rank's
    bytes per pass for ``method`` (closed forms, Llama-3-8B's heads in bf16, one layer), and
    the ring's block schedule (which block each rank computes at each step)."""
    from parlab.viz.plots.context import ring_steps_figure

    seq = seq_k * 1024
    try:
        pairs = causal_pairs(seq, ranks, layout)
    except ValueError as err:
        print(f"This setting does not work: {err}")
        return None
    tokens = seq // ranks
    q_bytes, kv_bytes = (heads * tokens * D_HEAD * ELEMENT for heads in (HEADS, KV_HEADS))
    if method == "ulysses" and KV_HEADS % ranks:
        print(f"Ulysses gives each rank whole key/value heads: {KV_HEADS} do not split over "
              f"{ranks} ranks (at most {KV_HEADS}); ring and all-gather split the sequence.")
        return None
    sent = {"ring": ring_bytes(kv_bytes, ranks), "all-gather": all_gather_bytes(kv_bytes, ranks),
            "ulysses": ulysses_bytes(q_bytes, ranks, kv_bytes)}[method]
    print(f"{method}, {seq:,} tokens on {ranks} ranks ({tokens:,} each), one layer, bf16: each "
          f"rank sends {format_bytes(sent['forward'])} forward and "
          f"{format_bytes(sent['backward'])} backward")
    if causal:
        print(f"causal work ({layout}): the busiest rank has {max(pairs) / min(pairs):.2f}x the "
              f"unmasked pairs of the least busy")
    if method != "ring" or ranks > 8:
        return None
    return ring_steps_figure(ranks, ring_schedule(ranks * 4, ranks, layout, causal), layout)


def context_explorer(seq_k: int = 128, ranks: int = 4, method: str = "ring",
                     layout: str = "contiguous", causal: bool = True) -> Explorer:
    """Sequence length, ranks, method, layout and mask; bytes per rank and the ring's steps."""
    import ipywidgets as w

    controls = {
        "seq_k": w.Dropdown(options=[8, 32, 128, 512], value=seq_k, description="K tokens"),
        "ranks": w.Dropdown(options=[2, 4, 8, 16], value=ranks, description="ranks"),
        "method": w.Dropdown(options=list(METHODS), value=method, description="method"),
        "layout": w.Dropdown(options=list(LAYOUTS), value=layout, description="layout"),
        "causal": w.Checkbox(value=causal, description="causal"),
    }
    return explore(draw_context, controls, "Context-parallel explorer (sequence length, ranks, "
                   "method, layout, causal mask)")
