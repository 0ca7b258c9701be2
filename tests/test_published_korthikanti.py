"""The planner against Korthikanti et al. (2022), "Reducing Activation Recomputation in Large
Transformer Models", Tables 3 and 5: end-to-end iteration times of the 22B, 175B, 530B and
1T GPTs on A100-80GB, with full recomputation and with sequence parallelism + selective
recomputation ("present work").

One tolerance for every row (issue 31): the predicted iteration time within 15 % of the
published one. A row the model misses is an expected failure (strict: it fails the suite if
it starts to pass, so the mark is removed then) with its reason written below.
"""

import pytest

from parlab.hybrid import KORTHIKANTI_2022, model_flops, predict_iteration

TIME_TOLERANCE = 0.15
PEAK = 312e12                                   # A100 dense bf16, the paper's footnote 5

#: What the step model lacks, shared by every row. Compute is priced by its kernels
#: (compute_model="kernels", as parlab.hybrid.predict does), and every row comes out fast,
#: by 17 % to 29 % (the flat 0.4 of peak had them slow, +16 % on 22B to +65 % on 1T): the
#: kernels run at their ceilings (the A100's best-shape matmul speed, the datasheet's memory
#: bandwidth) and what real runs lose below them is not modelled, nor fitted.
COMPUTE = ("compute priced by its kernels at their ceilings (A100 best-shape matmul 271.2 "
           "TFLOP/s, datasheet HBM): the iteration comes out too fast (this run: {mfu} % of "
           "peak in model FLOPs end to end, Table 5)")
#: Section 6.2: Megatron's backward overlaps the tensor-parallel all-reduce with the weight
#: gradients' computation; the planner charges every tensor all-reduce in full (modelling
#: the overlap would make the prediction faster still).
TENSOR = "tensor-parallel all-reduces never overlapped (the paper overlaps them in backward)"


def _reason(run) -> str:
    return "; ".join([COMPUTE.format(mfu=run.mfu), TENSOR])


#: The (model, method) pairs the model misses by more than the tolerance today: all eight.
MISSES = {(run.name, method) for run in KORTHIKANTI_2022 for method in ("full", "present")}


def _params():
    return [pytest.param(run, method, id=f"{run.name}-{method}",
                         marks=[pytest.mark.xfail(strict=True, reason=_reason(run))]
                         if (run.name, method) in MISSES else [])
            for run in KORTHIKANTI_2022 for method in ("full", "present")]


@pytest.mark.parametrize("run, method", _params())
def test_iteration_time_within_tolerance(run, method):
    p = predict_iteration(run, method)
    assert abs(p.time_error) <= TIME_TOLERANCE, (
        f"{run.source} ({method}): predicted {p.step_time_s:.2f} s, published "
        f"{p.published_s} s ({p.time_error:+.0%})")


@pytest.mark.parametrize("run", KORTHIKANTI_2022, ids=lambda r: r.name)
def test_tables_transcribed_consistently(run):
    """The typed row agrees with itself: Table 5's throughput increase is full / present - 1
    (printed to 0.1 %), its MFU and HFU are equation 7's and equation 8's FLOPs over the
    present-work time, the GPUs and the 312 TFLOP/s peak (printed to 0.1 %; equation 8 is
    72 B L s h^2 (1 + s/(3h) + v/(12 h L))); Table 3: no data parallelism, tp pp = GPUs."""
    b, l, s, h, v = run.batch, run.layers, 2048, run.hidden, 51_200
    assert 100 * (run.full_recompute_s / run.present_work_s - 1) == pytest.approx(
        run.throughput_increase, abs=0.1)
    eq7 = 72 * b * l * s * h ** 2 * (1 + s / (6 * h) + v / (12 * h * l))
    eq8 = 72 * b * l * s * h ** 2 * (1 + s / (3 * h) + v / (12 * h * l))
    assert model_flops(run) == pytest.approx(eq7)
    seconds_at_peak = run.present_work_s * run.gpus * PEAK
    assert 100 * eq7 / seconds_at_peak == pytest.approx(run.mfu, abs=0.16)
    assert 100 * eq8 / seconds_at_peak == pytest.approx(run.hfu, abs=0.16)
    assert run.gpus == run.tp * run.pp and run.dp == 1
    assert run.batch % run.micro_batch == 0 and run.hidden % run.heads == 0
    assert run.layers % (run.pp * run.virtual_stages) == 0


def test_prediction_uses_the_published_layout():
    """175B (Table 3): tp 8 x pp 8 on 64 GPUs, batch 64 of micro-batch 1, three chunks per
    rank (section 6); full = full recompute without SP, present = selective + SP."""
    run = KORTHIKANTI_2022[1]
    full, present = (predict_iteration(run, m).layout for m in ("full", "present"))
    for lay in (full, present):
        assert (lay.dp, lay.tp, lay.pp) == (1, 8, 8)
        assert (lay.micro_batch, lay.microbatches) == (1, 64)
        assert lay.assumptions.virtual_stages == 3 and lay.assumptions.gpu == "A100-80GB"
        assert lay.fits and lay.times["data"] == 0
    assert full.recompute == "full" and not full.assumptions.sequence_parallel
    assert present.recompute == "selective" and present.assumptions.sequence_parallel
    with pytest.raises(ValueError, match="method must be one of"):
        predict_iteration(run, "selective")


@pytest.mark.parametrize("run", KORTHIKANTI_2022, ids=lambda r: r.name)
def test_planner_compute_is_the_papers_model_flops(run):
    """With the flat compute model, the planner's compute part (attention FLOPs on, recompute
    apart) is equation 7's model FLOPs at 0.4 x 312 TFLOP/s on every GPU (within 0.5 %: the
    planner counts the position embedding's gradient, which equation 7 leaves out): the work
    counted is the paper's; the kernel model changes only the speed."""
    lay = predict_iteration(run, "present", compute_model="flat").layout
    assert model_flops(run) / (lay.times["compute"] * run.gpus) == pytest.approx(
        0.4 * PEAK, rel=0.005)


@pytest.mark.parametrize("run", KORTHIKANTI_2022, ids=lambda r: r.name)
def test_present_work_is_faster_by_about_the_papers_factor(run):
    """The paper's claim (section 6.3): sequence parallelism + selective recompute is faster
    than full recompute on every model, by 29.0 % to 32.1 % in throughput. The planner agrees
    in sign for every model, and its speed-up (full / present time) is within the one 15 %
    time tolerance of the published one: the work recomputation adds is counted right even
    where the absolute speed is not (printed with -s)."""
    full, present = (predict_iteration(run, m) for m in ("full", "present"))
    assert present.step_time_s < full.step_time_s
    predicted = full.step_time_s / present.step_time_s
    published = run.full_recompute_s / run.present_work_s
    print(f"{run.name}: speed-up predicted {predicted - 1:+.1%}, published {published - 1:+.1%}")
    assert predicted / published - 1 == pytest.approx(0, abs=TIME_TOLERANCE)


def test_22b_full_recompute_by_hand():
    """The 22B row (tp 8, no pipeline, one micro-batch of 4, 48 layers) with full recompute,
    by hand: per layer, the weight products 3 x 2 n 12 h^2 / t FLOPs at the A100's 271.2
    TFLOP/s (compute-bound at n = 8192 tokens), the score products 3 x 4 n s h / t at their
    roofline (d_head 96: s d / (s + 2 d) FLOPs per byte over the ridge 271.2 / 2.039), the
    memory ops (22 h + 4 h/t + 16 h/t + 9 a s/t) bytes per token forward and (34 h + 4 h/t
    + 24 h/t + 11 a s/t) backward at 2.039 TB/s; the output layer 3 x 2 n h V / t. The
    recompute repeats a layer's forward; tensor: a ring all-reduce of b s h bf16 values
    moves 2 (t-1)/t of them per GPU, 4 per layer forward and backward plus 2 repeated by
    the recompute, over NVLink's 300 GB/s, 1 us per ring step."""
    run = KORTHIKANTI_2022[0]
    lay = predict_iteration(run, "full").layout
    h, a, t, s, n, L, V = 6144, 64, 8, 2048, 4 * 2048, 48, 51200
    gemm = 2 * n * 12 * h ** 2 / t / 271.2e12
    scores = 4 * n * s * h / t / (271.2e12 * (s * 96 / (s + 192)) / (271.2 / 2.039))
    forward = n * (22 * h + 4 * h / t + 16 * h / t + 9 * a * s / t) / 2.039e12
    backward = n * (34 * h + 4 * h / t + 24 * h / t + 11 * a * s / t) / 2.039e12
    head = 3 * 2 * n * h * V / t / 271.2e12
    compute = L * (3 * (gemm + scores) + forward + backward) + head
    assert lay.times["compute"] == pytest.approx(compute, rel=1e-9)
    assert lay.times["recompute"] == pytest.approx(L * (gemm + scores + forward), rel=1e-9)
    message = 4 * 2048 * 6144 * 2                                  # b s h bf16 bytes
    per_all_reduce = 2 * 7 / 8 * message / 300e9 + 2 * 7 * 1e-6
    assert lay.times["tensor"] == pytest.approx(6 * 48 * per_all_reduce, rel=0.02)
    assert lay.times["bubble"] == lay.times["pipeline"] == 0


def test_chapter_table():
    from parlab.experiments.ch05_published import korthikanti_rows, korthikanti_table
    rows = korthikanti_rows()
    assert [r.name for r in rows] == ["22B", "175B", "530B", "1T"]
    text = korthikanti_table(rows)
    assert "tp 8 x pp 35, b 1, v 3" in text and text.count("(miss)") == len(MISSES)
    assert "+29% / " in text                      # 22B: 1.42 / 1.10 - 1, published
