"""Chapter 09 explorer: 1F1B, ZB-H1, ZBV and DualPipeV on one time axis, for any ranks,
micro-batches and times of B and W against F, each with its bubble."""

from __future__ import annotations

from parlab.pipeline import Durations, program, timeline
from parlab.viz.explorer import Explorer, explore

__all__ = ["draw_zero_bubble", "zero_bubble_explorer", "EXPLORED"]

#: The schedules the explorer draws, one above the other.
EXPLORED = ("1f1b", "zb-h1", "zbv", "dualpipev")


def draw_zero_bubble(ranks: int, microbatches: int, b: float, w: float):
    """Each schedule of :data:`EXPLORED` for the same model on ``ranks`` ranks with
    ``microbatches`` micro-batches, F = 1 and B = ``b``, W = ``w`` per rank's stage (a V's
    stage takes half): every one's bubble, printed, and their Gantt charts on one time axis.
    DualPipeV is left out below 2 x ranks micro-batches."""
    from parlab.viz.plots.zero_bubble import schedules_figure

    per_stage = Durations(1.0, b, w)
    timelines = {}
    for name in EXPLORED:
        if name == "dualpipev" and microbatches < 2 * ranks:
            print(f"DualPipeV needs at least 2 x ranks = {2 * ranks} micro-batches: left out")
            continue
        prog = program(name, ranks, microbatches)
        timelines[name] = timeline(prog, per_stage.split(prog.chunks))
    base = timelines["1f1b"].makespan
    for name, t in timelines.items():
        print(f"{name:>9}: length {t.makespan:g}, idle per rank {t.idle[0]:g}, bubble fraction "
              f"{t.bubble_fraction:.3f}, {base / t.makespan - 1:+.0%} against 1F1B")
    return schedules_figure(timelines, tuple(per_stage[:3]))


def zero_bubble_explorer(ranks: int = 4, microbatches: int = 8, b: float = 1.0,
                         w: float = 1.0) -> Explorer:
    """Ranks, micro-batches, and B and W in units of F: the four schedules on one time axis."""
    import ipywidgets as wd

    controls = {
        "ranks": wd.IntSlider(value=ranks, min=2, max=8, description="ranks"),
        "microbatches": wd.IntSlider(value=microbatches, min=2, max=32, description="micro-batches"),
        "b": wd.FloatSlider(value=b, min=0.5, max=2.0, step=0.25, description="B / F"),
        "w": wd.FloatSlider(value=w, min=0.25, max=2.0, step=0.25, description="W / F"),
    }
    return explore(draw_zero_bubble, controls, "Zero-bubble explorer (ranks, micro-batches, "
                   "B and W against F)")
