"""A run's measured timeline (a Chrome trace, :func:`parlab.comm.chrome_trace`) drawn like the
simulated Gantt chart: one row per rank, compute and communication in two lanes.

The simulator's Gantt chart counts equal time steps; this draws what the ranks really did,
in milliseconds, from the same JSON that https://ui.perfetto.dev opens. Any Chrome trace
with one process per rank can be drawn, torch.profiler's included.
"""

from __future__ import annotations

from parlab.pipeline import Action, action_code
from parlab.viz.lazy import patches, plt
from parlab.viz.plots.pipeline import draw_gantt
from parlab.viz.style import microbatch_color

__all__ = ["draw_trace", "trace_figure"]

_COMPUTE = "#4C72B0"
_COMM = {"send": "#C0392B", "recv": "#E8A39B", "all_reduce": "#8E44AD", "broadcast": "#B39DDB"}
_OTHER_COMM = "#7F7F7F"


def _tracks(trace) -> dict:
    """{pid: track name} in the trace's order (``process_sort_index``, else pid)."""
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    order = {e["pid"]: e["args"]["sort_index"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_sort_index"}
    pids = sorted({e["pid"] for e in events if e.get("ph") == "X"},
                  key=lambda p: (order.get(p, 0), str(type(p)), p))
    return {p: names.get(p, f"pid {p}") for p in pids}


def _style(event) -> tuple[str, float, str]:
    """(colour, alpha, label) of one span: compute by micro-batch (light F1, dark E1, as in
    the Gantt chart; a split backward's B1 middle, its W1 dark), communication by operation."""
    args = event.get("args", {})
    if event.get("cat") == "communication":
        return _COMM.get(args.get("op"), _OTHER_COMM), 0.9, ""
    if "microbatch" in args and args.get("kind") in ("F", "B", "I", "W"):
        color = microbatch_color(args["microbatch"])
        label = action_code(Action(args.get("stage", 0), args["kind"], args["microbatch"]))
        return color, {"F": 0.45, "I": 0.7}.get(args["kind"], 0.95), label
    return _COMPUTE, 0.7, ""


def draw_trace(trace, ax, flows: bool = True) -> None:
    """Ranks as rows (compute above, communication below), time in ms from the first span."""
    tracks = _tracks(trace)
    row = {pid: n for n, pid in enumerate(tracks)}
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["pid"] in row]
    start = min(e["ts"] for e in spans)
    length = (max(e["ts"] + e["dur"] for e in spans) - start) / 1000 or 1.0
    for e in spans:
        left, width = (e["ts"] - start) / 1000, e["dur"] / 1000
        color, alpha, label = _style(e)
        lane = -0.42 if e.get("cat") != "communication" else 0.02
        ax.add_patch(patches.Rectangle((left, row[e["pid"]] + lane), width, 0.4, facecolor=color,
                                       alpha=alpha, lw=0.3, edgecolor="white"))
        if label and width > length / 45:
            ax.text(left + width / 2, row[e["pid"]] - 0.22, label, ha="center", va="center",
                    fontsize=7, color="black" if alpha < 0.9 else "white")
    if flows:
        ends = {}
        for e in trace["traceEvents"]:
            if e.get("ph") in ("s", "f") and e["pid"] in row:
                ends.setdefault(e["id"], {})[e["ph"]] = ((e["ts"] - start) / 1000,
                                                         row[e["pid"]] + 0.22)
        for pair in ends.values():
            if "s" in pair and "f" in pair:
                ax.annotate("", xy=pair["f"], xytext=pair["s"],
                            arrowprops=dict(arrowstyle="-|>", color="#555555", lw=0.5,
                                            alpha=0.5, shrinkA=0, shrinkB=0))
    ax.set_yticks(range(len(tracks)), list(tracks.values()))
    ax.set_ylim(len(tracks) - 0.5, -0.6)
    ax.set_xlim(0, length)
    ax.set_xlabel("time since the first span (ms, measured)")
    for spine in ("top", "right"):
        ax.spines[spine].set_visible(False)
    ops = sorted({e.get("args", {}).get("op") for e in spans if e.get("cat") == "communication"}
                 - {None})
    by_microbatch = any(_style(e)[2] for e in spans)
    handles = [patches.Patch(facecolor="#BBBBBB" if by_microbatch else _COMPUTE,
                             label="compute, upper lane" + (
                                 ":\ncolour = micro-batch,\nlight F, dark E" if by_microbatch
                                 else ""))]
    handles += [patches.Patch(facecolor=_COMM.get(op, _OTHER_COMM), label=f"{op}, lower lane")
                for op in ops]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0),
              frameon=False)
    ax.set_title(f"measured: {len(tracks)} ranks, {length:.1f} ms from the first span to the last",
                 fontsize=10)


def trace_figure(trace, simulation=None, flows: bool = True):
    """A measured timeline; with ``simulation`` (a :class:`parlab.pipeline.Simulation`), the
    simulated Gantt chart of the same schedule above it, for the comparison."""
    if not isinstance(trace, dict) or not any(e.get("ph") == "X"
                                              for e in trace.get("traceEvents", [])):
        raise ValueError("trace must be a Chrome trace dict with at least one span "
                         "('ph': 'X'), as parlab.comm.chrome_trace returns")
    rows = len(_tracks(trace))
    if simulation is None:
        fig, ax = plt.subplots(figsize=(11, 0.9 + 0.6 * rows))
        draw_trace(trace, ax, flows)
    else:
        p = simulation.schedule.stages
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 1.8 + 0.45 * p + 0.6 * rows),
                                          gridspec_kw={"height_ratios": [p + 1, rows + 1]})
        draw_gantt(simulation, top)
        top.set_title("simulated: " + top.get_title(), fontsize=10)
        draw_trace(trace, bottom, flows)
    fig.tight_layout()
    return fig
