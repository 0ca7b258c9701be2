"""Chapter 03 explorers: step through a pipeline schedule; compare schedules over p, m, v.

Both follow :func:`parlab.viz.explore`: the figure at the default setting first (so
the notebook reads well without widgets), then live controls. The step explorer adds a
Play button linked to its time-step slider in the browser (``jslink``), so a reader can
watch the pipeline fill and drain; the printed caption carries the active-GPU percentage.
"""

from __future__ import annotations

from parlab.viz.explorer import Explorer, explore

__all__ = ["step_explorer", "compare_explorer", "STEP_SCHEDULES"]

#: The schedules the step explorer offers: (label, name, stages, micro-batches, chunks).
STEP_SCHEDULES = (
    ("book (Figures 8-3 to 8-13)", "book", 4, 4, 1),
    ("GPipe", "gpipe", 4, 4, 1),
    ("1F1B", "1f1b", 4, 4, 1),
    ("interleaved 1F1B, v=2", "interleaved", 4, 4, 2),
    ("naive model parallelism", "naive", 4, 4, 1),
)


def step_explorer(step: int = 1, choices=STEP_SCHEDULES) -> Explorer:
    """A time-step slider (with Play) and a schedule dropdown over the step figure + Gantt."""
    import ipywidgets as w

    from parlab.pipeline import schedule, simulate
    from parlab.viz.plots.pipeline import step_caption, step_figure

    sims = {label: simulate(schedule(name, p, m, v)) for label, name, p, m, v in choices}
    first = sims[choices[0][0]]
    if not 1 <= step <= first.steps:
        raise ValueError(f"step must be 1 to {first.steps}, got {step}")
    slider = w.IntSlider(value=step, min=1, max=first.steps, description="time step",
                         continuous_update=False)
    play = w.Play(value=step, min=1, max=first.steps, interval=900, description="play")
    w.jslink((play, "value"), (slider, "value"))
    dropdown = w.Dropdown(options=list(sims), value=choices[0][0], description="schedule",
                          layout=w.Layout(width="340px"))

    def fit_steps(change):  # runs before the redraw: explore() observes after this
        steps = sims[change["new"]].steps
        play.max = slider.max = steps

    dropdown.observe(fit_steps, names="value")

    def draw(step, schedule):
        sim = sims[schedule]
        step = min(step, sim.steps)
        print(step_caption(sim, step))
        return step_figure(sim, step)

    explorer = explore(draw, {"step": slider, "schedule": dropdown},
                       "time-step slider with play button and schedule dropdown: the GPUs at "
                       "that step, the transfers, the active-GPU percentage, and the Gantt chart")
    return Explorer(w.VBox([play, explorer.widget]), explorer.description)


def compare_explorer(stages: int = 4, microbatches: int = 8, chunks: int = 2) -> Explorer:
    """Sliders for p, m, v over the comparison table and curves of naive/GPipe/1F1B/interleaved."""
    import ipywidgets as w

    from parlab.pipeline import compare, comparison_table, tradeoffs
    from parlab.viz.plots.pipeline import comparison_figure

    controls = {
        "stages": w.IntSlider(value=stages, min=2, max=8, description="stages p",
                              continuous_update=False),
        "microbatches": w.IntSlider(value=microbatches, min=1, max=32,
                                    description="micro-batches m", continuous_update=False),
        "chunks": w.IntSlider(value=chunks, min=1, max=4, description="chunks v",
                              continuous_update=False),
    }

    def draw(stages, microbatches, chunks):
        print(comparison_table(compare(stages, microbatches, chunks)))
        return comparison_figure(tradeoffs(stages, microbatches, chunks))

    return explore(draw, controls, "sliders for stages p, micro-batches m and chunks v: steps, "
                   "bubble fraction, peak activation memory and transfers per schedule")
