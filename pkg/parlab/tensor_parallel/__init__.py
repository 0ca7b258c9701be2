"""Tensor parallelism (chapter 04, Figures 8-15 to 8-19): one layer's weights split across GPUs.

Bottom up: ``sharding`` (who owns which slice of a tensor, and the shards merged back),
``mappings`` (the f and g operators as autograd functions: what each collective's backward
is), ``layers`` (column- and row-parallel linear layers, vocabulary-parallel embeddings,
under Megatron-LM's names), ``dtensor`` (the same splits through PyTorch's
``parallelize_module``), ``debug`` (``CommBytes``: PyTorch's ``CommDebugMode`` with each
collective's bytes; a face of its own, imported only where used), ``attention`` (self-attention split three ways: the book's, Megatron's,
DTensor's), ``parallelize`` (a whole GPT's blocks swapped for Megatron's over one group:
what the 3D job composes), ``ffn`` (Figure 8-19's feed-forward network on 6 GPUs), ``counting`` (memory and
bytes per split as closed forms). The chapter's runs on real ranks and the evidence for its
slips are chapter 04's experiments (:mod:`parlab.experiments`). Imports
:mod:`parlab.launch`, :mod:`parlab.comm`, :mod:`parlab.models`, :mod:`parlab.memory` and
:mod:`parlab.pipeline`.
"""

from parlab.tensor_parallel.sharding import (
    balanced_ranges, check_degree, describe, divisors, even_ranges, merge,
    merge_grads, shard_spec, ShardSpec, split
)
from parlab.tensor_parallel.mappings import (
    all_gather_cat, broadcast_from, copy_to_region, gather_for_use, gather_from_region,
    local_slice, reduce_from_region, reduce_scatter_slice, reduce_scatter_to_region,
    scatter_to_region
)
from parlab.tensor_parallel.layers import (
    BroadcastEmbedding, ColumnParallelLinear, RowParallelLinear, TensorParallelMLP,
    VocabParallelEmbedding
)
from parlab.tensor_parallel.dtensor import collective_wire_bytes, dtensor_local_grads, dtensor_mlp
from parlab.tensor_parallel.attention import (
    attend, BookAttention, check_grad_sync, check_heads, dtensor_attention, MegatronAttention,
    SelfAttention
)
from parlab.tensor_parallel.parallelize import (
    allreduce_sequence_parallel_grads, parallelize, shard_pieces, TensorParallelBlock
)
from parlab.tensor_parallel.ffn import (
    FIGURE_8_19_SIZES, check_ffn_run, ffn_rank, layout, Placement, reference_ffn
)
from parlab.tensor_parallel.counting import (
    attention_bytes, embedding_table, ffn_bytes, parameter_memory, slide_costs, strategy_bytes,
    total
)

__all__ = ["ShardSpec", "shard_spec", "split", "merge", "merge_grads", "describe", "even_ranges",
           "balanced_ranges", "check_degree", "divisors", "copy_to_region",
           "reduce_from_region", "gather_from_region", "scatter_to_region", "gather_for_use",
           "reduce_scatter_to_region", "allreduce_sequence_parallel_grads",
           "broadcast_from", "all_gather_cat", "local_slice", "reduce_scatter_slice",
           "ColumnParallelLinear", "RowParallelLinear", "TensorParallelMLP",
           "VocabParallelEmbedding", "BroadcastEmbedding", "SelfAttention", "attend",
           "BookAttention", "MegatronAttention", "dtensor_attention", "check_heads",
           "check_grad_sync", "dtensor_local_grads", "FIGURE_8_19_SIZES", "Placement", "layout",
           "ffn_rank", "reference_ffn", "check_ffn_run", "parameter_memory", "embedding_table",
           "slide_costs", "attention_bytes", "strategy_bytes", "ffn_bytes", "total",
           "collective_wire_bytes", "dtensor_mlp", "parallelize", "shard_pieces",
           "TensorParallelBlock"]

