"""The real 3D job (dp 2 x tp 2 x pp 2 on 8 ranks) and the CNN hybrid with its traffic split,
each against one-process training."""
import pytest
import torch

from parlab.launch import RankError, run
from parlab.hybrid.parallel3d import CONFIG, make_batch, rank_step
from parlab.hybrid import crossover_batch, hybrid_traffic, run_3d
from parlab.comm import ring_wire_bytes


@pytest.fixture(scope="module")
def toy():
    return run_3d(backend="toy")


def test_3d_step_on_gloo_equals_one_process_training():
    job = run_3d(backend="gloo")
    assert job.max_error < 1e-5
    for d in range(job.dp):  # each replica, stitched from its 4 ranks, is the whole model
        got = job.replica(d)
        assert set(got) == set(job.reference)
        for name, value in job.reference.items():
            torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6)
    from parlab.models import build_model
    x, y = make_batch(8, 8, CONFIG.vocab, 0)
    assert job.loss == pytest.approx(build_model(CONFIG, seed=0).loss(x, y).item(), rel=1e-5)


def test_3d_step_on_toy_equals_one_process_and_its_traffic_splits_by_group_and_link(toy):
    assert toy.matches() and "True" in toy.report()
    table = toy.traffic_by_group()
    assert set(table) == {"tensor", "pipeline", "data"}
    assert table["tensor"]["rail"] == table["tensor"]["spine"] == 0 < table["tensor"]["nvlink"]
    assert table["pipeline"]["nvlink"] == table["pipeline"]["spine"] == 0
    assert table["data"]["nvlink"] == table["data"]["spine"] == 0
    assert sum(len(toy.traffic.filter(group=k)) for k in table) == len(toy.traffic)


def test_3d_traffic_equals_the_formulas(toy):
    dp = tp = pp = 2
    microbatches, micro_batch, seq, d = 2, 8 // (dp * 2), 8, CONFIG.d_model
    activation = micro_batch * seq * d * 4
    table = {k: sum(v.values()) for k, v in toy.traffic_by_group().items()}
    blocks_per_stage = CONFIG.n_layers // pp
    # Megatron: 2 all-reduces per block forward, 2 backward, per micro-batch, in each tp group
    tensor = dp * pp * microbatches * blocks_per_stage * 4 * ring_wire_bytes("all_reduce",
                                                                             activation, tp)
    assert table["tensor"] == tensor
    # each tensor rank sends its activation forward and its gradient back, per micro-batch
    assert table["pipeline"] == dp * tp * (pp - 1) * microbatches * 2 * activation
    # one bucketed all-reduce of the local gradients per (stage, tensor index)
    local = [sum(p.numel() for p, _ in r["params"].values()) * 4 for r in toy.ranks[:tp * pp]]
    assert table["data"] == sum(ring_wire_bytes("all_reduce", n, dp) for n in local)
    assert "tensor" in toy.traffic_table() and "rail" in toy.traffic_table()


def test_3d_job_errors_name_the_bad_value():
    with pytest.raises(RankError, match="dp x tp x pp = 8 but the job has 4 ranks"):
        run(rank_step, 4, 2, 2, 2)
    with pytest.raises(RankError, match="batch=6 does not split into dp=2 x microbatches=2"):
        run(rank_step, 8, 2, 2, 2, batch=6)
    with pytest.raises(ValueError, match="backend='toy'"):
        run_3d(dp=1, tp=1, pp=1).traffic_by_group()


@pytest.mark.parametrize("world_size", [2, 4])
def test_cnn_hybrid_on_toy_equals_one_process_and_splits_its_bytes(world_size):
    job = hybrid_traffic(world_size, batch=8)
    assert job.max_error < 1e-5
    split = job.bytes_by_strategy()
    n, batch, width, hidden, classes = world_size, 8, 8, 64, 10
    conv_bytes = [p.numel() * 4 for name, p in job.reference.items() if name.startswith("conv")]
    assert split["data"] == {"all_reduce": sum(ring_wire_bytes("all_reduce", b, n)
                                               for b in conv_bytes)}
    features = batch * 4 * width * 16 * 4
    # the features are all-gathered forward, and again backward (each rank kept its own)
    assert split["tensor"] == {"all_gather": 2 * ring_wire_bytes("all_gather", features, n),
                               "all_reduce": ring_wire_bytes("all_reduce", batch * classes * 4, n),
                               "reduce_scatter": ring_wire_bytes("reduce_scatter", features, n)}
    assert hidden % n == 0 and "data" in job.table()


def test_crossover_batch_is_where_splitting_stops_paying():
    from parlab.models import SmallCNN, communication_per_layer, profile
    profiles = profile(SmallCNN(), (3, 32, 32), batch=1)
    lines = {p.name: crossover_batch(profiles, p.name) for p in profiles}
    assert lines["conv1"] == 0 and lines["fc1"] > 1000 and 8 < lines["conv5"] < 64
    for name in ("conv3", "conv5", "fc2"):
        at, past = (next(r for r in communication_per_layer(profiles, b) if r["layer"] == name)
                    for b in (lines[name], lines[name] + 1))
        cheaper = lambda r: min(r["tp_partition_output"], r["tp_reduce_output"])
        assert cheaper(at) < at["data_parallel"] <= cheaper(past)
    with pytest.raises(ValueError, match="no layer 'conv9'"):
        crossover_batch(profiles, "conv9")
