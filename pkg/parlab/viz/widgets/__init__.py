"""ipywidgets explorers over the plots and calculators, one module per chapter.

Every explorer follows :func:`parlab.viz.explore`: the figure at the default setting as an
ordinary output, then controls that redraw it live. They draw and call calculators; the
explorers that start ranks (the collective explorer, Figure 8-2's step, the slides'
strategies) are the chapters' experiments, in :mod:`parlab.experiments`.
"""

from parlab.viz.widgets.memory import energy_explorer, memory_explorer
from parlab.viz.widgets.data_parallel import scaling_explorer
from parlab.viz.widgets.pipeline import compare_explorer, step_explorer
from parlab.viz.widgets.tensor_parallel import attention_explorer, shard_memory_explorer
from parlab.viz.widgets.planner import planner_explorer
from parlab.viz.widgets.sharded import zero_explorer
from parlab.viz.widgets.experts import expert_explorer
from parlab.viz.widgets.context import context_explorer
from parlab.viz.widgets.zero_bubble import zero_bubble_explorer

__all__ = ["context_explorer", "memory_explorer", "energy_explorer", "scaling_explorer", "step_explorer",
           "compare_explorer", "attention_explorer", "shard_memory_explorer", "planner_explorer",
           "zero_explorer", "expert_explorer", "zero_bubble_explorer"]
