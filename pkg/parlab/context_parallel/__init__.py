"""Context parallelism (chapter 08): one sequence split across ranks, attention still exact.

``layouts`` (how the tokens are cut: contiguous, zigzag, striped; their positions and causal
work), ``blocks`` (attention one key/value block at a time, merged by log-sum-exp, and its
backward) and ``ring`` (ring attention: key/value blocks travel round the ranks, forward and
backward). Imports :mod:`parlab.comm`.
"""

from parlab.context_parallel.layouts import LAYOUTS, causal_pairs, positions, shard, unshard
from parlab.context_parallel.blocks import block_backward, block_forward, merge
from parlab.context_parallel.ring import ring_attention, ring_bytes

__all__ = ["LAYOUTS", "positions", "shard", "unshard", "causal_pairs", "block_forward",
           "block_backward", "merge", "ring_attention", "ring_bytes"]
