"""The chapters' experiments: each chapter's runs on real ranks, its checks of the book, and
the recipes of its figures. One module per chapter (split by topic where a chapter has many).

``ch00`` (collectives on real ranks and their explorer), ``ch01`` (the memory figures),
``ch02`` (Figure 8-2 on real ranks, its explorer), ``ch03`` (the book's step lists against the
simulator: the errata; Figures 8-3 to 8-14), ``ch04_attention`` (attention and Figure 8-19's
network on real ranks beside one device), ``ch04_layers`` and ``ch04_mlp`` (embeddings, the
slides' strategies and the Megatron MLP on real ranks), ``ch04_book`` (the evidence for the
chapter's slips), ``ch04_figures`` (Figures 8-15 to 8-19, the strategies explorer),
``ch05`` (the planner's figures, the 3D job's traffic), ``ch05_summary`` (the slides' pros
and cons, each with a number), ``ch05_copies`` (GPUs per model copy, chapter 01 against
chapter 05), ``ch05_fake_ranks`` (one rank of a GPT-3 layout on PyTorch's fake process
group: the model states the package's tensor-parallel and ZeRO code allocates, against the
memory estimate), ``ch05_published`` (the planner against Narayanan et al. 2021's Table 1),
``ch06`` (every ZeRO stage and FSDP2 on logged ranks, in one table), ``ch07`` (an
MoE layer routed token by token, split over logged ranks, and its capacity trade-off),
``ch08`` (one sequence split over ranks by ring, all-gather and Ulysses attention, with its
bytes and its causal work per rank), ``ch09`` (the split backward on one stage, the
zero-bubble schedules simulated side by side and trained on real ranks, F, B and W timed).

What a user would reuse (the mechanisms, layers and closed forms) lives in the strategy
subpackages; this layer runs them for one chapter and registers the figure recipes
(:func:`parlab.viz.figure`) that hand the results to :mod:`parlab.viz.plots`, which only
draws. Imports every subpackage below it, viz included.
"""

from parlab.experiments.ch00 import collective_explorer, draw_collective
from parlab.experiments.ch01 import book_step, datasets_and_batch, model_sizes_figure
from parlab.experiments.ch02 import (
    book_step_explorer, BookRun, FIGURE_8_2, run_figure_8_2, two_gpu_links
)
from parlab.experiments.ch03 import BOOK_ACTIVE_PERCENT, BOOK_STEPS, errata, Erratum
from parlab.experiments.ch04_attention import Comparison, run_attention, run_ffn
from parlab.experiments.ch04_layers import run_embedding, run_layer_strategy, STRATEGIES
from parlab.experiments.ch04_mlp import run_mlp
from parlab.experiments.ch04_book import (
    BOOK_SAYS, book_rounding, calls_table, collective_calls, CollectiveCall, column_split_input,
    embedding_wire_bytes, ffn_backward_sums, ffn_widths, gpt3_counts, gradient_shard_bytes,
    layer_memory, softmax_and_context, split_table_reasons
)
from parlab.experiments.ch04_figures import (
    book_names, book_names_table, cross_rail_bytes, qkv_example, qkv_shards, strategy_explorer
)
from parlab.experiments import ch05  # noqa: F401  (it registers the chapter's figures)
from parlab.experiments.ch05_summary import summary_table, summary_text, SummaryRow
from parlab.experiments.ch05_copies import copy_sizes, copy_table, CopySize, depth_table
from parlab.experiments.ch05_fake_ranks import FakeRank, fake_world, measure_rank
from parlab.experiments.ch05_published import compute_ceiling, published_rows, published_table, PublishedRow
from parlab.experiments.ch06 import stage_table
from parlab.experiments.ch08 import (
    block_units, causal_work, causal_work_chart, compare_methods, context_inputs,
    CONTEXT_RANKS, CONTEXT_SHAPE, LLAMA_31_8B, MEMORY_LAYOUTS, MEMORY_LENGTHS,
    MEMORY_MODELS,
    memory_by_sequence, memory_by_sequence_chart, MethodRun, ring_steps, run_sequence_parallel,
    SequenceParallelRun, SP_CONFIG
)
from parlab.experiments.ch09 import (
    BY_M, BY_P, bubble_chart, bubble_sweep, measure_passes, memory_table, plan_schedules,
    PlannedSchedule, RealRuns, run_real,
    schedule_timelines, schedules_chart, speedups, split_backward_demo, SplitDemo,
    SWEEP_MICROBATCHES, UNIT_PASSES, WIDE_NET, ZB_MICROBATCHES, ZB_RANKS, ZB_SCHEDULES
)
from parlab.experiments.ch07 import (
    balancing_runs, capacity_sweep, example_layer, example_tokens, EXAMPLE, ExpertRun, RANKS,
    routing_table,
    run_expert_layer, TOKENS
)

__all__ = ["collective_explorer", "draw_collective", "book_step", "datasets_and_batch",
           "model_sizes_figure", "FIGURE_8_2", "BookRun", "run_figure_8_2", "book_step_explorer",
           "two_gpu_links", "BOOK_STEPS",
           "BOOK_ACTIVE_PERCENT", "Erratum", "errata", "Comparison", "run_attention", "run_ffn",
           "STRATEGIES", "run_embedding", "run_layer_strategy", "run_mlp", "BOOK_SAYS",
           "gpt3_counts", "CollectiveCall", "collective_calls", "calls_table",
           "gradient_shard_bytes", "ffn_backward_sums", "layer_memory", "book_rounding",
           "column_split_input", "softmax_and_context", "ffn_widths", "embedding_wire_bytes",
           "split_table_reasons",
           "qkv_example", "qkv_shards", "book_names", "book_names_table", "cross_rail_bytes",
           "strategy_explorer", "SummaryRow", "summary_table", "summary_text", "CopySize",
           "copy_sizes", "copy_table", "depth_table", "FakeRank", "fake_world", "measure_rank",
           "compute_ceiling", "published_rows", "published_table", "PublishedRow", "stage_table", "EXAMPLE",
           "RANKS", "TOKENS",
           "example_layer", "example_tokens", "routing_table", "capacity_sweep", "ExpertRun",
           "CONTEXT_SHAPE", "CONTEXT_RANKS", "context_inputs", "MethodRun",
           "compare_methods", "causal_work", "causal_work_chart", "ring_steps", "block_units",
           "SP_CONFIG", "SequenceParallelRun",
           "run_sequence_parallel", "MEMORY_LAYOUTS", "MEMORY_LENGTHS", "MEMORY_MODELS",
           "LLAMA_31_8B", "memory_by_sequence",
           "memory_by_sequence_chart",
           "run_expert_layer", "balancing_runs", "ZB_SCHEDULES", "ZB_RANKS", "ZB_MICROBATCHES",
           "UNIT_PASSES", "WIDE_NET", "schedule_timelines", "schedules_chart", "speedups",
           "SplitDemo", "split_backward_demo", "measure_passes", "bubble_sweep", "bubble_chart",
           "BY_M", "BY_P", "SWEEP_MICROBATCHES", "memory_table", "RealRuns", "run_real",
           "PlannedSchedule", "plan_schedules"]
