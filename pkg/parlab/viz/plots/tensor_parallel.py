"""Chapter 04 pictures: how Q, K, V are cut (Figure 8-17), the book's attention on two GPUs with
the bytes of each collective (Figure 8-18), Figure 8-19's six GPUs with bytes per link, and
the bytes of the three attention splits side by side.

Everything is drawn from shard specs and from the toy backend's traffic of a real run
(a :class:`parlab.experiments.Comparison`), so the numbers on a figure are the ones
the ranks moved.
"""

from __future__ import annotations

from parlab.hardware import GPU_MEMORY_GB
from parlab.units import format_bytes
from parlab.viz.lazy import patches, plt
from parlab.viz.style import GPU_COLORS

__all__ = ["qkv_sharding_figure", "book_attention_figure", "book_attention_rows",
           "BOOK_ATTENTION_STEPS", "ffn_figure", "attention_bytes_figure",
           "strategy_figure", "memory_figure", "format_bytes"]

_NAMES = ("A1", "A2")


def qkv_sharding_figure(shards: dict, n_heads: int = 2):
    """Figure 8-17: W_Q, W_K, W_V in the book's layout (inputs x outputs), columns per GPU.

    ``shards`` maps "Q", "K", "V" to the :class:`~parlab.tensor_parallel.ShardSpec` of each GPU
    (:func:`parlab.experiments.qkv_shards`: :func:`parlab.tensor_parallel.shard_spec`, as
    :class:`~parlab.tensor_parallel.attention.BookAttention` cuts); dashed lines mark the
    ``n_heads`` heads, so one sees whether a cut falls between heads.
    """
    d_model, ranks = shards["Q"][0].shape[0], len(shards["Q"])
    fig, axes = plt.subplots(1, 4, figsize=(12, 3.4), gridspec_kw={"width_ratios": [1, 1, 1, 1]})
    axes[0].axis("off")
    axes[0].text(0.5, 0.62, "E  (tokens x d_model)\nbroadcast from A1", ha="center",
                 va="center", fontsize=11)
    axes[0].text(0.5, 0.3, "Q = E W_Q,  K = E W_K,  V = E W_V\n"
                 "each GPU multiplies E by its columns",
                 ha="center", va="center", fontsize=9, color="#444444")
    d_head = d_model // n_heads
    for ax, letter in zip(axes[1:], ("Q", "K", "V")):
        # nn.Linear rows = the matrix's output columns in the book's layout
        for spec in shards[letter]:
            ax.add_patch(patches.Rectangle((spec.start, 0), spec.stop - spec.start, d_model,
                                           facecolor=GPU_COLORS[spec.owner], alpha=0.45,
                                           edgecolor=GPU_COLORS[spec.owner], lw=2))
            ax.text((spec.start + spec.stop) / 2, d_model / 2,
                    f"{spec.owner}\ncolumns\n{spec.start}-{spec.stop - 1}", ha="center",
                    va="center", fontsize=10, weight="bold")
        for h in range(1, n_heads):
            ax.axvline(h * d_head, color="black", ls="--", lw=1)
        ax.set_xlim(0, d_model)
        ax.set_ylim(0, d_model)
        ax.invert_yaxis()
        ax.set_xticks([(h + 0.5) * d_head for h in range(n_heads)],
                      [f"head {h}" for h in range(n_heads)], fontsize=8)
        ax.set_yticks([])
        ax.set_title(f"W_{letter}  ({d_model} inputs x {d_model} outputs)", fontsize=10)
    fig.suptitle(f"Figure 8-17: W_Q, W_K, W_V split by output columns over {ranks} GPUs "
                 f"({n_heads} heads, dashed)", fontsize=11)
    fig.tight_layout()
    return fig


def _calls(log) -> list[tuple[str, int]]:
    """(op, bytes) per collective call, in the order the calls were made."""
    calls: dict = {}
    for t in log.records:
        key = (t.group, t.op, t.call)
        calls[key] = calls.get(key, 0) + t.nbytes
    return [(op, n) for (_, op, call), n in sorted(calls.items(), key=lambda kv: kv[0][2])]


#: Each pass of the book's attention in causal order: ("compute", what the GPUs do) or
#: ("collective", the tensor it carries). The collectives are the log's, in call order;
#: nothing is drawn before what it needs (the backward pass gathers Q and K again before
#: it can recompute the probabilities from them).
BOOK_ATTENTION_STEPS = {
    "forward": [("compute", "A1: look up X"),
                ("collective", "X (embeddings)"),
                ("compute", "both: Q, K, V = X W (own columns)"),
                ("collective", "Q slices"),
                ("collective", "K slices"),
                ("compute", "both: softmax(QK^T/sqrt d) x own V columns; x own rows of W_O"),
                ("collective", "partial outputs"),
                ("compute", "both: output = the summed partial outputs + bias")],
    "backward": [("compute", "both: d(output) x own rows of W_O: dW_O rows, d(own context)"),
                 ("collective", "Q slices again"),
                 ("collective", "K slices again"),
                 ("compute", "both: recompute the probabilities from the whole Q and K"),
                 ("compute", "both: dV (own), dQ and dK (whole, partial sums)"),
                 ("collective", "dQ contributions"),
                 ("collective", "dK contributions"),
                 ("compute", "both: keep own slice of dQ, dK; dW_Q, dW_K, dW_V; partial dX"),
                 ("collective", "dX contributions to A1"),
                 ("compute", "A1: dX for the embedding table")],
}


def book_attention_rows(calls: list[tuple[str, int]], phase: str) -> list[tuple[str, str, int]]:
    """``[(kind, text, bytes)]`` of one pass in causal order: :data:`BOOK_ATTENTION_STEPS`
    with the logged ``calls`` ((op, bytes), in call order) in the collectives' places.

    A log with another number of collectives than the book's (a variant this figure was not
    drawn for) keeps the compute steps and lists its collectives after them, by name.
    """
    steps = BOOK_ATTENTION_STEPS[phase]
    slots = [text for kind, text in steps if kind == "collective"]
    if len(calls) != len(slots):
        return ([("compute", text, 0) for kind, text in steps if kind == "compute"] +
                [("collective", op.replace("_", "-"), n) for op, n in calls])
    rows, pending = [], iter(calls)
    for kind, text in steps:
        if kind == "compute":
            rows.append((kind, text, 0))
        else:
            op, nbytes = next(pending)
            rows.append((kind, f"{op.replace('_', '-')}: {text}", nbytes))
    return rows


def book_attention_figure(comparison):
    """Figure 8-18 (and its backward pass): the book's steps on A1 and A2 and the bytes of each
    collective, read from ``comparison`` (a toy run of ``run_attention("book")``), each pass
    top to bottom in causal order."""
    if comparison.traffic is None:
        raise ValueError("the figure needs a run on the toy backend (backend='toy')")
    fig, axes = plt.subplots(1, 2, figsize=(13, 6.4))
    for ax, phase in zip(axes, ("forward", "backward")):
        rows = book_attention_rows(_calls(comparison.traffic[phase]), phase)
        y = 0
        for kind, text, nbytes in rows:
            if kind == "compute":
                ax.add_patch(patches.Rectangle((0, y), 10, 0.8, facecolor="#F2F2F2",
                                               edgecolor="#999999"))
                ax.text(5, y + 0.4, text, ha="center", va="center", fontsize=9)
                y += 1
            else:
                ax.add_patch(patches.Rectangle((1, y), 8, 0.7, facecolor=GPU_COLORS["A2"],
                                               alpha=0.25, edgecolor=GPU_COLORS["A2"]))
                ax.text(5, y + 0.35, f"{text}  ({format_bytes(nbytes)})", ha="center",
                        va="center", fontsize=9, weight="bold")
                y += 0.9
        collectives = [n for kind, _, n in rows if kind == "collective"]
        ax.set_xlim(0, 10)
        ax.set_ylim(y + 0.2, -0.2)
        ax.axis("off")
        ax.set_title(f"{phase}: {len(collectives)} collectives, "
                     f"{format_bytes(sum(collectives))} on the wire", fontsize=11)
    fig.suptitle("Figure 8-18, the book's tensor-parallel self-attention on A1 and A2, top to "
                 "bottom (bytes from the toy backend's log)", fontsize=11)
    fig.tight_layout()
    return fig


def ffn_figure(comparison, phases=("forward", "backward")):
    """Figure 8-19: three servers of two GPUs, each GPU's neurons, and the bytes per link,
    one panel per phase (from a toy run of :func:`parlab.experiments.run_ffn`)."""
    if comparison.traffic is None:
        raise ValueError("the figure needs a run on the toy backend (backend='toy')")
    fig, axes = plt.subplots(len(phases), 1, figsize=(12, 4.6 * len(phases)), squeeze=False)
    for ax, phase in zip(axes[:, 0], phases):
        _draw_ffn(ax, comparison, phase)
    fig.suptitle("Figure 8-19: tensor parallel inside each server (NVLink, blue), pipeline "
                 "along the rails (red)", fontsize=12)
    fig.tight_layout()
    return fig


def _draw_ffn(ax, comparison, phase: str) -> None:
    from parlab.comm import figure_8_19
    topology = figure_8_19()
    places = comparison.info["placements"]
    sent = comparison.traffic[phase].matrix()  # bytes src (row) -> dst (column)
    pos = {p.rank: (p.stage * 4.0, 2.4 - 2.4 * p.position) for p in places}
    for stage in sorted({p.stage for p in places}):
        ax.add_patch(patches.Rectangle((stage * 4 - 0.3, -0.55), 2.6, 3.9, facecolor="none",
                                       edgecolor="#999999", ls="--"))
        ax.text(stage * 4 + 1.0, 3.45, f"server {stage + 1}", ha="center", fontsize=10,
                color="#555555")
    for p in places:
        x, y = pos[p.rank]
        color = GPU_COLORS.get(p.gpu, "#888888")
        ax.add_patch(patches.Rectangle((x, y), 2.0, 0.9, facecolor=color, alpha=0.35,
                                       edgecolor=color, lw=2))
        first, last = p.neurons
        which = f"neuron {first}" if first == last else f"neurons {first}-{last}"
        ax.text(x + 1.0, y + 0.45, f"{p.gpu}\n{p.layer} {which}", ha="center", va="center",
                fontsize=10, weight="bold")
    for src, dst in zip(*(ranks.tolist() for ranks in sent.nonzero())):  # row by row
        nbytes = int(sent[src, dst])
        (x0, y0), (x1, y1) = pos[src], pos[dst]
        if topology.link_type(src, dst) == "nvlink":  # inside a server: down left, up right
            dx = 0.55 if y0 > y1 else 1.45
            start = (x0 + dx, y0 + (0 if y0 > y1 else 0.9))
            end = (x1 + dx, y1 + (0.9 if y0 > y1 else 0))
            color = "#2F5597"
            label_at = (x0 + dx + (-0.05 if y0 > y1 else 0.05), (y0 + y1) / 2 + 0.45)
            ha = "right" if y0 > y1 else "left"
        else:  # along a rail, to the next (forward) or previous (backward) stage
            forward = x1 > x0
            start = (x0 + (2.0 if forward else 0), y0 + 0.45)
            end = (x1 + (0 if forward else 2.0), y1 + 0.45)
            color = "#C0392B"
            label_at, ha = ((start[0] + end[0]) / 2, y0 + 0.6), "center"
        ax.add_patch(patches.FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=14,
                                             color=color, lw=1.6))
        ax.text(*label_at, format_bytes(nbytes), fontsize=8, color=color, ha=ha)
    by_type = comparison.traffic[phase].per_link_type(topology)
    ax.text(5, -1.1, f"{phase}: NVLink {format_bytes(by_type['nvlink'])}, rail switches "
            f"{format_bytes(by_type['rail'])}, spine {format_bytes(by_type['spine'])}",
            ha="center", fontsize=10)
    ax.set_xlim(-0.6, 10.6)
    ax.set_ylim(-1.4, 3.8)
    ax.axis("off")
    ax.set_title(f"{phase} pass ({comparison.info['micro_batches']} micro-batches)", fontsize=11)


def _grouped_bars(ax, labels, series, width, fontsize=8):
    """Bars side by side: ``series`` is [(legend label, values per x label, colour)]."""
    for i, (name, values, color) in enumerate(series):
        bars = ax.bar([k + width * i for k in range(len(labels))], values, width=width * 0.95,
                      label=name, color=color)
        ax.bar_label(bars, labels=[format_bytes(v) for v in values], fontsize=fontsize)
    ax.set_xticks([k + width * (len(series) - 1) / 2 for k in range(len(labels))], labels)
    ax.margins(y=0.18)


def attention_bytes_figure(rows: dict, title: str = "bytes moved by one attention layer"):
    """Grouped bars: ``rows`` maps a variant to ``{"forward": bytes, "backward": bytes}``."""
    fig, ax = plt.subplots(figsize=(8, 3.6))
    _grouped_bars(ax, list(rows), [(phase, [r[phase] for r in rows.values()], color)
                                   for phase, color in (("forward", "#4C72B0"),
                                                        ("backward", "#DD8452"))], 0.38)
    ax.set_ylabel("bytes on the wire")
    ax.legend()
    ax.set_title(title, fontsize=11)
    fig.tight_layout()
    return fig


def strategy_figure(rows: list[dict], title: str):
    """The slides' three strategies: the formula's bytes beside what the toy log measured.

    ``rows``: one dict per strategy with ``strategy``, ``formula`` (bytes of the slide's
    tensor), ``measured`` (payload of the matching collective, from the log) and ``wire``
    (all bytes the layer moved, forward and backward).
    """
    fig, ax = plt.subplots(figsize=(9, 3.6))
    keys = (("formula", "slide formula x 4 bytes", "#8172B2"),
            ("measured", "toy log: that collective's tensor", "#55A868"),
            ("wire", "toy log: all bytes on the wire", "#C44E52"))
    _grouped_bars(ax, [r["strategy"] for r in rows],
                  [(label, [r[key] for r in rows], color) for key, label, color in keys], 0.27, 7)
    ax.set_ylabel("bytes")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def memory_figure(rows: list[dict], capacity: float = GPU_MEMORY_GB * 1e9, title: str = ""):
    """Parameter bytes per GPU for each tensor-parallel degree, against a GPU's capacity."""
    fig, ax = plt.subplots(figsize=(7, 3.4))
    bars = ax.bar([str(r["tp"]) for r in rows], [r["bytes"] for r in rows], color="#4C72B0")
    ax.bar_label(bars, labels=[format_bytes(r["bytes"]) for r in rows], fontsize=9)
    ax.axhline(capacity, color="#C0392B", ls="--", label=f"{format_bytes(capacity)} GPU")
    ax.set_xlabel("tensor-parallel degree (GPUs per layer)")
    ax.set_ylabel("parameter bytes per GPU")
    ax.legend()
    ax.set_title(title, fontsize=10)
    ax.margins(y=0.15)
    fig.tight_layout()
    return fig
