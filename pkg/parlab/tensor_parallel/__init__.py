"""Tensor parallelism (chapter 04, Figures 8-15 to 8-19): one layer's weights split across GPUs.

Bottom up: ``sharding`` (who owns which slice of a tensor), ``mappings`` (the f and g
operators as autograd functions: what each collective's backward is), ``layers``
(column- and row-parallel linear layers, vocabulary-parallel embeddings, under Megatron-LM's
names), ``dtensor`` (the same splits through PyTorch's ``parallelize_module``),
``attention`` (self-attention split three ways: the book's, Megatron's, DTensor's),
``parallelize`` (a whole GPT's blocks swapped for Megatron's over one group: what the 3D
job composes),
``ffn`` (Figure 8-19's feed-forward network on 6 GPUs), ``counting`` (the chapter's numbers
as formulas), ``runs``, ``mlp_runs`` and ``layer_runs`` (each split on real ranks beside
its one-device twin), ``book`` (the evidence for the chapter's slips: what the collectives carry, one
layer's memory, the rounding of its counts). Imports :mod:`parlab.launch`, :mod:`parlab.comm`,
:mod:`parlab.models`, :mod:`parlab.memory` and :mod:`parlab.pipeline`.
"""

from parlab.tensor_parallel.sharding import (
    KINDS, balanced_ranges, check_degree, describe, divisors, even_ranges, merge, shard_spec,
    ShardSpec, split
)
from parlab.tensor_parallel.mappings import (
    all_gather_cat, broadcast_from, copy_to_region, gather_for_use, gather_from_region,
    local_slice, reduce_from_region, reduce_scatter_slice, scatter_to_region
)
from parlab.tensor_parallel.layers import (
    BroadcastEmbedding, ColumnParallelLinear, RowParallelLinear, TensorParallelMLP,
    VocabParallelEmbedding
)
from parlab.tensor_parallel.dtensor import default_mesh, dtensor_local_grads, dtensor_mlp
from parlab.tensor_parallel.attention import (
    PROJECTIONS, attend, BookAttention, dtensor_attention, MegatronAttention, SelfAttention
)
from parlab.tensor_parallel.parallelize import (
    merge_grads, parallelize, shard_pieces, TensorParallelBlock
)
from parlab.tensor_parallel.ffn import (
    FIGURE_8_19_SIZES, ffn_data, ffn_rank, layout, link_of, Placement, reference_ffn
)
from parlab.tensor_parallel.counting import (
    BOOK_SAYS, SLIDE_FORMULAS, attention_bytes, embedding_table, ffn_bytes, gpt3_counts,
    parameter_memory, slide_costs, strategy_bytes, total
)
from parlab.tensor_parallel.runs import (
    ATTENTION_VARIANTS, collective_wire_bytes, CommBytes, Comparison, reference_attention,
    run_attention, run_ffn
)
from parlab.tensor_parallel.book import (
    book_rounding, calls_table, collective_calls, CollectiveCall, column_split_input,
    embedding_wire_bytes, ffn_backward_sums, ffn_widths, gradient_shard_bytes, layer_memory,
    softmax_and_context
)
from parlab.tensor_parallel.layer_runs import (
    EMBEDDINGS, STRATEGIES, embedding_rank, run_embedding, run_layer_strategy, strategy_rank
)
from parlab.tensor_parallel.mlp_runs import MLP_VARIANTS, mlp_rank, run_mlp

__all__ = ["ShardSpec", "KINDS", "shard_spec", "split", "merge", "describe", "even_ranges",
           "balanced_ranges", "check_degree", "divisors", "copy_to_region", "reduce_from_region",
           "gather_from_region", "scatter_to_region", "gather_for_use", "broadcast_from",
           "all_gather_cat", "local_slice", "reduce_scatter_slice", "ColumnParallelLinear",
           "RowParallelLinear", "TensorParallelMLP", "VocabParallelEmbedding", "BroadcastEmbedding",
           "SelfAttention", "attend", "BookAttention", "MegatronAttention", "dtensor_attention",
           "dtensor_local_grads", "PROJECTIONS", "FIGURE_8_19_SIZES", "Placement", "layout",
           "ffn_rank", "ffn_data", "link_of", "reference_ffn", "BOOK_SAYS", "gpt3_counts",
           "parameter_memory", "embedding_table", "SLIDE_FORMULAS", "slide_costs",
           "attention_bytes", "strategy_bytes", "ffn_bytes", "total", "ATTENTION_VARIANTS",
           "Comparison", "run_attention", "reference_attention", "run_ffn", "merge_grads",
           "CommBytes", "collective_wire_bytes", "run_mlp", "run_embedding",
           "run_layer_strategy", "EMBEDDINGS", "STRATEGIES", "mlp_rank", "embedding_rank",
           "strategy_rank", "CollectiveCall", "collective_calls", "calls_table",
           "gradient_shard_bytes", "ffn_backward_sums", "layer_memory", "book_rounding",
           "column_split_input", "softmax_and_context", "ffn_widths", "embedding_wire_bytes",
           "default_mesh", "dtensor_mlp", "MLP_VARIANTS", "parallelize", "shard_pieces",
           "TensorParallelBlock"]
