"""The memory calculator: its formulas, its checks, and its agreement with a measured step."""
import math

import pytest

from parlab import memory
from parlab.units import GB
from parlab.models import GPT3_175B, TINY, BookMLP, count_parameters

SMALL_TRANSFORMER = TINY.replace(name="small", d_model=64, n_layers=3, n_heads=4, d_ff=256,
                                 vocab=256, context=64)
CASES = [(BookMLP((64, 256, 256, 10)), (32,)), (SMALL_TRANSFORMER, (4, 64))]


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("model, shape", CASES, ids=["mlp", "transformer"])
def test_prediction_matches_measurement_within_5_percent(model, shape, optimizer):
    predicted = memory.estimate(model, shape, optimizer, "fp32")
    measured = memory.measure(model, shape, optimizer, "fp32")
    error = abs(predicted.total - measured.total) / measured.total
    print(f"{type(model).__name__} {optimizer}: predicted {predicted.total} B, measured "
          f"{measured.total} B, error {100 * error:.4f} %")
    assert error < 0.05
    for part in ("parameters", "gradients", "activations"):
        assert getattr(measured, part) > 0
        assert getattr(predicted, part) == pytest.approx(getattr(measured, part), rel=0.05)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_and_momentum_are_measured_too(precision):
    predicted = memory.estimate(TINY, (2, 16), "momentum", precision)
    measured = memory.measure(TINY, (2, 16), "momentum", precision)
    assert measured.master_weights == 2 * measured.parameters > 0
    assert measured.optimizer_state == measured.master_weights
    assert predicted.total == pytest.approx(measured.total, rel=0.05)


def test_micro_batches_in_flight_are_measured():
    one = memory.measure(TINY, (4, 16), "sgd", microbatches=2)
    gpipe = memory.measure(TINY, (4, 16), "sgd", microbatches=2, schedule="gpipe")
    assert gpipe.activations == pytest.approx(2 * one.activations, rel=0.01)
    assert memory.estimate(TINY, (4, 16), "sgd", microbatches=2,
                           schedule="gpipe").activations == pytest.approx(gpipe.activations,
                                                                          rel=0.05)


def test_bytes_per_parameter_follow_precision_and_optimizer():
    n = count_parameters(TINY)["total"]
    per_param = {("fp32", "sgd"): 8, ("fp32", "momentum"): 12, ("fp32", "adam"): 16,
                 ("bf16", "adam"): 16, ("fp16", "sgd"): 8}
    for (precision, optimizer), expected in per_param.items():
        b = memory.estimate(TINY, (1, 16), optimizer, precision)
        assert b.total - b.activations == expected * n


def test_activations_follow_the_formula_and_split_over_stages():
    per_layer = memory.activations_per_layer(TINY, 2, 16)
    assert list(per_layer)[0] == "embedding" and list(per_layer)[-1] == "head"
    assert len(per_layer) == TINY.n_layers + 2
    whole = memory.activation_bytes(TINY, 2, 16)
    assert whole == sum(per_layer.values())
    stages = [memory.activation_bytes(TINY, 2, 16, stage=k, pp=2) for k in range(2)]
    assert sum(stages) == whole
    # doubling the sequence more than doubles a block: attention scores grow with seq^2
    assert memory.activations_per_layer(TINY, 2, 16)["block 1"] > 2 * memory.activations_per_layer(
        TINY, 2, 8)["block 1"]


def test_a_split_divides_the_model_state():
    one = memory.estimate(GPT3_175B, (8, 2048), "adam", "bf16")
    split = memory.estimate(GPT3_175B, (8, 2048), "adam", "bf16", tp=8, pp=16, microbatches=8)
    assert not one.fits and split.fits
    assert split.parameters == pytest.approx(one.parameters / 128, rel=0.15)
    total_params = count_parameters(GPT3_175B)["total"]
    assert one.parameters == 2 * total_params and one.master_weights == 4 * total_params


def test_min_gpus_for_gpt3():
    plan = memory.min_gpus(GPT3_175B, (8, 2048), "adam", "bf16", gpu_memory_gb=80)
    state = 16 * count_parameters(GPT3_175B)["total"]
    assert plan.gpus >= math.ceil(state / (80 * GB)) == 35
    assert plan.gpus == plan.dp * plan.tp * plan.pp and plan.breakdown.fits
    assert plan.ideal <= plan.gpus
    smaller = memory.estimate(GPT3_175B, (8, 2048), "adam", "bf16", dp=plan.dp, tp=plan.tp,
                              pp=plan.pp - 1)
    assert not smaller.fits  # one stage fewer no longer fits
    assert memory.min_gpus(TINY, (1, 16)).gpus == 1


def test_table_lists_parts_and_capacity():
    text = memory.estimate(TINY, (2, 16)).table()
    for word in ("parameters", "gradients", "optimizer state", "activations", "total", "80 GB"):
        assert word in text
    assert "does not fit" in memory.estimate(GPT3_175B, (1, 2048)).table()


@pytest.mark.parametrize("kwargs, message", [
    (dict(input_shape=(-1, 16)), "batch must be a positive integer, got -1"),
    (dict(precision="fp8"), "unknown precision 'fp8'"),
    (dict(optimizer="lion"), "unknown optimizer 'lion'"),
    (dict(tp=3), "tp=3 must divide n_heads=4"),
    (dict(pp=3), "pp=3 stages for 2 layers"),
    (dict(input_shape=(2, 99)), "exceeds tiny's context of 16"),
    (dict(input_shape=(3, 16), dp=2), "does not split"),
    (dict(schedule="zigzag"), "unknown schedule"),
    (dict(gpu_memory_gb=0), "gpu_memory_gb must be positive"),
])
def test_bad_input_is_a_clear_error(kwargs, message):
    args = dict(model=TINY, input_shape=(2, 16)) | kwargs
    with pytest.raises(ValueError, match=message):
        memory.estimate(**args)


def test_measure_refuses_what_one_process_cannot_run():
    with pytest.raises(ValueError, match="tp and pp must be 1"):
        memory.measure(TINY, (2, 16), tp=2)
    with pytest.raises(ValueError, match="use tp=1"):
        memory.estimate(BookMLP((4, 2)), (2,), tp=2)
    with pytest.raises(TypeError, match="TransformerConfig or a LlamaConfig .or a config name"):
        memory.estimate(42, (2,))


def test_exercises_01_1_and_01_2_accept_the_right_answer_and_never_print_it():
    from parlab.exercises import check

    # 01.1, float by float: A1 keeps 4 samples of x (4) and targets (2), z (5+5+2), y (5+5;
    # the linear output's y is its z) and E (5+5+2); W and b (67 numbers) and their local
    # gradients, remote gradients and adjustments; one learning rate per layer
    a1 = 4 * (4 * (4 + 2 + 12 + 10 + 12) + 4 * 67 + 3)
    alone = 4 * (8 * (4 + 2 + 12 + 10 + 12) + 3 * 67 + 3)
    assert check("01.1", a1).ok is True
    state = 16 * count_parameters(GPT3_175B)["total"]
    gpus = math.ceil(state / (80 * GB))
    assert check("01.2", gpus).ok is True
    for exercise_id, wrong, answer in (("01.1", alone, str(a1)), ("01.1", alone + 268, str(a1)),
                                       ("01.1", 7, str(a1)),
                                       ("01.2", gpus - 1, str(gpus)), ("01.2", 5, str(gpus))):
        verdict = check(exercise_id, wrong)
        assert verdict.ok is False and answer not in verdict.message


def test_chapter_figures_and_calculator_widget_draw(tmp_path, capsys):
    import matplotlib
    matplotlib.use("Agg", force=True)
    from parlab.tools import figures
    from parlab.viz.widgets.memory import draw_memory

    names = [n for n in figures.registry() if n.startswith(("fig-8-01", "fig-01"))]
    assert {"fig-8-01-gpu-memory", "fig-01-memory-bar"} <= set(names)
    paths = figures.render(names, tmp_path, progress=False)
    assert all(p.stat().st_size > 5000 for p in paths)
    fig = draw_memory("GPT-2 small", "bf16", "adam", 8, 1024, 80, 2, 2)
    assert fig is not None and "at least 1 GPU (" in capsys.readouterr().out
    assert draw_memory("GPT-2 XL", "fp32", "adam", 8, 1024, 80, 8, 1) is None
    assert "tp=8 must divide n_heads=25" in capsys.readouterr().out


def test_explorers_offer_the_hf_presets(capsys):
    """The calculator and the planner list the Llama/Mistral presets and draw them."""
    import matplotlib
    matplotlib.use("Agg", force=True)
    from parlab.models import DENSE_HF_CONFIGS
    from parlab.viz.widgets.memory import draw_memory, memory_explorer
    from parlab.viz.widgets.planner import draw_plan, planner_explorer

    for make in (memory_explorer, planner_explorer):
        assert set(DENSE_HF_CONFIGS) <= set(make().controls["model"].options), make.__name__
    # Llama-3-8B, bf16 + Adam: 8.03 B parameters x 16 B over tp 2 x pp 2 is about 32 GB of
    # model states per GPU, so the table's parameters row is 2 B x 8.03 B / 4 = 4.02 GB
    assert draw_memory("Llama-3-8B", "bf16", "adam", 8, 8192, 80, 2, 2) is not None
    out = capsys.readouterr().out
    assert "Llama-3-8B" in out and "4.02 GB" in out and "at least" in out
    assert draw_plan("Llama-3-8B", 64, 80, 400, 450) is not None
    assert "Llama-3-8B on 64 GPUs" in capsys.readouterr().out


def test_bytes_per_parameter_table_matches_the_dtype_sizes():
    """Hand-counted: fp32 weight + fp32 gradient (+ 1 or 2 fp32 optimizer values); mixed
    precision keeps 2-byte weights and gradients, a 4-byte master copy and Adam's 2 x 4 B."""
    rows = memory.bytes_per_parameter_table().splitlines()
    assert rows[1].split()[-5:] == ["4", "4", "-", "0", "8"]
    assert rows[2].split()[-5:] == ["4", "4", "-", "8", "16"]
    assert rows[3].split()[-5:] == ["2", "2", "4", "8", "16"]
    momentum = memory.bytes_per_parameter_table((("fp16", "momentum"),)).splitlines()[1]
    assert momentum.split()[-5:] == ["2", "2", "4", "4", "12"]
