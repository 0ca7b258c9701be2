"""Context parallelism (chapter 08): one sequence split across ranks, attention still exact.

``layouts`` (how the tokens are cut: contiguous, zigzag, striped; their positions and causal
work), ``blocks`` (attention one key/value block at a time, merged by log-sum-exp, and its
backward), ``ring`` (ring attention: key/value blocks travel round the ranks, forward and
backward), ``allgather`` (Llama 3's: every rank all-gathers K and V, backward a
reduce-scatter) and ``ulysses`` (DeepSpeed-Ulysses: an all-to-all trades the sequence split
for a head split, and another trades it back). Each strategy also counts its bytes per rank
(``ring_bytes``, ``all_gather_bytes``, ``ulysses_bytes``). Imports :mod:`parlab.comm`.
"""

from parlab.context_parallel.layouts import LAYOUTS, causal_pairs, positions, shard, unshard
from parlab.context_parallel.blocks import block_backward, block_forward, merge
from parlab.context_parallel.ring import ring_attention, ring_bytes, ring_schedule
from parlab.context_parallel.allgather import all_gather_attention, all_gather_bytes
from parlab.context_parallel.ulysses import ulysses_attention, ulysses_bytes

__all__ = ["LAYOUTS", "positions", "shard", "unshard", "causal_pairs", "block_forward",
           "block_backward", "merge", "ring_attention", "ring_bytes", "ring_schedule",
           "all_gather_attention", "all_gather_bytes", "ulysses_attention", "ulysses_bytes"]
