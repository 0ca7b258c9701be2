"""ipywidgets explorers over the plots and calculators, one module per chapter.

Every explorer follows :func:`parlab.viz.explore`: the figure at the default setting as an
ordinary output, then controls that redraw it live.
"""

from parlab.viz.widgets.basics import collective_explorer
from parlab.viz.widgets.memory import energy_explorer, memory_explorer
from parlab.viz.widgets.data_parallel import book_step_explorer, scaling_explorer
from parlab.viz.widgets.pipeline import compare_explorer, step_explorer
from parlab.viz.widgets.tensor_parallel import (
    attention_explorer, shard_memory_explorer, strategy_explorer
)
from parlab.viz.widgets.planner import planner_explorer
from parlab.viz.widgets.sharded import zero_explorer

__all__ = ["collective_explorer", "memory_explorer", "energy_explorer", "book_step_explorer",
           "scaling_explorer", "step_explorer", "compare_explorer", "strategy_explorer",
           "attention_explorer", "shard_memory_explorer", "planner_explorer", "zero_explorer"]
