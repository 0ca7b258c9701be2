"""One GPT layer's compute as the kernels a GPU runs: matrix products and memory-bound ops.

Why this module exists: :mod:`parlab.models.compute` prices a step's FLOPs at one flat share
of peak (``MFU`` = 0.4), a share that stands for two different things at once: how fast the
GPU multiplies large matrices, and the time spent on work that multiplies nothing (layer
norms, softmax, GeLU, dropout, residual adds), which waits on memory, not on arithmetic.
Here each is priced on its own, from measured or datasheet numbers, nothing fitted (the
planner's ``compute_model="kernels"``, :mod:`parlab.hybrid.step`). For one micro-batch of
n = b s tokens (b sequences of s tokens) on one of t tensor-parallel ranks, per layer:

1. **Weight products** (:func:`layer_gemms`, Megatron-LM's fused QKV, output projection and
   the two feed-forward products, each one of t ranks' share): the forward is one product of
   2 n k m FLOPs, the backward two of the same FLOPs (the input's and the weight's
   gradients), each at ``matmul_tflops`` x the roofline of its shape
   (:func:`matmul_seconds`): ``matmul_tflops`` is the GPU's measured maximum achievable
   matmul speed (:data:`parlab.hardware.GPUS`), a ceiling reached on the best shape, so a
   product reaches it only if its FLOPs per byte reach ``matmul_tflops / hbm``; below,
   the share is intensity / that ridge (:func:`parlab.models.matmul_efficiency`).
2. **Attention's score products** (:func:`attention_products`): per sequence and head, QK^T
   is (s x d_head) @ (d_head x s) and the probabilities times V (s x s) @ (s x d_head),
   b a / t of each, 2 s^2 d_head FLOPs apiece: 4 n s h / t FLOPs forward, twice that
   backward. With d_head = 64 to 160 their FLOPs per byte, s d_head / (s + 2 d_head), sit
   near or below the A100's ridge, so they run well under the weight products' speed.
3. **Memory-bound ops** (:data:`MEMORY_OPS`), at the GPU's HBM bandwidth (the datasheet's):
   the bytes each non-matmul kernel of a Megatron-LM GPT layer (2021: fused bias + GeLU,
   fused bias + dropout + residual add, fused scale + mask + softmax, layer norm, dropout on
   the attention probabilities with a 1-byte mask) reads and writes. Per token, a tensor is
   h wide where tensor parallelism leaves it whole ("replicated": the layer norms and the
   residual stream; h / t under sequence parallelism), h / t or d_ff / t where it is split,
   and a s / t for the softmax-sized tensors (a heads over t ranks, s keys each). Elements
   are 2 bytes (bf16), masks 1. The backward of each op reads what its forward saved and the
   incoming gradient, and writes the outgoing gradient; where the residual stream forks,
   autograd adds the two gradients (one more kernel, twice per layer).

   ==========================  =========  ==========  ====================  ===============
   op (forward)                width      per layer   read / written        bytes per token
   ==========================  =========  ==========  ====================  ===============
   layer norm                  h          2           x / y                 2 x 4 h
   scale + mask + softmax      a s / t    1 (core)    scores / probs        4 a s / t
   dropout on probabilities    a s / t    1 (core)    probs / out + mask    5 a s / t
   context transpose           h / t      1 (core)    ctx / ctx             4 h / t
   bias + GeLU                 d_ff / t   1           x / y                 4 d_ff / t
   bias + dropout + residual   h          2           x, res / y + mask     2 x 7 h
   ==========================  =========  ==========  ====================  ===============

   ==========================  =========  ==========  ====================  ===============
   op (backward)               width      per layer   read / written        bytes per token
   ==========================  =========  ==========  ====================  ===============
   bias + dropout + residual   h          2           dy + mask / dx        2 x 5 h
   residual gradient sum       h          2           dy1, dy2 / dx         2 x 6 h
   layer norm                  h          2           x, dy / dx            2 x 6 h
   bias + GeLU                 d_ff / t   1           x, dy / dx            6 d_ff / t
   context transpose           h / t      1 (core)    dy / dx               4 h / t
   dropout on probabilities    a s / t    1 (core)    dy + mask / dx        5 a s / t
   scale + mask + softmax      a s / t    1 (core)    probs, dy / dx        6 a s / t
   ==========================  =========  ==========  ====================  ===============

   (h: h / t under sequence parallelism.) The context transpose is the copy with which
   Megatron-LM's attention turns [b, heads, s, d_head] back into [s, b, h]; "core" marks
   what Megatron's selective recomputation repeats (its ``CoreAttention``: the score
   products, softmax, dropout and that copy). Checked against Korthikanti et al. (2022): a
   layer keeps s b h (34 + 5 a s / h) bytes for its backward (Table 2, no parallelism), all
   of them written in the forward: by these ops 20 h + 5 a s per token (a residual add's
   output is the next layer's input), and by the products Q, K, V and the first
   feed-forward output, 14 h (:func:`forward_written_bytes`; a test adds the two).

   Not counted (each small here, named so a reader can add it): bias adds inside the
   products, the layer norms' statistics and the reductions that give the biases' and the
   layer norms' weight gradients, the embedding, the loss over the vocabulary, the
   optimizer's update: this module prices the layers and the output layer's product.
4. **Recomputation** repeats a layer's forward: all of it (products and memory ops) under
   ``"full"``, the core (score products and the core's memory ops) under ``"selective"``,
   as :func:`parlab.memory.recompute_flops` counts the FLOPs.

The output layer (:func:`head_seconds`) is one more weight product, (n x h) @ (h x V / t).
"""

from __future__ import annotations

from dataclasses import dataclass

from parlab.hardware import A100
from parlab.checks import check_choice, check_count, check_positive_number
from parlab.models.compute import block_matmuls, matmul_efficiency
from parlab.models.hf import get_config
from parlab.models.transformer import TransformerConfig

__all__ = ["MemoryOp", "MEMORY_OPS", "LayerTime", "layer_gemms", "attention_products",
           "matmul_seconds", "memory_op_bytes", "forward_written_bytes", "layer_time",
           "head_seconds", "ELEMENT_BYTES", "MASK_BYTES"]

#: bf16 activations; dropout masks of one byte per element (as Korthikanti et al. count them).
ELEMENT_BYTES, MASK_BYTES = 2, 1
#: The widths a memory op's tensors take per token (see the module docstring).
WIDTHS = ("replicated", "split", "feed_forward", "scores")


@dataclass(frozen=True)
class MemoryOp:
    """One memory-bound kernel of a layer: per token, how many tensors of its ``width`` it
    reads and writes (``reads``, ``writes``: elements; ``mask_reads``, ``mask_writes``:
    1-byte masks), how many times a layer runs it, and whether it is in the attention core."""

    name: str
    phase: str          # "forward" or "backward"
    width: str          # one of WIDTHS
    reads: int
    writes: int
    mask_reads: int = 0
    mask_writes: int = 0
    per_layer: int = 1
    core: bool = False  # repeated by selective recomputation


_F, _B = "forward", "backward"
#: The two tables of the module docstring, row by row.
MEMORY_OPS = (
    MemoryOp("layer norm", _F, "replicated", 1, 1, per_layer=2),
    MemoryOp("scale + mask + softmax", _F, "scores", 1, 1, core=True),
    MemoryOp("dropout on probabilities", _F, "scores", 1, 1, mask_writes=1, core=True),
    MemoryOp("context transpose", _F, "split", 1, 1, core=True),
    MemoryOp("bias + GeLU", _F, "feed_forward", 1, 1),
    MemoryOp("bias + dropout + residual", _F, "replicated", 2, 1, mask_writes=1, per_layer=2),
    MemoryOp("bias + dropout + residual", _B, "replicated", 1, 1, mask_reads=1, per_layer=2),
    MemoryOp("residual gradient sum", _B, "replicated", 2, 1, per_layer=2),
    MemoryOp("layer norm", _B, "replicated", 2, 1, per_layer=2),
    MemoryOp("bias + GeLU", _B, "feed_forward", 2, 1),
    MemoryOp("context transpose", _B, "split", 1, 1, core=True),
    MemoryOp("dropout on probabilities", _B, "scores", 1, 1, mask_reads=1, core=True),
    MemoryOp("scale + mask + softmax", _B, "scores", 2, 1, core=True),
)


def _gpt(config) -> TransformerConfig:
    config = get_config(config)
    if type(config) is not TransformerConfig:
        raise ValueError(f"the kernel model prices a Megatron-LM GPT layer (layer norms, GeLU, "
                         f"dropout); {config.name} is a {type(config).__name__}, not a GPT")
    return config


def _width(op: MemoryOp, config, seq: int, tp: int, sequence_parallel: bool) -> float:
    """Elements per token of one of ``op``'s tensors on one of ``tp`` ranks."""
    return {"replicated": config.d_model / (tp if sequence_parallel else 1),
            "split": config.d_model / tp, "feed_forward": config.d_ff / tp,
            "scores": config.n_heads * seq / tp}[op.width]


def memory_op_bytes(op: MemoryOp, config, seq: int, tp: int = 1,
                    sequence_parallel: bool = False) -> float:
    """Bytes ``op`` moves per token per layer on one of ``tp`` ranks (all its runs in a
    layer): width x (2 x (reads + writes) + masks read and written) x runs per layer."""
    config = _gpt(config)
    width = _width(op, config, seq, tp, sequence_parallel)
    per_run = ELEMENT_BYTES * (op.reads + op.writes) + MASK_BYTES * (op.mask_reads
                                                                     + op.mask_writes)
    return width * per_run * op.per_layer


def _memory_bytes(config, seq, tp, sequence_parallel, phase, core_only=False) -> float:
    return sum(memory_op_bytes(op, config, seq, tp, sequence_parallel) for op in MEMORY_OPS
               if op.phase == phase and (op.core or not core_only))


def forward_written_bytes(config, seq: int, tp: int = 1,
                          sequence_parallel: bool = False) -> float:
    """Bytes per token the forward's memory ops write in one layer (elements and masks):
    20 h + 5 a s with t = 1 (module docstring), what Korthikanti et al.'s 34 h + 5 a s kept
    bytes draw on together with the products' outputs Q, K, V and the first feed-forward's."""
    config = _gpt(config)
    total = 0.0
    for op in MEMORY_OPS:
        if op.phase == _F:
            width = _width(op, config, seq, tp, sequence_parallel)
            total += width * (ELEMENT_BYTES * op.writes + MASK_BYTES * op.mask_writes) \
                * op.per_layer
    return total


def layer_gemms(config, tp: int = 1) -> list[tuple[int, int]]:
    """(k, m) of a layer's weight products on one of ``tp`` ranks, each run for every token:
    :func:`parlab.models.block_matmuls` (QKV d x 3d/t, output d/t x d, d x d_ff/t, d_ff/t x d)."""
    return block_matmuls(_gpt(config), tp)


def attention_products(config, seq: int, tp: int = 1) -> list[tuple[int, int, int, int]]:
    """(count per sequence, rows, k, m) of the score products on one of ``tp`` ranks: per
    head, QK^T (s x d_head) @ (d_head x s) and probabilities @ V (s x s) @ (s x d_head),
    heads / t of each per sequence."""
    config = _gpt(config)
    check_count("seq", seq)
    check_count("tp", tp, "tensor-parallel ranks")
    heads, d_head = config.n_heads / tp, config.d_model // config.n_heads
    return [(heads, seq, d_head, seq), (heads, seq, seq, d_head)]


def matmul_seconds(rows: float, k: float, m: float, matmul_tflops: float,
                   tb_per_s: float, element_bytes: int = ELEMENT_BYTES) -> float:
    """Seconds of one (rows x k) @ (k x m) product: 2 rows k m FLOPs at ``matmul_tflops`` x
    its roofline share with that ceiling, min(1, intensity / (matmul_tflops / HBM))."""
    share = matmul_efficiency(rows, k, m, element_bytes, matmul_tflops, tb_per_s)
    return 2 * rows * k * m / (matmul_tflops * 1e12 * share)


@dataclass(frozen=True)
class LayerTime:
    """Seconds of one layer's kernels for one micro-batch on one tensor-parallel rank."""

    gemm: float             # the weight products' forward (the backward runs two of each)
    scores: float           # the score products' forward; 0 when attention is not counted
    memory_forward: float   # the forward's memory-bound ops
    memory_backward: float  # the backward's
    recompute: float        # what recomputation repeats (0 without)

    @property
    def forward(self) -> float:
        return self.gemm + self.scores + self.memory_forward

    @property
    def backward(self) -> float:
        return 2 * (self.gemm + self.scores) + self.memory_backward

    @property
    def memory_share(self) -> float:
        """The memory-bound ops' share of the layer's forward and backward."""
        return (self.memory_forward + self.memory_backward) / (self.forward + self.backward)


def layer_time(config, micro_batch: int, seq: int, tp: int = 1,
               sequence_parallel: bool = False, recompute: str | None = None,
               attention: bool = True, matmul_tflops: float = A100.matmul_tflops,
               tb_per_s: float = A100.hbm_tb_per_s) -> LayerTime:
    """:class:`LayerTime` of one layer of ``config`` for ``micro_batch`` sequences of ``seq``
    tokens (module docstring); ``attention=False`` leaves the score products out of the
    forward and backward (the 6 x parameters x tokens rule) but not out of what
    recomputation repeats. The defaults: the A100's measured matmul speed and its HBM."""
    config = _gpt(config)
    check_count("micro_batch", micro_batch)
    check_choice("recompute", recompute, (None, "full", "selective"))
    check_positive_number("matmul_tflops", matmul_tflops)
    n = micro_batch * seq
    gemm = sum(matmul_seconds(n, k, m, matmul_tflops, tb_per_s) for k, m in layer_gemms(config, tp))
    scores = sum(count * micro_batch * matmul_seconds(rows, k, m, matmul_tflops, tb_per_s)
                 for count, rows, k, m in attention_products(config, seq, tp))
    bandwidth = tb_per_s * 1e12
    memory = {phase: n * _memory_bytes(config, seq, tp, sequence_parallel, phase) / bandwidth
              for phase in (_F, _B)}
    core = n * _memory_bytes(config, seq, tp, sequence_parallel, _F, core_only=True) / bandwidth
    again = {None: 0.0, "selective": scores + core,
             "full": gemm + scores + memory[_F]}[recompute]
    return LayerTime(gemm, scores if attention else 0.0, memory[_F], memory[_B], again)


def head_seconds(config, tokens: int, tp: int = 1, matmul_tflops: float = A100.matmul_tflops,
                 tb_per_s: float = A100.hbm_tb_per_s) -> float:
    """Seconds of the output layer's product for ``tokens`` tokens, forward and backward
    (three products of (tokens x h) @ (h x V / t) FLOPs; the vocabulary split over the
    tensor ranks, as Megatron-LM's vocabulary-parallel output layer has it)."""
    config = _gpt(config)
    return 3 * matmul_seconds(tokens, config.d_model, config.vocab / tp, matmul_tflops,
                              tb_per_s)
