"""The planner on Llama-style models and Hugging Face configs, with recomputation on or off
(issue 16, point 4): "Llama-3-8B, or your config.json, on N GPUs of M GB"."""
import json
import time

import pytest

from parlab import memory
from parlab.hybrid import Assumptions, evaluate, plan, search, table, TIME_PARTS
from parlab.models import HF_PRESETS, count_parameters, get_config
from parlab.units import GB

JOB = dict(global_batch=512, seq=8192)          # 4 M tokens per step
BOTH = dict(JOB, recompute=(None, "full"))


@pytest.fixture(scope="module")
def llama():
    start = time.perf_counter()
    found = search("Llama-3-8B", 64, 80, **BOTH)
    return found, time.perf_counter() - start


def test_an_8b_plan_completes_in_seconds_and_every_layout_is_valid(llama):
    found, seconds = llama
    print(f"Llama-3-8B on 64 GPUs, recompute off and full: {len(found.layouts)} layouts in "
          f"{seconds:.2f} s")
    assert seconds < 30
    c = get_config("Llama-3-8B")
    assert found.ranked
    for lay in found.ranked:
        assert lay.dp * lay.tp * lay.pp == 64 and lay.fits
        assert c.n_kv_heads % lay.tp == 0 and lay.tp <= 8 and c.n_layers % lay.pp == 0
        assert lay.memory_per_gpu_bytes <= 80 * GB
        assert lay.memory == memory.estimate(c, (512, 8192), "adam", "bf16", lay.dp, lay.tp,
                                              lay.pp, lay.microbatches, "1f1b", 80, 0,
                                              lay.recompute)
    assert {lay.recompute for lay in found.ranked} == {None, "full"}
    times = [lay.step_time_s for lay in found.ranked]
    assert times == sorted(times)
    # pure data parallelism cannot hold 8 B parameters at 16 bytes each on 80 GB
    pure = [r for r in found.rejected if (r.dp, r.tp, r.pp) == (64, 1, 1)]
    assert len(pure) == 1 and pure[0].kind == "memory"
    assert pure[0].memory.total > 16 * count_parameters(c)["total"]


def test_recompute_time_is_the_repeated_forward_flops(llama):
    found, _ = llama
    c, a = get_config("Llama-3-8B"), found.assumptions
    full = next(lay for lay in found.ranked if lay.recompute == "full" and lay.tp > 1)
    plain = evaluate("Llama-3-8B", full.dp, full.tp, full.pp, full.microbatches,
                     assumptions=Assumptions(**JOB))
    # by hand: one more forward of every block, per token: 2 per weight of the projections
    # (Q, O: d x d; K, V: d x d_kv) and SwiGLU (3 d x d_ff), and 4 T d for the scores and V
    d, kv, f, layers = c.d_model, c.d_kv, c.d_ff, c.n_layers
    per_token = 2 * (2 * d * d + 2 * d * kv + 3 * d * f) + 4 * 8192 * d
    tokens_per_gpu = 512 * 8192 / full.dp / (full.tp * full.pp)
    seconds = per_token * layers * tokens_per_gpu / (a.gpu_tflops * 1e12 * a.mfu)
    assert full.times["recompute"] == pytest.approx(seconds)
    assert full.times["compute"] == pytest.approx(plain.times["compute"])
    # the forward's two all-reduces per block run again: 6 instead of 4
    assert full.times["tensor"] == pytest.approx(1.5 * plain.times["tensor"])
    assert full.memory.activations < plain.memory.activations
    assert full.step_time_s > plain.step_time_s
    assert full.achieved_mfu < plain.achieved_mfu  # recomputation is not useful work
    assert "recompute" not in plain.times and list(full.times) == list(TIME_PARTS)
    assert "full recomputation" in full.explain() and "recomputation" in full.explain()
    assert "full recompute" in full.name


def test_recompute_lets_fewer_gpus_per_model_copy_fit(llama):
    found, _ = llama
    widths = {r: min(lay.tp * lay.pp for lay in found.ranked if lay.recompute == r)
              for r in (None, "full")}
    assert widths["full"] < widths[None]


def test_a_config_dict_or_path_plans_like_the_preset(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(HF_PRESETS["Llama-3-8B"]))
    args = dict(JOB, microbatches=(16, 64))
    rows = [lay.row() for lay in plan("Llama-3-8B", 64, 80, **args)]
    assert rows
    for form in (HF_PRESETS["Llama-3-8B"], path, str(path), get_config("Llama-3-8B")):
        assert [lay.row() for lay in plan(form, 64, 80, **args)] == rows
    text = table(plan(HF_PRESETS["Llama-3-8B"], 64, 80, **args), 3)
    assert text.count("\n") == 3 and "recompute" not in text.splitlines()[0]


def test_a_model_of_your_own_as_a_dict():
    mine = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632,
            "num_attention_heads": 32, "num_key_value_heads": 4, "num_hidden_layers": 22,
            "vocab_size": 32000, "max_position_embeddings": 2048, "_name_or_path": "mine"}
    found = search(mine, 16, 40, global_batch=64, recompute=(None, "selective", "full"))
    assert found.config.name == "mine" and found.ranked
    assert all(4 % lay.tp == 0 and lay.pp <= 22 for lay in found.ranked)
    assert "recompute" in table(found.ranked, 5).splitlines()[0]
    assert {lay.recompute for lay in found.layouts} == {None, "selective", "full"}


def test_selective_recompute_buys_a_llama_nothing_worth_its_flops():
    # a fused attention kernel keeps no T x T tensor, so selective recompute drops almost
    # nothing and still repeats the attention core's FLOPs
    none, sel = (evaluate("Llama-3-8B", 8, 2, 4, 64, **JOB, recompute=r)
                 for r in (None, "selective"))
    assert sel.times["recompute"] > 0
    assert abs(sel.memory.activations - none.memory.activations) < \
        0.05 * none.memory.activations


def test_gpt_searches_without_recompute_are_unchanged():
    lay = plan("GPT-3 13B", 64, 40)[0]
    assert "recompute" not in lay.times and "recompute" not in lay.row()
    assert list(lay.times) == [p for p in TIME_PARTS if p != "recompute"]


def test_bad_input_is_named():
    with pytest.raises(ValueError, match=r"tp=16 does not divide the 8 key/value heads .*"
                                         r"Megatron-LM would replicate.*valid tp here"):
        evaluate("Llama-3-8B", 4, 16, 1, 1, topology=None, **JOB)
    with pytest.raises(ValueError, match=r"unknown model 'Llama-9'; known: .*'Llama-3-8B'"):
        plan("Llama-9", 64)
    with pytest.raises(ValueError, match=r"unknown recompute 'partial'; choose one of "
                                         r"\[None, 'full', 'selective'\]"):
        plan("Llama-3-8B", 64, recompute="partial")
    with pytest.raises(ValueError, match="recompute must be one of"):
        plan("Llama-3-8B", 64, recompute=("full", "full"))
    with pytest.raises(ValueError, match="evaluate prices one layout"):
        evaluate("Llama-3-8B", 8, 2, 4, 64, recompute=(None, "full"))
    with pytest.raises(ValueError, match="missing the required field 'num_attention_heads'"):
        plan({"model_type": "llama"}, 64)
    with pytest.raises(ValueError, match="unsupported model_type 'bert'"):
        plan({"model_type": "bert"}, 64)
    with pytest.raises(TypeError, match="a model is a config, its name"):
        plan(42, 64)


def test_a_search_with_recompute_draws(llama):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from parlab.viz.plots import layouts_figure
    fig = layouts_figure(llama[0])
    labels = {t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().texts}
    assert "recompute" in labels
    plt.close(fig)
