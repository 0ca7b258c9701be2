"""The 3D-parallel planner: valid, fitting layouts only; GPT-3's verdicts; placement; the
summary table; chapter 05's exercises and explorer."""
import math

import pytest

from parlab import memory
from parlab.units import GB
from parlab.models import CONFIGS, GPT3_175B, count_parameters
from parlab.hybrid import Assumptions, bubble_fraction, evaluate, plan, search, table
from parlab.comm import GROUP_KINDS, Mesh
from parlab.hybrid import cluster, group_links, place, placement
from parlab.comm import allreduce_time, nic, rail_optimized


@pytest.fixture(scope="module")
def gpt3():
    return search("GPT-3 175B", 1024, 80)


CASES = [("GPT-3 175B", 1024, 80), ("GPT-3 13B", 64, 40), ("GPT-2 small", 8, 24),
         ("GPT-3 6.7B", 32, 80), ("GPT-3 2.7B", 4, 80)]


@pytest.mark.parametrize("model, gpus, gb", CASES)
def test_every_layout_fits_and_multiplies_to_the_gpu_count(model, gpus, gb):
    config = CONFIGS[model]
    layouts = plan(model, gpus, gb)
    assert layouts, f"{model} on {gpus} x {gb} GB should have a layout"
    a = Assumptions()
    for lay in layouts:
        assert lay.dp * lay.tp * lay.pp == gpus
        assert lay.fits and lay.memory_per_gpu_bytes <= gb * GB
        assert config.n_heads % lay.tp == 0 and lay.tp <= min(8, gpus)
        assert lay.pp <= config.n_layers  # unequal stages allowed (issue 31)
        assert a.global_batch % (lay.dp * lay.microbatches) == 0
        assert lay.micro_batch * lay.dp * lay.microbatches == a.global_batch
    times = [lay.step_time_s for lay in layouts]
    assert times == sorted(times)


def test_gpt3_rejects_pure_data_parallelism_and_finds_tensor_parallel_servers(gpt3):
    pure = [r for r in gpt3.rejected if (r.dp, r.tp, r.pp) == (1024, 1, 1)]
    assert len(pure) == 1 and not pure[0].memory.fits
    assert pure[0].memory.total > 30 * 80 * GB  # the whole model state, on every GPU
    layouts = gpt3.ranked
    assert layouts and all(lay.tp > 1 for lay in layouts)
    assert all(lay.pp > 1 for lay in layouts)  # no tp alone holds it either (tp <= 8)
    topology = layouts[0].topology
    for lay in layouts:
        gpu_of = lay.placement()
        for members in lay.mesh.group_ranks("tensor"):
            assert len({topology.server(gpu_of[r]) for r in members}) == 1
        assert lay.links["tensor"] == "nvlink" and lay.links["pipeline"] == "rail"


def test_gpt3_winner_and_its_explanation(gpt3):
    win = gpt3.ranked[0]
    assert (win.tp, win.dp * win.pp) == (8, 128)  # the tensor group fills one server
    text = win.explain()
    assert f"dp {win.dp} x tp {win.tp} x pp {win.pp}" in text
    assert "NVLink" in text and "rail" in text
    assert "Pure data parallelism would need" in text
    runner = gpt3.ranked[1]
    assert runner.step_time_s >= win.step_time_s
    assert f"dp {runner.dp} x tp {runner.tp} x pp {runner.pp}" in text
    assert "1024" in gpt3.summary() and f"{len(gpt3.ranked)} fit" in gpt3.summary()
    assert table(gpt3.ranked, 2).count("\n") == 2


def test_step_time_is_the_sum_of_its_modelled_parts(gpt3):
    lay = gpt3.ranked[0]
    a, c = lay.assumptions, GPT3_175B
    assert lay.step_time_s == pytest.approx(sum(lay.times.values()))
    flops = 6 * count_parameters(c)["total"] * a.global_batch * c.context
    assert lay.times["compute"] == pytest.approx(flops / 1024 / (a.gpu_tflops * 1e12 * a.mfu))
    assert lay.times["data"] == pytest.approx(
        allreduce_time(lay.memory.gradients, lay.dp, "ring", nic(400)))
    busy = lay.times["compute"] + lay.times["tensor"] + lay.times["pipeline"]
    fraction = lay.bubble_fraction
    assert lay.times["bubble"] / (busy + lay.times["bubble"]) == pytest.approx(fraction)
    assert lay.memory == memory.estimate(c, (a.global_batch, c.context), "adam", "bf16", lay.dp,
                                         lay.tp, lay.pp, lay.microbatches, "1f1b", 80)
    assert 0 < lay.achieved_mfu < a.mfu


def test_faster_nics_never_slow_a_layout_down():
    slow = evaluate("GPT-3 175B", 8, 8, 16, 192, topology=cluster(1024, nic_gbps=100))
    fast = evaluate("GPT-3 175B", 8, 8, 16, 192, topology=cluster(1024, nic_gbps=400))
    assert fast.step_time_s < slow.step_time_s
    assert fast.times["compute"] == slow.times["compute"]
    assert fast.times["tensor"] == slow.times["tensor"]  # NVLink, not the NICs


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_bubble_closed_form_equals_the_simulator(name):
    from parlab.pipeline import schedule, simulate
    for p in range(1, 6):
        for m in range(1, 9):
            assert bubble_fraction(p, m, name) == pytest.approx(
                simulate(schedule(name, p, m)).bubble_fraction), (p, m)


def test_placement_puts_tensor_in_a_server_and_stages_along_a_rail():
    dp, tp, pp = 2, 4, 4
    gpu_of, topology, mesh = place(dp, tp, pp), rail_optimized(4, 8), Mesh(dp=dp, pp=pp, tp=tp)
    assert sorted(gpu_of) == list(range(32))
    for rank in range(32):
        assert mesh.rank_at(*mesh.coordinates(rank)) == rank
    for members in mesh.group_ranks("pipeline"):
        servers = [topology.server(gpu_of[r]) for r in members]
        assert servers == list(range(servers[0], servers[0] + pp))
        assert len({topology.rail(gpu_of[r]) for r in members}) == 1
    assert group_links(dp, tp, pp, topology) == {"tensor": "nvlink", "pipeline": "rail",
                                                 "data": "nvlink"}
    assert sorted(len(g) for k in GROUP_KINDS for g in mesh.group_ranks(k)) == \
        [2] * 16 + [4] * 16


def test_a_long_pipeline_turns_inside_a_server_not_through_the_spine():
    gpu_of, topology = place(1, 1, 16), rail_optimized(2, 8)
    hops = {topology.link_type(a, b) for a, b in zip(gpu_of, gpu_of[1:])}
    assert hops == {"rail", "nvlink"}


def test_clear_errors():
    with pytest.raises(ValueError, match="gpus=12 does not fill servers of 8"):
        plan("GPT-3 175B", 12)
    with pytest.raises(ValueError, match=r"tp=5 does not divide the 96 heads.*valid tp"):
        evaluate("GPT-3 175B", 16, 5, 8, 1)
    with pytest.raises(ValueError, match="tp=16 does not fit inside a server of 8"):
        evaluate("GPT-3 175B", 4, 16, 16, 1)
    with pytest.raises(ValueError, match="pp=97 stages for the 96 layers: at most one stage"):
        evaluate("GPT-3 175B", 1, 8, 97, 1, topology=cluster(776))
    with pytest.raises(ValueError, match="global_batch"):
        plan("GPT-3 175B", 1024, global_batch=0)
    with pytest.raises(ValueError, match="unknown schedule"):
        plan("GPT-3 175B", 1024, schedule="zigzag")
    with pytest.raises(ValueError, match="fewer than gpus=1024"):
        plan("GPT-3 175B", 1024, topology=rail_optimized(2, 8))
    with pytest.raises(ValueError, match="unknown model"):
        plan("GPT-5", 8)
    with pytest.raises(ValueError, match="rank must be in 0..7"):
        Mesh(dp=2, pp=2, tp=2).coordinates(8)
    with pytest.raises(ValueError, match=r"tp=16 does not divide the 8 GPUs of a server.*"
                                         r"valid tp: \[1, 2, 4, 8\]"):
        place(1, 16, 1)
    with pytest.raises(ValueError, match="gpus=12 does not fill servers of 8"):
        place(3, 2, 2)


def test_nothing_fits_is_an_empty_plan_with_reasons():
    found = search("GPT-3 175B", 8, 80)
    assert found.ranked == [] and plan("GPT-3 175B", 8, 80) == []
    assert all(r.memory is None or not r.memory.fits for r in found.rejected)
    assert "0 fit" in found.summary()


def test_summary_table_rows_are_backed_by_computed_numbers():
    from parlab.pipeline import schedule, simulate
    from parlab.experiments import summary_table, summary_text
    rows = {r.strategy: r for r in summary_table()}
    assert list(rows) == ["data", "model", "pipeline", "tensor"]
    data = rows["data"].numbers
    assert data["cnn_traffic_ratio_batch_64_vs_1"] == 1.0
    assert data["ring_bytes_per_gradient_byte"] == pytest.approx(2 * 1023 / 1024)
    assert data["times_gpu_memory"] > 30
    # DDP's buckets for GPT-3 (bf16): every weight matrix (four d x d, two d x 4d per block,
    # 2,048 x d positions, 50,257 x d tokens) is over the 25 MiB cap, so it closes its own
    # bucket, the biases and LayerNorms before it riding along: 6 per block, then the two
    # embeddings (the head shares the token table). Bytes: 2 per parameter, counted by hand.
    d, layers = 12288, 96
    assert data["ddp_buckets"] == 6 * layers + 2
    assert data["ddp_bucket_bytes"] == 2 * (layers * (12 * d * d + 13 * d) + (50257 + 2048) * d
                                            + 2 * d)
    assert rows["model"].numbers["naive_bubble_p4"] == 0.75
    assert rows["pipeline"].numbers["bubble_p4_m4"] == simulate(
        schedule("1f1b", 4, 4)).bubble_fraction == pytest.approx(3 / 7)
    tensor = rows["tensor"].numbers
    assert tensor["parameters_per_gpu_tp8"] < tensor["parameters_per_gpu_tp1"] / 7
    assert tensor["block_allreduce_s_nic"] > 5 * tensor["block_allreduce_s_nvlink"]
    text = summary_text(list(rows.values()))
    assert text.count("parallelism\n") == 4
    # the slides' claim is quoted, then qualified: the backward pass does communicate
    assert '"Require no communication during forward/backward"' in rows["data"].pros
    assert "backward pass all-reduces the gradients" in rows["data"].pros


def _conv4_line_by_hand() -> int:
    """Largest batch at which splitting conv4 sends fewer elements than its gradient: read
    the layer's weights and its per-sample input and output off the module itself."""
    import torch
    from parlab.models import SmallCNN
    cnn = SmallCNN()
    conv4 = dict(cnn.named_modules())["conv4"]
    seen = {}
    conv4.register_forward_hook(lambda m, i, o: seen.update(i=i[0].numel(), o=o.numel()))
    cnn(torch.zeros(1, 3, 32, 32))
    weights = sum(p.numel() for p in conv4.parameters())
    per_sample = min(seen["i"], seen["o"])
    return max(b for b in range(weights) if b * per_sample < weights)


def test_chapter_05_exercises_accept_independently_computed_answers():
    from parlab.exercises import check
    import parlab.exercises.ch05 as ch05
    assert not hasattr(ch05, "_answers")  # no answer key one call away
    # 05.1: 1F1B keeps pp micro-batches of L/pp layers on the first stage: L layers' worth
    # of activations whatever pp is. Check that premise on the calculator, then the checker.
    acts = {pp: memory.estimate(GPT3_175B, (1536, 2048), "adam", "bf16", 128 // pp, 8, pp,
                                1536 // (128 // pp), "1f1b").activations for pp in (8, 16, 32)}
    assert max(acts.values()) / min(acts.values()) < 1.01
    assert check("05.1", "activations").ok is True
    assert check("05.1", "parameters").ok is False
    # 05.2: replicas step down the servers at one GPU position (a rail), and the ring closes
    # across GPU positions on another server (the spine)
    assert check("05.2", {"rail", "spine"}).ok is True
    assert check("05.2", {"nvlink"}).ok is False
    line = _conv4_line_by_hand()
    assert check("05.3", line).ok is True and check("05.3", line + 1).ok is False
    win = plan("GPT-3 175B", 1024, 80)[0]
    half = (win.pp - 1) / (win.microbatches // 2 + win.pp - 1)
    assert check("05.4", half).ok is True
    assert check("05.4", 0.5).ok is False and check("05.4", ...).ok is None
    k, m, ridge = 1536, 12288, 989 / 3.35     # n k m / (n k + k m + n m) = ridge, for n
    tokens = math.ceil(ridge * k * m / (k * m - ridge * (k + m)))
    assert check("05.5", tokens).ok is True
    assert check("05.5", round(ridge)).ok is False and check("05.5", 2048).ok is False
    for exercise_id, wrong in (("05.1", "gradients"), ("05.5", 100)):
        assert "activations" not in check(exercise_id, wrong).message
        assert str(tokens) not in check(exercise_id, wrong).message


def test_planner_explorer_draws_and_explains(capsys):
    import matplotlib
    matplotlib.use("Agg")
    from parlab.viz.widgets.planner import draw_plan
    fig = draw_plan("GPT-3 13B", 64, 80, 200, 450)
    out = capsys.readouterr().out
    assert fig is not None and "fit." in out and "Time: a step takes" in out
    assert draw_plan("GPT-3 175B", 12, 80, 400, 450) is None
    assert "does not work" in capsys.readouterr().out


def test_placement_and_layout_figures_draw():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from parlab.tools import figures
    from parlab.viz.plots.planner import candidates
    from parlab.viz.plots import layouts_figure, placement_figure
    assert {"fig-05-planner-layouts", "fig-05-rank-placement", "fig-05-cnn-compute-vs-params",
            "fig-05-3d-traffic"} <= set(figures.registry())
    found = search("GPT-3 13B", 64, 80)
    best = candidates(found, 4)
    assert best[0] is found.ranked[0] and len({(x.dp, x.tp, x.pp) for x in best}) == 4
    for fig in (layouts_figure(found), placement_figure(placement(2, 2, 2, gpus_per_server=2))):
        assert len(fig.axes) >= 1
        plt.close(fig)
    assert math.isclose(bubble_fraction(1, 5), 0.0)
