"""Chapter 05's figure recipes: the planner's best layouts, where ranks sit, a small CNN
measured, and the real 3D job's traffic.

Each recipe searches, profiles or runs ranks here and hands the result to
:mod:`parlab.viz.plots`, which only draws. The slides' summary and the copy sizes of chapters
01 and 05 side by side are in :mod:`parlab.experiments.ch05_summary` and
:mod:`parlab.experiments.ch05_copies`.
"""

from __future__ import annotations

from parlab.hybrid import cnn_communication, placement, run_3d, search
from parlab.models import profile, SmallCNN
from parlab.viz import figure
from parlab.viz.plots import cnn_figure, layouts_figure, placement_figure, traffic_3d_figure

__all__: list[str] = []


@figure("fig-05-planner-layouts", "GPT-3 175B on 1,024 GPUs of 80 GB: step time and memory "
        "of the best layouts")
def _planner_layouts():
    return layouts_figure(search("GPT-3 175B", 1024, 80))


@figure("fig-05-rank-placement", "Rank placement: tensor groups in a server, stages along "
        "rails (dp 2 x tp 4 x pp 4 on 4 servers of 8)")
def _rank_placement():
    return placement_figure(placement(2, 4, 4))


@figure("fig-05-cnn-compute-vs-params", "A small CNN: compute in the convolutions, parameters "
        "in the fully connected layers, and the communication per strategy")
def _cnn():
    return cnn_figure(cnn_communication(profile(SmallCNN(), (3, 32, 32), batch=8)))


@figure("fig-05-3d-traffic", "The 8-rank 3D job (dp 2 x tp 2 x pp 2): bytes by group and link")
def _traffic_3d():
    return traffic_3d_figure(run_3d(backend="toy"))
