"""Combining strategies (chapter 05): choose a layout, place it on a cluster, run it for real.

``planner`` (search every data x tensor x pipeline layout for a GPT or Llama-style model, or
a Hugging Face config, on a cluster: memory, step time, recompute on or off; ``assumptions``
lists what it takes as given; ``step`` turns one layout into seconds, part by part, with
interleaved 1F1B and the data-parallel all-reduce hidden behind the backward as options;
``explain`` says why the winner wins, in words),
``placement`` (where each rank of a layout sits on a rail-optimized cluster), ``parallel3d``
(a real 2 x 2 x 2 job equal to one process), ``pipeline_data`` (Figure 8-14: pipelines
replicated, each stage's copies averaging their gradients), ``cnn`` and ``cnn_step`` (the
slides' CNN advice measured, and a data + tensor parallel step run), ``zero_tensor`` (ZeRO
over the copies of a tensor-parallel MLP), ``expert_data`` (experts split over ``ep`` ranks
inside ``dp`` data-parallel ones, each expert's gradient summed over its holders),
``published`` (published training runs as data, Narayanan et al. 2021's Table 1, and the
planner's price of each), ``published_korthikanti`` (Korthikanti et al. 2022's iteration
times with full recompute and with sequence parallelism + selective recompute, priced),
``published_korthikanti_memory`` (the same paper's activation-memory formulas beside the
estimate). The
slides' summary and
the copy sizes of chapters 01 and 05 side by side are chapter 05's experiments
(:mod:`parlab.experiments`). This is the only layer that combines strategies: each hybrid
run builds a ``DeviceMesh`` and applies the strategies' own functions on its dimensions;
none writes a loop or an all-reduce of its own.
"""

from parlab.hybrid.assumptions import Assumptions, bubble_fraction, TIME_PARTS
from parlab.hybrid.planner import evaluate, Layout, plan, Rejected, Search, search, table
from parlab.hybrid.explain import explain
from parlab.hybrid.placement import cluster, group_links, place, placement, Placement
from parlab.hybrid.parallel3d import Run3D, run_3d
from parlab.hybrid.pipeline_data import (
    hybrid_name, HybridRun, pipeline_data_parallel, SYNC_FORMAT, SyncPair
)
from parlab.hybrid.cnn import (
    TENSOR_SPLITS, assignment_bytes, cnn_communication, CnnCommunication, crossover_batch,
    hybrid_traffic, HybridTraffic
)
from parlab.hybrid.cnn_step import hybrid_step
from parlab.hybrid.zero_tensor import run_zero_tensor, ZeroTensorRun
from parlab.hybrid.expert_data import expert_data_rank, ExpertDataRun, MoEBlock, run_expert_data
from parlab.hybrid.published import (
    NARAYANAN_2021_TABLE_1, paper_flops, plan_published, predict, predict_all, Prediction,
    PublishedRun
)
from parlab.hybrid.published_korthikanti import (
    IterationPrediction, KORTHIKANTI_2022, KorthikantiRun, model_flops, predict_iteration
)
from parlab.hybrid.published_korthikanti_memory import (
    compare_memory, memory_comparisons, MemoryComparison, KORTHIKANTI_TECHNIQUES
)

__all__ = ["Assumptions", "Layout", "Rejected", "Search", "plan", "search", "evaluate",
           "bubble_fraction", "table", "TIME_PARTS", "explain", "place", "cluster", "group_links",
           "Run3D", "run_3d", "HybridRun", "pipeline_data_parallel", "SyncPair", "SYNC_FORMAT",
           "hybrid_name", "crossover_batch", "assignment_bytes", "HybridTraffic",
           "hybrid_traffic", "TENSOR_SPLITS", "hybrid_step", "run_zero_tensor",
           "ZeroTensorRun", "Placement", "placement", "CnnCommunication", "cnn_communication",
           "run_expert_data", "ExpertDataRun", "expert_data_rank", "MoEBlock",
           "PublishedRun", "NARAYANAN_2021_TABLE_1", "Prediction", "paper_flops", "predict",
           "predict_all", "plan_published", "KorthikantiRun", "KORTHIKANTI_2022", "IterationPrediction",
           "model_flops", "predict_iteration", "compare_memory", "memory_comparisons",
           "MemoryComparison", "KORTHIKANTI_TECHNIQUES"]
