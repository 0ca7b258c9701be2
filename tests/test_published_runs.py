"""The planner against published training runs (Narayanan et al. 2021, Table 1), and the GPU
named by its datasheet (``gpu=``): errors, and A100 against H100 from the datasheets' numbers.

One tolerance for every row (issue 31): the predicted step time within 15 % of the one the
published TFLOP/s imply. A row the model misses is an expected failure (strict: it fails the
suite if it starts to pass, so the mark is removed then) with its reason written below.
"""

import pytest
from torch import nn

from parlab import memory
from parlab.hardware import GPUS
from parlab.hybrid import (
    Assumptions, NARAYANAN_2021_TABLE_1, cluster, evaluate, paper_flops, plan, plan_published,
    predict
)

TIME_TOLERANCE = 0.15

#: What the step model lacks, shared by every row. The compute is priced by its kernels
#: (compute_model="kernels": weight and score products at the A100's measured best matmul
#: speed, 271.2 TFLOP/s, x the roofline of their shapes; memory-bound ops at 2.039 TB/s),
#: and every row comes out fast, by 21 % to 27 % (the flat 0.4 of peak had them slow by
#: +10 % to +52 %, growing with the model): each kernel is priced at its ceiling, and what
#: real kernels lose below it (shapes that fill fewer tiles than the best one, memory
#: kernels short of the peak bandwidth, launches, collectives short of the link) is not
#: modelled. Nothing is fitted to close that gap.
COMPUTE = ("compute priced by its kernels at their ceilings (A100 best-shape matmul 271.2 "
           "TFLOP/s, datasheet HBM): the step comes out too fast; what real kernels lose "
           "below those ceilings is not modelled (this run: {pct} % of peak end to end)")


def _reason(run) -> str:
    return COMPUTE.format(pct=run.percent_of_peak)


#: The rows the model misses by more than the tolerance today (see COMPUTE): all ten.
MISSES = {run.source for run in NARAYANAN_2021_TABLE_1}


def _params(runs):
    return [pytest.param(run, id=run.source.split(", ")[-1].replace(" ", ""),
                         marks=[pytest.mark.xfail(strict=True, reason=_reason(run))]
                         if run.source in MISSES else [])
            for run in runs]


@pytest.mark.parametrize("run", _params(NARAYANAN_2021_TABLE_1))
def test_step_time_within_tolerance(run):
    prediction = predict(run)
    assert abs(prediction.time_error) <= TIME_TOLERANCE, (
        f"{run.source}: predicted {prediction.tflops_per_gpu:.0f} TFLOP/s per GPU, published "
        f"{run.tflops_per_gpu}; step {prediction.step_time_s:.1f} s against "
        f"{run.step_time_s:.1f} s ({prediction.time_error:+.0%})")


@pytest.mark.parametrize("run", NARAYANAN_2021_TABLE_1, ids=lambda r: r.source[-6:])
def test_table_transcribed_consistently(run):
    """The typed row agrees with itself: the paper's parameter formula (section 5.1,
    P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h))) gives its parameter column, TFLOP/s x GPUs
    its aggregate column and TFLOP/s / 312 (A100 bf16 peak) its percentage."""
    l, h, v, s = run.layers, run.hidden, 51_200, 2048
    params = 12 * l * h ** 2 * (1 + 13 / (12 * h) + (v + s) / (12 * l * h))
    assert abs(params / 1e9 - run.params_billion) <= 0.05 + 1e-9   # printed to 0.1 billion
    assert run.tflops_per_gpu * run.gpus / 1000 == pytest.approx(run.aggregate_pflops, rel=0.01)
    assert abs(100 * run.tflops_per_gpu / 312 - run.percent_of_peak) < 1
    assert run.gpus % (run.tp * run.pp) == 0 and run.batch % run.dp == 0
    assert run.hidden % run.heads == 0 and run.layers % run.pp == 0


def test_paper_flops_by_hand():
    row1 = NARAYANAN_2021_TABLE_1[0]   # 1.7B: B 512, l 24, h 2304
    by_hand = 96 * 512 * 2048 * 24 * 2304 ** 2 * (1 + 2048 / 13824 + 51200 / 884736)
    assert paper_flops(row1) == pytest.approx(by_hand)
    # 137 TFLOP/s on 32 GPUs: the iteration the published number implies
    assert row1.step_time_s == pytest.approx(by_hand / (137e12 * 32))


def test_prediction_uses_the_published_layout():
    run = NARAYANAN_2021_TABLE_1[-1]   # 1T: tp 8, pp 64, 3072 GPUs
    lay = predict(run).layout
    assert (lay.dp, lay.tp, lay.pp) == (6, 8, 64) and lay.recompute == "full"
    assert (lay.micro_batch, lay.microbatches) == (1, 512)   # MBS 1: 3072 / 6 micro-batches
    assert lay.assumptions.virtual_stages == 1 and not lay.assumptions.overlap_data_parallel
    assert lay.assumptions.gpu == "A100-80GB" and lay.fits
    assert lay.topology.links["rail"].bandwidth == pytest.approx(200e9 / 8)   # HDR, 25 GB/s
    assert lay.topology.links["nvlink"].bandwidth == pytest.approx(300e9)     # NVLink3 per way


# --- the gpu keyword -----------------------------------------------------------------------

def test_unknown_gpu_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown gpu 'V100'.*H100-80GB.*A100-80GB"):
        Assumptions(gpu="V100")
    with pytest.raises(ValueError, match="unknown gpu"):
        plan("GPT-2 small", 8, gpu="B200")
    with pytest.raises(ValueError, match="unknown gpu"):
        memory.estimate("GPT-2 small", (8, 1024), gpu="a100")


def test_gpu_and_memory_that_disagree_are_an_error():
    with pytest.raises(ValueError, match="gpu='A100-80GB' has 80 GB but gpu_memory_gb=40"):
        evaluate("GPT-2 small", 1, 1, 1, 1, 40, gpu="A100-80GB", global_batch=8)
    with pytest.raises(ValueError, match="gpu_memory_gb=40"):
        plan("GPT-2 small", 8, 40, gpu="A100-80GB")
    with pytest.raises(ValueError, match="gpu_memory_gb=40"):
        memory.estimate("GPT-2 small", (8, 1024), gpu="A100-80GB", gpu_memory_gb=40)
    # agreeing is fine, and the capacity is the datasheet's 80 GB
    assert memory.estimate("GPT-2 small", (8, 1024), gpu="A100-80GB",
                           gpu_memory_gb=80).capacity == 80 * 10 ** 9
    assert memory.estimate("GPT-2 small", (8, 1024), gpu="A100-80GB").capacity == 80 * 10 ** 9
    assert memory.estimate("GPT-2 small", (8, 1024), gpu_memory_gb=40).capacity == 40 * 10 ** 9


def test_min_gpus_and_measure_take_a_gpu_by_name():
    """The other two calculators take the same keyword: the named GPU's capacity is the limit."""
    by_name = memory.min_gpus("GPT-3 175B", (8, 2048), gpu="A100-80GB")
    by_size = memory.min_gpus("GPT-3 175B", (8, 2048), gpu_memory_gb=80)
    half = memory.min_gpus("GPT-3 175B", (8, 2048), gpu_memory_gb=40)
    assert by_name.gpus == by_size.gpus < half.gpus
    assert by_name.breakdown.capacity == 80 * 10 ** 9
    with pytest.raises(ValueError, match="gpu_memory_gb=40"):
        memory.min_gpus("GPT-3 175B", (8, 2048), gpu="A100-80GB", gpu_memory_gb=40)
    measured = memory.measure(nn.Linear(4, 2), (3, 4), "sgd", gpu="A100-80GB")
    assert measured.capacity == 80 * 10 ** 9
    with pytest.raises(ValueError, match="unknown gpu"):
        memory.measure(nn.Linear(4, 2), (3, 4), "sgd", gpu="V100")


def test_a100_is_slower_by_the_datasheets_ratio():
    """One GPU, micro-batches large enough to be compute-bound on both (2048 tokens, above
    either ridge: 989/3.35 = 295 and 312/2.039 = 153 FLOPs per byte): the step is pure
    compute, so A100 over H100 is the ratio of the dense bf16 peaks, 989 / 312."""
    job = dict(global_batch=2, seq=1024)
    h100 = evaluate("GPT-2 small", 1, 1, 1, 1, gpu="H100-80GB", **job)
    a100 = evaluate("GPT-2 small", 1, 1, 1, 1, assumptions=Assumptions(gpu="A100-80GB", **job))
    assert h100.efficiency == a100.efficiency == 1
    assert a100.step_time_s / h100.step_time_s == pytest.approx(989 / 312)
    assert a100.assumptions.gpu_tflops == 312 and a100.assumptions.gpu_tb_per_s == 2.039


def test_a100_tensor_all_reduce_rides_its_nvlink():
    """tp = 8 in one server: the tensor part is ring all-reduces over NVLink, whose
    bandwidth term scales as 1 / NVLink speed: 450 / 300 GB/s per direction (the latency
    term, 1 us per step, is the same on both and small at these sizes)."""
    job = dict(global_batch=8, seq=2048)
    h100 = evaluate("GPT-3 6.7B", 1, 8, 1, 1, **job)
    a100 = evaluate("GPT-3 6.7B", 1, 8, 1, 1, gpu="A100-80GB", **job)
    assert a100.times["tensor"] / h100.times["tensor"] == pytest.approx(450 / 300, rel=0.01)


def test_cluster_takes_the_gpus_nvlink_and_the_nic_speed():
    topo = cluster(16, 8, 200, gpu="A100-80GB")
    assert topo.links["nvlink"].bandwidth == pytest.approx(GPUS["A100-80GB"].nvlink_gb_per_s * 1e9)
    assert topo.links["rail"].bandwidth == pytest.approx(25e9)
    assert cluster(16).links["nvlink"].bandwidth == pytest.approx(450e9)


def test_attention_flops_add_twelve_s_d_per_token_and_layer():
    """attention_flops=True adds 3 x 4 s d FLOPs per token and layer (QK^T and the weighted
    sum of V, forward and their two gradients) to the compute: by hand for GPT-2 small."""
    job = dict(global_batch=2, seq=1024)
    off = evaluate("GPT-2 small", 1, 1, 1, 1, **job)
    on = evaluate("GPT-2 small", 1, 1, 1, 1, attention_flops=True, **job)
    extra = 12 * 1024 * 768 * 12 * (2 * 1024)        # 12 s d x layers x tokens
    assert on.times["compute"] - off.times["compute"] == pytest.approx(
        extra / (989e12 * 0.4))
    with pytest.raises(TypeError, match="attention_flops must be True or False"):
        Assumptions(attention_flops="yes")


@pytest.mark.parametrize("run", NARAYANAN_2021_TABLE_1, ids=lambda r: r.source[-6:])
def test_planner_counts_the_papers_flops(run):
    """With attention_flops and full recompute, and the flat compute model, the planner's
    compute and recompute parts are the paper's F (section 5.1) at mfu x peak: F / ((compute
    + recompute) x GPUs) is 0.4 x 312 TFLOP/s (within 0.5 %: the paper counts the output
    layer in all four passes, the planner's recompute repeats only the blocks). So the work
    counted is the paper's; the kernel model changes only the speed it is done at."""
    lay = predict(run, compute_model="flat").layout
    seconds = lay.times["compute"] + lay.times["recompute"]
    assert paper_flops(run) / (seconds * run.gpus) == pytest.approx(0.4 * 312e12, rel=0.005)


@pytest.mark.parametrize("run", NARAYANAN_2021_TABLE_1, ids=lambda r: r.source[-6:])
def test_rows_follow_the_papers_run_script(run):
    """The settings copied from examples/sc21/run_table_1.sh (NVIDIA/Megatron-LM): v = layers
    / (pp x layers per virtual stage), the script's MBS, torch DDP exactly for rows 1-4."""
    script = {"row 1": (16, None, "torch"), "row 2": (16, None, "torch"),
              "row 3": (16, None, "torch"), "row 4": (8, None, "torch"),
              "row 5": (4, None, "local"), "row 6": (2, 5, "local"), "row 7": (2, 5, "local"),
              "row 8": (1, 3, "local"), "row 9": (1, 1, "local"), "row 10": (1, None, "local")}
    mbs, per_virtual, ddp = script[run.source.split(", ")[-1]]
    v = 1 if per_virtual is None else run.layers // (run.pp * per_virtual)
    assert (run.micro_batch, run.virtual_stages, run.ddp) == (mbs, v, ddp)
    lay = predict(run).layout
    m = run.batch // (run.dp * mbs)
    assert lay.microbatches == m and m % run.pp == 0 or run.virtual_stages == 1
    assert lay.assumptions.overlap_data_parallel == (ddp == "torch")


def test_interleaving_helps_the_pipelined_rows():
    """Rows 6-9 as run (interleaved) against the same rows priced as plain 1F1B: faster."""
    for run in NARAYANAN_2021_TABLE_1[5:9]:
        assert predict(run).step_time_s < predict(run, virtual_stages=1).step_time_s


def test_exercise_05_6_by_hand():
    """The 1T row by hand: the paper's work at the compute's own speed (no bubble, no
    message), stretched by 1F1B's bubble of 63 / (512 + 63); the messages, 6 % of the
    predicted step, are left out: within the checker's 10 %."""
    from parlab.exercises import check
    from parlab.experiments import compute_ceiling
    ceiling = compute_ceiling()
    assert 0.75 * 312 < ceiling < 271.2     # below the matmul ceiling: the memory-bound ops
    by_hand = ceiling * 512 / (512 + 63)
    assert check("05.6", round(by_hand)).ok is True
    assert check("05.6", 163).ok is False            # the paper's measurement
    assert check("05.6", round(ceiling)).ok is False  # compute alone
    assert check("05.6", 125).ok is False            # the flat model's compute alone
    answer = f"{predict(NARAYANAN_2021_TABLE_1[-1]).tflops_per_gpu:.0f}"
    assert all(answer not in check("05.6", x).message for x in (60, 125, 163))


def test_chapter_table_and_figure():
    from parlab.experiments import published_rows, published_table
    from parlab.experiments.ch05_published import compute_ceiling
    rows = published_rows()
    assert [r.row for r in rows] == list(range(1, 11))
    assert [r.within for r in rows] == [r.prediction.run.source not in MISSES for r in rows]
    text = published_table(rows)
    assert "tp 8 x pp 64 x dp 6, b 1, v 1" in text and text.count("(miss)") == len(MISSES)
    prediction = rows[-1].prediction
    seconds = prediction.layout.times["compute"] + prediction.layout.times["recompute"]
    assert compute_ceiling() == pytest.approx(
        paper_flops(prediction.run) / (seconds * 3072) / 1e12)


@pytest.mark.parametrize("row", [1, 4, 10])
def test_the_planners_own_layout_is_never_slower_than_the_published_one(row):
    """Issue 31, item 4: the search covers the published layout, so its fastest can only tie
    or beat it under the same model; where the 1T run's layout is also the planner's (the
    only one that fits its memory with 6 replicas), the two are the same layout."""
    run = NARAYANAN_2021_TABLE_1[row - 1]
    published, best = plan_published(run)
    assert (published.dp, published.tp, published.pp) == (run.dp, run.tp, run.pp)
    assert published.fits and best.fits
    assert best.step_time_s <= published.step_time_s * (1 + 1e-12)
    if row == 10:
        assert (best.dp, best.tp, best.pp, best.recompute) == (6, 8, 64, "full")
    else:  # these fit without recomputing: the planner skips the extra forward pass
        assert best.recompute in (None, "selective") and published.recompute == "full"
        assert best.step_time_s < published.step_time_s
