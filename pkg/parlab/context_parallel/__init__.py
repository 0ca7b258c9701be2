"""Context parallelism (chapter 08): one sequence split across ranks, attention still exact.

``layouts`` (how the tokens are cut: contiguous, zigzag, striped; their positions and causal
work), ``blocks`` (attention one key/value block at a time, merged by log-sum-exp, and its
backward), ``ring`` (ring attention: key/value blocks travel round the ranks, forward and
backward), ``allgather`` (Llama 3's: every rank all-gathers K and V, backward a
reduce-scatter), ``ulysses`` (DeepSpeed-Ulysses: an all-to-all trades the sequence split
for a head split, and another trades it back) and ``apply`` (any of the three put into a GPT
or Llama model in place of its attention core, with the shard's positions). Each strategy
also counts its bytes per rank (``ring_bytes``, ``all_gather_bytes``, ``ulysses_bytes``).
Imports :mod:`parlab.comm` and :mod:`parlab.models`.
"""

from parlab.context_parallel.layouts import LAYOUTS, causal_pairs, positions, shard, unshard
from parlab.context_parallel.blocks import block_backward, block_forward, merge
from parlab.context_parallel.ring import ring_attention, ring_bytes, ring_schedule
from parlab.context_parallel.allgather import all_gather_attention, all_gather_bytes
from parlab.context_parallel.ulysses import ulysses_attention, ulysses_bytes
from parlab.context_parallel.apply import apply_context_parallel, CP_METHODS

__all__ = ["LAYOUTS", "positions", "shard", "unshard", "causal_pairs", "block_forward",
           "block_backward", "merge", "ring_attention", "ring_bytes", "ring_schedule",
           "all_gather_attention", "all_gather_bytes", "ulysses_attention", "ulysses_bytes",
           "CP_METHODS", "apply_context_parallel"]
