"""Chapter 05 exercises: what pipeline depth cannot shrink, where a data-parallel ring runs, where
a CNN layer's line falls, how the bubble follows the batch, and from how many tokens a weight
product is compute-bound, and what the planner predicts for a published 1T run. Every expected answer is computed by the package when the checker
runs, never typed in; a wrong answer gets a hint, never the answer. There is no answer key
to call: the tests compute the answers their own way."""

from __future__ import annotations

from functools import lru_cache

from parlab.exercises.registry import exercise, right, wrong

_MODEL, _GPUS, _TP = "GPT-3 175B", 1024, 8
_PARTS = ("parameters", "gradients", "optimizer_state", "master_weights", "activations")
_RING = (8, 2, 2)  # dp, tp, pp of exercise 05.2, on servers of 8 GPUs


@lru_cache(maxsize=1)
def _by_depth() -> dict:
    """{pp: Breakdown} for tp=8, one sequence per micro-batch, GPT-3 on 1,024 GPUs."""
    from parlab.hybrid import evaluate
    out = {}
    for pp in (8, 16, 32):
        dp = _GPUS // (_TP * pp)
        out[pp] = evaluate(_MODEL, dp, _TP, pp, microbatches=1536 // dp).memory
    return out


def _steadiest_part() -> str:
    depth = _by_depth()
    spread = {p: max(getattr(b, p) for b in depth.values()) /
              min(getattr(b, p) for b in depth.values()) for p in _PARTS}
    return min(spread, key=spread.get)


def _ring_links() -> set:
    from parlab.comm import Mesh
    from parlab.hybrid import cluster, place
    dp, tp, pp = _RING
    gpu_of, topology = place(dp, tp, pp), cluster(dp * tp * pp)
    ring = Mesh(dp=dp, pp=pp, tp=tp).group_ranks("data")[0]
    return {topology.link_type(gpu_of[a], gpu_of[b]) for a, b in zip(ring, ring[1:] + ring[:1])}


@lru_cache(maxsize=1)
def _profiles():
    from parlab.models import SmallCNN, profile
    return profile(SmallCNN(), (3, 32, 32), batch=1)


def _conv4_line() -> int:
    from parlab.hybrid import crossover_batch
    return crossover_batch(_profiles(), "conv4")


@lru_cache(maxsize=1)
def _winner():
    from parlab.hybrid import plan
    return plan(_MODEL, _GPUS, 80)[0]


def _half_batch_bubble() -> float:
    from parlab.hybrid import bubble_fraction
    win = _winner()
    return bubble_fraction(win.pp, win.microbatches // 2)


@exercise("05.1", "GPT-3 175B on 1,024 GPUs, tp=8, 1F1B, one sequence per micro-batch: which "
                  "part of the busiest GPU's memory stays the same whether pp is 8, 16 or 32? "
                  "Answer with a Breakdown part name such as 'parameters'.")
def _steady(answer):
    answer = str(answer).strip().lower().replace(" ", "_")
    if answer not in _PARTS:
        return wrong(f"Answer with one of {list(_PARTS)}.")
    if answer == _steadiest_part():
        return right("The first stage holds pp micro-batches in flight, each with the "
                     "activations of L/pp layers: pp x L/pp = L layers' worth, whatever pp is. "
                     "Only recomputation, smaller micro-batches or more tensor parallelism "
                     "shrink it.")
    depth = _by_depth()
    return wrong(f"{answer.replace('_', ' ')} goes from "
                 f"{getattr(depth[8], answer) / 1e9:.1f} GB at pp=8 to "
                 f"{getattr(depth[32], answer) / 1e9:.1f} GB at pp=32: the first stage holds "
                 f"fewer layers of it. For each other part ask two things: does the first "
                 f"stage hold less of it when it has fewer layers, and more of it when more "
                 f"micro-batches are in flight?")


@exercise("05.2", "dp 8 x tp 2 x pp 2 on 4 servers of 8 GPUs, placed as the planner places "
                  "ranks: which link types does the data-parallel ring of stage 0 (tensor "
                  "index 0) use? Answer a set such as {'nvlink'}.")
def _ring(answer):
    from parlab.comm import LINK_TYPES
    answer = {str(a).strip().lower() for a in (answer if isinstance(answer, (set, list, tuple))
                                                else [answer])}
    if not answer <= set(LINK_TYPES):
        return wrong(f"Use link type names: {list(LINK_TYPES)}.")
    expected = _ring_links()
    if answer == expected:
        return right("Replicas follow each other down the servers at one GPU position, so "
                     "the ring hops along a rail between them; where it moves on to the "
                     "replicas at the next GPU positions, it changes rail on another server: "
                     "through the spine.")
    if answer < expected:
        return wrong("Some hops are missing: follow the ring all the way around, including "
                     "the hop from the last replica back to the first.")
    return wrong("Place the ranks with parlab.hybrid.place(8, 2, 2) and look at "
                 "each neighbour pair of the ring Mesh(dp=8, pp=2, tp=2).group_ranks('data')[0].")


@exercise("05.3", "SmallCNN on 3x32x32 images: up to which batch size does splitting conv4 "
                  "by tensor parallelism (either split: conv4 has as many input channels as "
                  "output channels, so both move the same bytes) move fewer bytes per step "
                  "than data parallelism?")
def _conv4(answer):
    from parlab.hybrid import crossover_batch
    expected, value, profiles = _conv4_line(), int(answer), _profiles()
    if value == expected:
        conv4 = next(p for p in profiles if p.name == "conv4")
        return right(f"conv4's {conv4.params:,} weights cost as much as the activations of a "
                     f"few samples of {conv4.input_elems:,} values: beyond that batch, "
                     f"replicating the layer is cheaper.")
    if value == crossover_batch(profiles, "conv5"):
        return wrong("That is conv5's line; conv4 works on larger images (16 x 16).")
    return wrong("Compare the layer's parameters (what data parallelism sends) with the "
                 "smaller of its input and output per sample (what a split sends per sample).")


@exercise("05.4", "The planner's best layout for GPT-3 175B on 1,024 GPUs of 80 GB: with the "
                  "global batch halved (same degrees, same micro-batch size), what is its "
                  "bubble fraction? A number between 0 and 1.")
def _bubble(answer):
    win, value = _winner(), float(answer)
    expected = _half_batch_bubble()
    if abs(value - expected) < 5e-4:
        return right("Half the batch is half the micro-batches, while the pipeline still "
                     "needs pp-1 slots to fill and drain: the idle share grows.")
    if abs(value - win.bubble_fraction) < 5e-4:
        return wrong("That is the bubble at the full batch. What happens to m?")
    if abs(value - (win.pp - 1) / (win.microbatches // 2)) < 5e-4:
        return wrong("That is the bubble measured against the ideal time; the chapter counts "
                     "idle slots over all slots.")
    return wrong("Read pp and m from the winner, halve m, and count idle slots over all slots.")


_OUT_PROJ = (12288 // 8, 12288)  # GPT-3's output projection on one of 8 tensor ranks (k x m)


def _compute_bound_tokens() -> int:
    """The fewest tokens for which the roofline calls ``_OUT_PROJ``'s product compute-bound."""
    from parlab.models import compute_bound_tokens
    return compute_bound_tokens(*_OUT_PROJ)


@exercise("05.5", "GPT-3's output projection, split over tp=8, is a 1,536 x 12,288 weight. In "
                  "bf16 on an H100 (989 TFLOP/s, 3.35 TB/s), from how many tokens per "
                  "micro-batch does the roofline call its product compute-bound?")
def _roofline(answer):
    from parlab.hardware import H100_BF16_TFLOPS, H100_HBM_TB_PER_S
    expected, value = _compute_bound_tokens(), float(answer)
    ridge = H100_BF16_TFLOPS / H100_HBM_TB_PER_S
    if abs(value - expected) <= max(2, 0.02 * expected):
        k, m = _OUT_PROJ
        return right(f"Below that, the {2 * k * m / 1e6:.1f} MB weight is read for too little "
                     f"arithmetic: the product waits on memory. One sequence of 2,048 tokens "
                     f"is well past it, so a micro-batch of one sequence costs GPT-3 nothing "
                     f"in this model.")
    if abs(value - ridge) < 2:
        return wrong("That is the ridge point itself, in FLOPs per byte. The product's "
                     "intensity with n tokens is less than n: count every matrix it reads or "
                     "writes.")
    return wrong("Write the FLOPs (2 n k m) and the bytes moved (2 bytes for each element of "
                 "the input, the weight and the output) as functions of n, set their ratio "
                 "equal to peak FLOP/s over bytes per second, and solve for n.")


def _trillion():
    """The planner's prediction of Narayanan et al. (2021), Table 1, row 10 (1T)."""
    from parlab.hybrid import NARAYANAN_2021_TABLE_1, predict
    return predict(NARAYANAN_2021_TABLE_1[-1])


@exercise("05.6", "Narayanan et al. (2021), Table 1, row 10: a 1T GPT on 3,072 A100s (312 "
                  "TFLOP/s peak), tp 8 x pp 64 x dp 6, micro-batches of one sequence, 512 per "
                  "replica, plain 1F1B, full recomputation. The paper measured 163 TFLOP/s per "
                  "GPU. Priced by its kernels, the planner's compute alone (no bubble, no "
                  "message) does the paper's work at the TFLOP/s per GPU the chapter gives; "
                  "what TFLOP/s per GPU does it predict for the whole step?")
def _trillion_tflops(answer):
    from parlab.experiments import compute_ceiling
    p, value = _trillion(), float(answer)
    expected, ceiling = p.tflops_per_gpu, compute_ceiling()
    # the bubble by hand lands within 10 %: the messages take the rest
    if abs(value - expected) <= 0.10 * expected:
        return right(f"The pipeline's bubble ({p.layout.bubble_fraction:.0%} of the step) and "
                     f"the tensor and pipeline messages come off the {ceiling:.0f} TFLOP/s "
                     f"the compute alone would reach: the planner predicts "
                     f"{expected:.0f}, the next cell shows it beside the paper's 163.")
    if abs(value - p.run.tflops_per_gpu) <= 2:
        return wrong("That is the paper's measurement. The planner's compute speed is its own: "
                     "start from it.")
    if abs(value - ceiling) <= 2:
        return wrong("That is compute alone. What else does a step of 64 stages and 512 "
                     "micro-batches pay for?")
    return wrong("Start from the compute alone, the speed of the work the paper counts, "
                 "then take off the idle share of a 1F1B pipeline of 64 stages and 512 "
                 "micro-batches, and a little for the messages.")
