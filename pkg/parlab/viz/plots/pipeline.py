"""Chapter 03 pictures: one time step of a pipeline (Figures 8-3 to 8-13), the Gantt chart of
a whole schedule, the schedule comparison, and the gradient sync of Figure 8-14.

Everything is drawn from a :class:`parlab.pipeline.Simulation` (or a run's results),
so a figure shows what was computed, for any schedule, not a copy of the book's picture.
"""

from __future__ import annotations

from parlab.pipeline import action_code
from parlab.viz.lazy import lines, patches, plt
from parlab.viz.style import GPU_COLORS, microbatch_color, rank_color

__all__ = ["draw_step", "draw_gantt", "step_figure", "gantt_figure", "comparison_figure",
           "sync_figure", "step_caption"]

_BOX_W, _GAP = 1.5, 0.7


def _color(sim, rank):
    return GPU_COLORS.get(sim.names[rank], rank_color(rank))


def _action_text(sim, action) -> str:
    i = action.microbatch + 1
    chunk = f" c{action.stage // sim.schedule.stages + 1}" if sim.schedule.chunks > 1 else ""
    if action.kind == "B":
        return f"E{i}, G{i}{chunk}"
    source = f"x{i}" if action.stage == 0 else f"y{i}"
    result = f"out {i}" if action.stage == sim.schedule.virtual_stages - 1 else f"y{i}"
    return f"{source} → {result}{chunk}"


def step_caption(sim, step: int) -> str:
    """``Time step 5 of 11 (book): A2, B1, B2 busy; 75% active`` (the widget prints this)."""
    record = sim.records[step - 1]
    busy = ", ".join(sim.names[r] for r in record.active) or "no GPU"
    return (f"Time step {step} of {sim.steps} ({sim.schedule.name}): {busy} busy; "
            f"{record.active_percent:g}% active")


def draw_step(sim, step: int, ax) -> None:
    """The GPUs in a row: what each computes in ``step``, and the tensors sent (arrows)."""
    record = sim.records[step - 1]
    p = sim.schedule.stages
    x = lambda rank: rank * (_BOX_W + _GAP)
    for rank in range(p):
        work = [a for r, a in record.compute if r == rank]
        color = _color(sim, rank)
        ax.add_patch(patches.Rectangle((x(rank), 0), _BOX_W, 1.4,
                                       facecolor=color if work else "#EEEEEE",
                                       alpha=0.35 if work else 1.0, edgecolor=color, lw=2))
        ax.text(x(rank) + _BOX_W / 2, 1.5, sim.names[rank], ha="center", va="bottom",
                fontsize=12, weight="bold", color=color)
        texts = [_action_text(sim, a) for a in work] or ["idle"]
        ax.text(x(rank) + _BOX_W / 2, 0.7, "\n".join(texts), ha="center", va="center",
                fontsize=10, color="black" if work else "#888888")
    reach = 0.0  # how far wrap-around arcs bulge above or below the boxes
    for t in record.transfers:
        forward = t.kind == "y"
        color = "#2F5597" if forward else "#C0392B"
        if abs(t.dst - t.src) == 1:  # neighbours: a straight arrow, y above and E below
            y = 1.1 if forward else 0.3
            start = x(t.src) + (_BOX_W if t.dst > t.src else 0)
            end = x(t.dst) + (0 if t.dst > t.src else _BOX_W)
            ax.add_patch(patches.FancyArrowPatch((start, y), (end, y), arrowstyle="-|>",
                                                 mutation_scale=14, color=color, lw=1.8))
            label_y = y + (0.1 if forward else -0.1)
        else:  # interleaved wrap-around (last GPU <-> first): an arc over or under the row
            y = 1.45 if forward else -0.05
            start, end = x(t.src) + _BOX_W / 2, x(t.dst) + _BOX_W / 2
            # arc3 puts the control point rad x distance to the right of the direction of
            # travel: rad > 0 bends a leftward y upward and a rightward E downward
            ax.add_patch(patches.FancyArrowPatch((start, y), (end, y), arrowstyle="-|>",
                                                 mutation_scale=14, color=color, lw=1.8,
                                                 connectionstyle="arc3,rad=0.25"))
            bulge = 0.5 * 0.25 * abs(end - start)
            reach = max(reach, bulge)
            label_y = y + (bulge + 0.05 if forward else -bulge - 0.05)
        ax.text((start + end) / 2, label_y, f"{t.kind}{t.microbatch + 1}", ha="center",
                va="bottom" if forward else "top", fontsize=10, color=color, weight="bold")
    ax.set_xlim(-0.3, x(p - 1) + _BOX_W + 0.3)
    ax.set_ylim(-0.6 - reach, 2.0 + reach)
    ax.axis("off")
    ax.set_title(step_caption(sim, step), fontsize=11)


def draw_gantt(sim, ax, step: int | None = None, in_time: bool = False) -> None:
    """Ranks (rows) x time steps (columns); forward (F1) light, backward (E1) dark, colour =
    micro-batch.
    A cell with two actions is split; the active-GPU percentage tops each column (turned
    upright where a column is narrower than one time unit, so neighbours never overlap). With
    ``in_time`` the x axis is time (one micro-batch through one whole stage = 1), so
    schedules whose steps differ in length (naive, interleaved) line up."""
    p, steps = sim.schedule.stages, sim.steps
    scale = sim.schedule.slot_size if in_time else 1.0
    dense = steps * scale > 24 or steps > 40
    for record in sim.records:
        left0 = (record.step - 1) * scale + (0 if in_time else 0.5)
        for rank in range(p):
            work = [a for r, a in record.compute if r == rank]
            for n, action in enumerate(work):
                width = scale / len(work)
                color = microbatch_color(action.microbatch)
                left = left0 + n * width
                ax.add_patch(patches.Rectangle((left, rank - 0.42), width, 0.84, facecolor=color,
                                               alpha=0.4 if action.kind == "F" else 0.95, lw=0.5,
                                               edgecolor="white",
                                               hatch="//" if action.stage >= p else None))
                if not dense:
                    ax.text(left + width / 2, rank, action_code(action),
                            ha="center", va="center", fontsize=7 if width < 0.6 else 9,
                            color="black" if action.kind == "F" else "white")
        if not dense and scale >= 0.5:  # narrow columns get upright labels, side by side
            ax.text(left0 + scale / 2, -0.5 if scale < 1 else -0.65,
                    f"{record.active_percent:g}%", ha="center",
                    va="bottom", fontsize=6 if scale < 1 else 8, color="#555555",
                    rotation=90 if scale < 1 else 0)
    if step is not None:
        ax.add_patch(patches.Rectangle(((step - 1) * scale + (0 if in_time else 0.5), -0.5),
                                       scale, p, fill=False, edgecolor="black", lw=2.2))
    ax.set_yticks(range(p), sim.names)
    ax.set_ylim(p - 0.5, -1.3 if scale < 1 and not dense else -0.9)
    chunks = "   (hatched: second and later model chunks)" if sim.schedule.chunks > 1 else ""
    if in_time:
        ax.set_xlim(0, steps * scale)
        ax.set_xlabel("time (1 = one micro-batch through one whole stage)" + chunks)
    else:
        ax.set_xlim(0.5, steps + 0.5)
        ax.set_xlabel("time step" + chunks)
        ax.set_xticks(range(1, steps + 1, 1 if steps <= 24 else 4))
    for spine in ("top", "right"):
        ax.spines[spine].set_visible(False)
    ax.set_title(f"{sim.schedule.name}: {steps} steps, bubble fraction "
                 f"{sim.bubble_fraction:.3f} (idle slots / all slots)", fontsize=10)


def step_figure(sim, step: int):
    """One time step (above) beside the whole schedule's Gantt chart with that step framed."""
    if not 1 <= step <= sim.steps:
        raise ValueError(f"step must be 1 to {sim.steps} for this schedule, got {step}")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6.2),
                                      gridspec_kw={"height_ratios": [1.25, 1]})
    draw_step(sim, step, top)
    draw_gantt(sim, bottom, step)
    fig.tight_layout()
    return fig


def gantt_figure(sims):
    """Several schedules' Gantt charts, one above the other, on one time axis."""
    height = sum(0.9 + 0.42 * s.schedule.stages for s in sims)
    fig, axes = plt.subplots(len(sims), 1, figsize=(11, height), squeeze=False)
    longest = max(s.time for s in sims)
    for ax, sim in zip(axes[:, 0], sims):
        draw_gantt(sim, ax, in_time=True)
        ax.set_xlim(0, longest)
    fig.tight_layout()
    return fig


def comparison_figure(tradeoffs):
    """The slides' trade-offs as curves: bubble and activation memory against m, and what
    interleaving buys (smaller bubble) and costs (more transfers) against v, from a
    :class:`parlab.pipeline.Tradeoffs` (:func:`parlab.pipeline.tradeoffs`)."""
    from parlab.pipeline import COMPARED

    stages, microbatches, chunks = tradeoffs.stages, tradeoffs.microbatches, tradeoffs.chunks
    rows, m_values, v_values = tradeoffs.by_m, list(tradeoffs.by_m), list(tradeoffs.by_v)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    styles = {"naive": ("#7F7F7F", "s"), "gpipe": ("#4C72B0", "o"), "1f1b": ("#DD8452", "^"),
              "interleaved": ("#55A868", "D")}
    for name in COMPARED:
        label = f"interleaved (v={chunks})" if name == "interleaved" else name
        ms = [m for m in m_values if not rows[m][name].error]
        color, marker = styles[name]
        axes[0].plot(ms, [rows[m][name].bubble_fraction for m in ms], marker=marker,
                     color=color, label=label, ls="--" if name == "1f1b" else "-")
        axes[1].plot(ms, [rows[m][name].peak_bytes / 1e9 for m in ms], marker=marker,
                     color=color, label=label, ls="--" if name == "1f1b" else "-")
    axes[0].plot(m_values, [(stages - 1) / (m + stages - 1) for m in m_values], ":", color="black",
                 label="(p-1)/(m+p-1)")
    for ax in axes[:2]:
        ax.axvline(microbatches, color="#BBBBBB", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("micro-batches m")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("bubble fraction (idle / all slots)")
    axes[0].set_title(f"more micro-batches shrink the bubble (p={stages})", fontsize=10)
    axes[1].set_ylabel("peak activations on one GPU (GB)")
    axes[1].set_title("1F1B caps activation memory", fontsize=10)
    vs, bubbles, sends = [], [], []
    for v, row in tradeoffs.by_v.items():
        if not row.error:
            vs.append(v), bubbles.append(row.bubble_fraction), sends.append(row.transfers)
    axes[2].plot(vs, bubbles, "D-", color="#55A868", label="bubble fraction")
    axes[2].set_xlabel("model chunks per GPU v (v=1 is 1F1B)")
    axes[2].set_ylabel("bubble fraction", color="#55A868")
    axes[2].set_xticks(list(v_values))
    twin = axes[2].twinx()
    twin.plot(vs, sends, "o--", color="#C0392B", label="transfers per batch")
    twin.set_ylabel("tensors sent per batch", color="#C0392B")
    axes[2].set_title(f"interleaving: smaller bubble, more traffic (m={microbatches})",
                      fontsize=10)
    fig.tight_layout()
    return fig


def sync_figure(run, index: tuple = (0, 0)):
    """Figure 8-14: the pipeline replicas in rows (A1, A2, B1, B2 above C1, C2, D1, D2). The
    GPUs that hold the same stage share a colour and a red arrow: one all-reduce sums their
    gradients, and each GPU divides by the number of replicas. Each box prints weight
    ``index`` of its layer's local gradient, each arrow the average, both in ``SYNC_FORMAT``.
    A legend tells the blue arrows (activations forward, errors back within one replica)
    from the red ones."""
    from parlab.hybrid import SYNC_FORMAT

    p, replicas, f = run.schedule.stages, run.replicas, SYNC_FORMAT
    step_x, step_y, box_w, box_h = 2.6, 2.1, 1.9, 1.0
    fig, ax = plt.subplots(figsize=(2.5 * p + 0.4, 1.6 * replicas + 0.7))
    top = lambda replica: (replicas - 1 - replica) * step_y
    for pair in run.sync_pairs(index):
        x = pair.stage * step_x
        for replica, (name, local) in enumerate(zip(pair.gpus, pair.local)):
            y = top(replica)
            ax.add_patch(patches.Rectangle((x, y), box_w, box_h, facecolor=rank_color(pair.stage),
                                           alpha=0.35, edgecolor="black"))
            ax.text(x + box_w / 2, y + box_h / 2, f"{name}\n{pair.label}\nlocal {format(local, f)}",
                    ha="center", va="center", fontsize=8.5)
            if pair.stage < p - 1:
                ax.annotate("", xy=(x + step_x, y + box_h / 2), xytext=(x + box_w, y + box_h / 2),
                            arrowprops=dict(arrowstyle="<->", color="#2F5597"))
        low, high = top(replicas - 1) + box_h, top(0)
        ax.annotate("", xy=(x + 0.25, low + 0.02), xytext=(x + 0.25, high),
                    arrowprops=dict(arrowstyle="<->", color="#C0392B", lw=2))
        ax.text(x + 0.4, (low + high) / 2, f"all-reduce: sum\n÷ {replicas} = "
                f"{format(pair.averaged, f)}", fontsize=8, color="#C0392B", va="center")
    ax.set_xlim(-0.2, step_x * (p - 1) + box_w + 0.2)
    ax.set_ylim(-0.75, top(0) + box_h + 0.2)
    ax.axis("off")
    ax.legend(handles=[
        lines.Line2D([], [], color="#2F5597", lw=1.5,
                     label="within a replica: activations y → next stage, errors E ← back"),
        lines.Line2D([], [], color="#C0392B", lw=2,
                     label="between replicas: all-reduce of one stage's gradients")],
        loc="lower center", ncol=2, fontsize=8, frameon=False)
    ax.set_title(f"{replicas} pipeline replicas × {p} stages on {p * replicas} GPUs: the GPUs "
                 f"holding a stage all-reduce its gradients (weight {list(index)} shown)",
                 fontsize=10)
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.02, top=0.9)
    return fig
