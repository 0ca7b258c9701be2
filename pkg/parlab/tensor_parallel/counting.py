"""Tensor parallelism's arithmetic: memory per GPU under tensor parallelism, the embedding
table, and how many bytes each split moves, as formulas.

Why this module exists: the chapter quotes numbers (605 M parameters per attention layer,
1.2 B per feed-forward layer, 173 B in the blocks), the slides quote per-layer costs
(C_in x C_out, B x C_out, B x C_in), and this companion measures bytes on the toy
backend. Here the quotes are recomputed from :mod:`parlab.models` and :mod:`parlab.memory`,
and every measured byte count gets a closed form, so the tests can hold the two together.

Byte formulas assume the toy backend's ``ring`` algorithms on ``n`` ranks and take each
collective's wire bytes from :func:`parlab.comm.ring_wire_bytes` (the table is in
:mod:`parlab.comm.cost`).
"""

from __future__ import annotations

from parlab.hardware import GPU_MEMORY_GB
from parlab.units import GB
from parlab.comm import ring_wire_bytes
from parlab.models import GPT3_175B, TransformerConfig, count_parameters, get_config
from parlab.tensor_parallel.attention import check_grad_sync
from parlab.tensor_parallel.ffn import layout
from parlab.checks import check_count

__all__ = ["parameter_memory", "embedding_table", "SLIDE_FORMULAS",
           "slide_costs", "attention_bytes", "strategy_bytes", "ffn_bytes", "total"]

#: The slide deck's communication per layer (in numbers, not bytes) for each strategy.
SLIDE_FORMULAS = {"data": "C_in x C_out", "partition_output": "B x C_out",
                  "reduce_output": "B x C_in"}


def parameter_memory(config: TransformerConfig | str = GPT3_175B, degrees=(1, 2, 4, 8),
                     precision: str = "fp16") -> list[dict]:
    """Parameter bytes on one GPU per tensor-parallel degree (:func:`parlab.memory.estimate`).

    ``memory.estimate`` splits each layer's matrices over ``tp`` GPUs as Megatron does
    (the vocabulary too); biases of row-parallel layers and LayerNorms stay whole.
    """
    from parlab.memory import estimate
    config = get_config(config)
    rows = []
    for tp in degrees:
        b = estimate(config, (1, config.context), optimizer="sgd", precision=precision, tp=tp)
        rows.append({"tp": tp, "parameters": b.parameters // _bytes(precision),
                     "bytes": b.parameters, "fits_80GB": b.parameters <= GPU_MEMORY_GB * GB})
    return rows


def _bytes(precision: str) -> int:
    from parlab.memory import PRECISIONS
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {list(PRECISIONS)}")
    return PRECISIONS[precision].bytes


def _positives(**values) -> None:
    for name, value in values.items():
        check_count(name, value)


def embedding_table(config: TransformerConfig | str = GPT3_175B, precision: str = "fp16",
                    batch: int = 1, seq: int | None = None) -> dict:
    """The word-embedding table's size, its share of the model, and what a lookup produces.

    ``vectors_bytes`` is the size of the looked-up vectors for ``batch`` x ``seq`` tokens:
    what A1 broadcasts in the book's layout, and what a vocabulary-parallel table
    all-reduces instead.
    """
    c = get_config(config)
    size = _bytes(precision)
    check_count("batch", batch)
    if seq is not None:  # None: the model's context
        check_count("seq", seq)
    seq = seq or c.context
    counts = count_parameters(c)
    return {"vocab": c.vocab, "d_model": c.d_model, "parameters": c.vocab * c.d_model,
            "bytes": c.vocab * c.d_model * size,
            "share_of_model": c.vocab * c.d_model / counts["total"],
            "one_block_bytes": counts["block"] * size,
            "vectors_bytes": batch * seq * c.d_model * size}


def slide_costs(batch: int, c_in: int, c_out: int) -> dict:
    """The slides' numbers per layer: data C_in x C_out, partition B x C_out, reduce B x C_in."""
    _positives(batch=batch, c_in=c_in, c_out=c_out)
    return {"data": c_in * c_out, "partition_output": batch * c_out,
            "reduce_output": batch * c_in}


def _phases(forward: list, backward: list, n: int) -> dict:
    """``{phase: {op: wire bytes}}`` from lists of (op, payload bytes)."""
    out = {}
    for phase, items in (("forward", forward), ("backward", backward)):
        ops: dict = {}
        for op, payload in items:
            ops[op] = ops.get(op, 0) + ring_wire_bytes(op, payload, n)
        out[phase] = ops
    return out


def total(bytes_by_op: dict) -> dict:
    """``{phase: bytes}`` from ``{phase: {op: bytes}}``."""
    return {phase: sum(ops.values()) for phase, ops in bytes_by_op.items()}


def attention_bytes(variant: str, batch: int, seq: int, d_model: int, n: int = 2,
                    element: int = 4, grad_sync: str = "all_reduce") -> dict:
    """Predicted ``{phase: {op: wire bytes}}`` of one attention layer (see :mod:`tp_attention`).

    S = batch x seq x d_model x element is the size of X, of Q, of K and of the output.
    Megatron and PyTorch's API: one all-reduce of S each way. The book: a broadcast of X,
    all-gathers of Q and K; the output all-reduce; backward: Q and K gathered again, their
    gradients summed (all-reduce, or reduce-scatter), X's gradient reduced onto A1.
    """
    _positives(batch=batch, seq=seq, d_model=d_model, n=n, element=element)
    check_grad_sync(grad_sync)
    S = batch * seq * d_model * element
    if variant in ("megatron", "pytorch"):
        return _phases([("all_reduce", S)], [("all_reduce", S)], n)
    if variant != "book":
        raise ValueError(f"unknown variant {variant!r}; choose book, megatron or pytorch")
    forward = [("broadcast", S), ("all_gather", S), ("all_gather", S), ("all_reduce", S)]
    backward = [("all_gather", S), ("all_gather", S), (grad_sync, S), (grad_sync, S),
                ("reduce", S)]
    return _phases(forward, backward, n)


def strategy_bytes(strategy: str, batch: int, c_in: int, c_out: int, n: int = 2,
                   element: int = 4) -> dict:
    """Predicted ``{phase: {op: wire bytes}}`` of one linear layer under a slide strategy."""
    _positives(batch=batch, c_in=c_in, c_out=c_out, n=n, element=element)
    weights = c_in * c_out * element
    inputs, outputs = batch * c_in * element, batch * c_out * element
    table = {"data": ([], [("all_reduce", weights)]),
             "partition_output": ([("all_gather", outputs)], [("all_reduce", inputs)]),
             "reduce_output": ([("all_reduce", outputs)], [("all_gather", inputs)])}
    if strategy not in table:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {list(table)}")
    return _phases(*table[strategy], n)


def ffn_bytes(sizes, tensor: int = 2, batch: int = 4, element: int = 4) -> dict:
    """Predicted ``{phase: {link type: bytes}}`` of Figure 8-19's network (rail-aligned layout).

    Forward: each stage all-gathers its output inside the server (NVLink) and each of its
    ``tensor`` GPUs sends the whole output along its rail. Backward: each stage all-reduces
    the error of its input (NVLink) and, except the first, sends it back along the rails.
    Only for the splits :func:`parlab.tensor_parallel.layout` accepts (it raises the others).
    """
    sizes = tuple(sizes)
    layout(sizes, tensor)  # the same check as the network that these bytes describe
    _positives(batch=batch, element=element)
    stages = len(sizes) - 1
    fwd = {"nvlink": 0.0, "rail": 0.0}
    bwd = {"nvlink": 0.0, "rail": 0.0}
    for s in range(stages):
        out_bytes, in_bytes = batch * sizes[s + 1] * element, batch * sizes[s] * element
        fwd["nvlink"] += ring_wire_bytes("all_gather", out_bytes, tensor)
        bwd["nvlink"] += ring_wire_bytes("all_reduce", in_bytes, tensor)
        if s < stages - 1:
            fwd["rail"] += tensor * out_bytes
        if s > 0:
            bwd["rail"] += tensor * in_bytes
    return {"forward": fwd, "backward": bwd}
