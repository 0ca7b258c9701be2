"""matplotlib drawings of the book's figures, one module per chapter. They draw; they do not compute.

Each function takes what a run or a calculator returned and draws it. The recipes that make
each figure of the book (run or compute, then call a function here) are registered
(:func:`parlab.viz.figure`) by the chapters' experiments, :mod:`parlab.experiments`, so
``python -m parlab.tools.figures`` finds them.
"""

from parlab.viz.plots.basics import before_after, show_collective
from parlab.viz.plots.memory import (
    checkpoint_curve, figure_8_1, memory_bars, memory_split
)
from parlab.viz.plots.data_parallel import figure_8_2, loss_curves, scaling_figure, traffic_figure
from parlab.viz.plots.pipeline import (
    comparison_figure, gantt_figure, step_caption, step_figure, sync_figure
)
from parlab.viz.plots.timeline import trace_figure
from parlab.viz.plots.transformer import local_qkv_figure, transformer_figure
from parlab.viz.plots.tensor_parallel import (
    attention_bytes_figure, book_attention_figure, ffn_figure, format_bytes, memory_figure,
    qkv_sharding_figure, strategy_figure
)
from parlab.viz.plots.planner import (
    cnn_figure, layouts_figure, placement_figure, published_figure, traffic_3d_figure
)
from parlab.viz.plots.traffic import bytes_per_rank_figure, steps_figure
from parlab.viz.plots.experts import balance_figure, capacity_figure, dispatch_matrix_figure
from parlab.viz.plots.context import (
    causal_work_figure, memory_by_sequence_figure, ring_steps_figure
)
from parlab.viz.plots.zero_bubble import (
    bubble_figure, draw_timeline, measured_figure, schedules_figure
)
from parlab.viz.plots.sharded import (
    zero3_timeline_figure, zero_memory_figure, zero_scaling_figure, zero_traffic_figure
)

__all__ = ["ring_steps_figure", "causal_work_figure", "memory_by_sequence_figure", "show_collective", "before_after", "figure_8_1", "memory_bars",
           "memory_split", "checkpoint_curve", "figure_8_2", "loss_curves", "traffic_figure",
           "scaling_figure", "step_figure", "gantt_figure", "comparison_figure", "sync_figure",
           "step_caption", "transformer_figure", "local_qkv_figure", "qkv_sharding_figure",
           "book_attention_figure", "ffn_figure", "attention_bytes_figure", "strategy_figure",
           "memory_figure", "format_bytes", "layouts_figure", "placement_figure", "cnn_figure",
           "published_figure", "traffic_3d_figure", "steps_figure", "bytes_per_rank_figure", "zero_memory_figure",
           "zero_traffic_figure", "zero3_timeline_figure", "zero_scaling_figure", "trace_figure",
           "dispatch_matrix_figure", "capacity_figure", "balance_figure", "draw_timeline",
           "schedules_figure", "bubble_figure", "measured_figure"]
