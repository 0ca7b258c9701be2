"""Chapter 09 pictures: the schedules that split the backward, on one time axis, their bubble
against micro-batches and ranks, and the measured timelines of the real runs.

They draw what :func:`parlab.pipeline.timeline` (a :class:`parlab.pipeline.Timeline`) and the
chapter's experiments computed; they compute nothing else.
"""

from __future__ import annotations

from parlab.pipeline import action_code
from parlab.viz.lazy import patches, plt
from parlab.viz.plots.timeline import draw_trace
from parlab.viz.style import microbatch_color

__all__ = ["draw_timeline", "schedules_figure", "bubble_figure", "measured_figure"]

#: How dark each pass is: forward light, input gradient (B) middle, W and a full backward dark.
_ALPHA = {"F": 0.35, "I": 0.7, "W": 1.0, "B": 0.95}
_STYLES = {"1f1b": ("#DD8452", "^"), "zb-h1": ("#4C72B0", "o"), "zbv": ("#55A868", "D"),
           "dualpipev": ("#8E44AD", "s"), "gpipe": ("#7F7F7F", "v")}


def draw_timeline(t, ax, xmax: float | None = None) -> None:
    """One :class:`parlab.pipeline.Timeline`: ranks as rows, every action from its start to its
    end; colour = micro-batch, light F, middle B (input gradient), dark W; a V's second stage
    on a rank framed in black; boxes labelled where they are wide enough for a label."""
    prog = t.program
    span = xmax or t.makespan or 1.0
    for e in t.entries:
        a, width = e.action, e.end - e.start
        second = prog.chunks > 1 and a.stage >= prog.stages
        ax.add_patch(patches.Rectangle((e.start, e.rank - (0.42 if not second else 0.3)), width,
                                       0.84 if not second else 0.72,
                                       facecolor=microbatch_color(a.microbatch),
                                       alpha=_ALPHA[a.kind], lw=0.8 if second else 0.5,
                                       edgecolor="black" if second else "white"))
        if width > span / 40:  # narrower boxes unlabelled: colour and shade tell them apart
            ax.text(e.start + width / 2, e.rank, action_code(a), ha="center", va="center",
                    fontsize=7, color="black" if a.kind == "F" else "white")
    ax.set_yticks(range(prog.stages), [f"rank {r}" for r in range(prog.stages)])
    ax.set_ylim(prog.stages - 0.5, -0.5)
    ax.set_xlim(0, span)
    for spine in ("top", "right"):
        ax.spines[spine].set_visible(False)
    stages = (f"{prog.virtual_stages} stages in a V" if prog.placement == "v"
              else f"{prog.virtual_stages} stages")
    ax.set_title(f"{prog.name} ({stages}): {t.makespan:g} long, bubble fraction "
                 f"{t.bubble_fraction:.3f}, idle per rank {t.idle[0]:g}", fontsize=9)


def schedules_figure(timelines: dict, passes: tuple | None = None):
    """Several :class:`parlab.pipeline.Timeline` s, one above the other, on one time axis;
    ``passes``, the (F, B, W) of one rank's stage they were simulated with, for the title."""
    longest = max(t.makespan for t in timelines.values())
    first = next(iter(timelines.values())).program
    ranks = max(t.program.stages for t in timelines.values())
    height = 0.8 + len(timelines) * (0.45 + 0.32 * ranks)
    fig, axes = plt.subplots(len(timelines), 1, figsize=(11, height), squeeze=False)
    for ax, t in zip(axes[:, 0], timelines.values()):
        draw_timeline(t, ax, longest)
    axes[-1, 0].set_xlabel("time (a V schedule's stage holds half a rank's layers: it takes "
                           "half a rank's time)")
    axes[0, 0].legend(handles=[patches.Patch(facecolor="#999999", alpha=_ALPHA[k], label=label)
                               for k, label in (("F", "F forward"), ("I", "B input gradient"),
                                                ("W", "W weight gradient"),
                                                ("B", "E full backward (B + W)"))]
                      + [patches.Patch(facecolor="white", edgecolor="black",
                                       label="a V's second stage (framed)")],
                      fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    times = "" if passes is None else (f"; per rank's stage F = {passes[0]:g}, "
                                       f"B = {passes[1]:g}, W = {passes[2]:g}")
    fig.suptitle(f"The same model on {ranks} ranks, {first.microbatches} micro-batches "
                 f"(colour = micro-batch){times}", fontsize=10)
    fig.tight_layout()
    return fig


def bubble_figure(by_m: dict, m_values, by_p: dict, p_values, ranks: int, microbatches: int,
                  passes: tuple):
    """Bubble fraction of each schedule against micro-batches (``by_m[name]`` at ``m_values``,
    on ``ranks`` ranks) and against ranks (``by_p[name]`` at ``p_values``, ``microbatches``)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    for ax, curves, xs, label, title in (
            (axes[0], by_m, m_values, "micro-batches m", f"{ranks} ranks"),
            (axes[1], by_p, p_values, "ranks p", f"{microbatches} micro-batches")):
        for name, values in curves.items():
            color, marker = _STYLES.get(name, ("#333333", "."))
            ax.plot(xs, values, marker=marker, color=color, label=name)
        ax.set_xlabel(label)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_xscale("log", base=2)
    axes[0].set_xticks(list(m_values), [str(m) for m in m_values])
    axes[0].set_ylabel("bubble fraction (idle / all rank time)")
    axes[0].legend(fontsize=8)
    f, b, w = passes
    fig.suptitle(f"Bubble fraction, simulated with F = {f:g}, B = {b:g}, W = {w:g} per rank's "
                 f"stage", fontsize=10)
    fig.tight_layout()
    return fig


def measured_figure(traces: dict):
    """The measured timelines of several runs (``{name: Chrome trace}``), one above the other,
    on one axis of milliseconds."""
    fig, axes = plt.subplots(len(traces), 1, figsize=(12, 0.6 + 1.45 * len(traces)),
                             squeeze=False)
    longest = 0.0
    for ax, (name, trace) in zip(axes[:, 0], traces.items()):
        draw_trace(trace, ax, flows=False)
        longest = max(longest, ax.get_xlim()[1])
        ax.set_title(f"{name}, measured: {ax.get_title().split(': ', 1)[-1]}", fontsize=9)
        if ax is not axes[0, 0]:
            ax.get_legend().remove()
    for ax in axes[:, 0]:
        ax.set_xlim(0, longest)
    fig.tight_layout()
    return fig
