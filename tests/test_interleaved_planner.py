"""Interleaved 1F1B in the planner and the memory estimate, held to the simulator; the
data-parallel all-reduce overlapped with the backward (issue 31)."""

import pytest

from parlab import memory
from parlab.hybrid import Assumptions, bubble_fraction, evaluate, plan, search
from parlab.hybrid.step import DDP_BUCKET_BYTES, exposed_data_parallel
from parlab.pipeline import schedule, simulate

#: (p, m, v): m a multiple of p, m between p and 2p, m below p.
CASES = [(2, 2, 2), (2, 4, 2), (3, 6, 2), (4, 4, 2), (4, 8, 2), (4, 8, 3), (4, 12, 4),
         (4, 5, 2), (4, 6, 3), (8, 16, 2), (4, 1, 2), (4, 2, 2), (4, 3, 3), (8, 5, 2)]


@pytest.mark.parametrize("p,m,v", CASES)
def test_bubble_fraction_is_the_simulators(p, m, v):
    sim = simulate(schedule("interleaved", p, m, v))
    assert bubble_fraction(p, m, "1f1b", v) == pytest.approx(sim.bubble_fraction)


@pytest.mark.parametrize("p,m,v", [c for c in CASES if c[1] % c[0] == 0])
def test_bubble_fraction_is_the_papers_when_m_is_a_multiple_of_p(p, m, v):
    """Narayanan et al. (2021, 2.2.2): bubble over ideal time (p-1)/(v m); over the whole
    step that is (p-1)/(v m + p - 1)."""
    assert bubble_fraction(p, m, "1f1b", v) == pytest.approx((p - 1) / (v * m + p - 1))


@pytest.mark.parametrize("p,m,v", CASES)
def test_peak_in_flight_is_the_simulators(p, m, v):
    sim = simulate(schedule("interleaved", p, m, v))
    assert [memory.interleaved_peak(p, m, v, r) for r in range(p)] == sim.peak_inflight


def test_first_rank_holds_korthikantis_count():
    """m a multiple of p: rank 0 holds p (1 + (p-1)/(p v)) micro-batches' worth, i.e.
    v p + p - 1 chunk pairs (Korthikanti et al. 2022, 4.2.3)."""
    for p, v in ((4, 2), (8, 3), (35, 3), (16, 2)):
        assert memory.interleaved_peak(p, 4 * p, v) / v == pytest.approx(p * (1 + (p - 1) / (p * v)))


@pytest.mark.parametrize("p,m,v", [(4, 9, 2), (4, 10, 2), (3, 7, 2), (4, 4, 2), (4, 6, 2)])
def test_planner_refuses_what_the_simulator_refuses(p, m, v):
    try:
        schedule("interleaved", p, m, v)
        runs = True
    except ValueError:
        runs = False
    assert (memory.interleave_problem("1f1b", p, m, v, None) == "") == runs


def test_layers_must_cut_into_chunks():
    assert "do not cut into 2 equal chunks" in memory.interleave_problem("1f1b", 4, 8, 2, 12)
    with pytest.raises(ValueError, match="do not cut into 2 equal chunks"):
        evaluate("GPT-2 small", 1, 1, 4, 8, global_batch=8, virtual_stages=2)
    with pytest.raises(ValueError, match="interleaves 1F1B"):
        Assumptions(schedule="gpipe", virtual_stages=2)
    with pytest.raises(ValueError, match="positive int"):
        Assumptions(virtual_stages=0)
    # the search skips what cannot be cut: GPT-2 small's 12 layers, v = 4: pp in {1, 3}
    found = search("GPT-2 small", 8, global_batch=32, virtual_stages=4)
    assert {lay.pp for lay in found.layouts} <= {1, 3}
    assert any("cut into 4 equal chunks" in r.reason for r in found.rejected)


def test_estimate_counts_the_first_ranks_pairs():
    """GPT-2 small on pp = 4 with v = 3 (one layer per chunk), 8 micro-batches, no recompute:
    rank 0's blocks hold (v p + p - 1)/v = 5 micro-batches' worth against 1F1B's 4, and its
    embedding output 4 micro-batches as in 1F1B."""
    job = ("GPT-2 small", (64, 1024), "adam", "bf16", 1, 1, 4, 8)
    plain = memory.estimate(*job)
    inter = memory.estimate(*job, virtual_stages=3)
    block = sum(memory.block_activations("GPT-2 small", 8, 1024, "bf16").values())
    # rank 0: 3 blocks; 1F1B keeps them for 4 micro-batches, interleaved for 5
    assert inter.activations - plain.activations == pytest.approx(3 * block * (5 - 4), rel=1e-9)
    assert inter.parameters == plain.parameters


def test_interleaving_shrinks_the_bubble_and_multiplies_the_sends():
    job = dict(global_batch=64, seq=2048, recompute="full")
    plain = evaluate("GPT-3 175B", 1, 8, 8, 16, **job)
    inter = evaluate("GPT-3 175B", 1, 8, 8, 16, virtual_stages=2, **job)
    assert inter.times["pipeline"] == pytest.approx(2 * plain.times["pipeline"])
    assert inter.bubble_fraction == pytest.approx(7 / (2 * 16 + 7))
    assert plain.bubble_fraction == pytest.approx(7 / (16 + 7))
    assert inter.times["compute"] == plain.times["compute"]


def test_scatter_gather_sends_a_tp_th_per_nic():
    """Narayanan et al. (2021, 4.1): each of the tp GPUs sends 1/tp of the activation on its
    NIC, then an all-gather over NVLink: at tp = 8 the rail part is 1/8 of the plain send."""
    job = dict(global_batch=8, seq=2048)
    plain = evaluate("GPT-3 175B", 1, 8, 8, 8, **job)
    sg = evaluate("GPT-3 175B", 1, 8, 8, 8, scatter_gather=True, **job)
    rail = plain.topology.links[plain.links["pipeline"]]
    act = 1 * 2048 * 12288 * 2                    # b s h bf16
    nv = plain.topology.links[plain.links["tensor"]]
    gather = 7 * (nv.alpha + act / 8 / nv.bandwidth)
    assert sg.times["pipeline"] == pytest.approx(8 * 2 * (rail.time(act / 8) + gather))


def test_exposed_data_parallel_by_hand():
    # 1 s all-reduce, 0.7 s of backward to hide behind: 0.3 s exposed
    assert exposed_data_parallel(1.0, 0.7, 100 * DDP_BUCKET_BYTES) == pytest.approx(0.3)
    # a long backward: only the last bucket (1 of 100) stays exposed
    assert exposed_data_parallel(1.0, 5.0, 100 * DDP_BUCKET_BYTES) == pytest.approx(0.01)
    assert exposed_data_parallel(0.0, 5.0, 1e9) == 0.0


def test_overlap_changes_only_the_data_part():
    """GPT-3 6.7B, dp 8 x tp 1 x pp 1 on one server, one micro-batch of 4 sequences: the
    window is the backward, 2/3 of the compute (no recompute, no tensor part)."""
    job = dict(global_batch=32, seq=2048)
    off = evaluate("GPT-3 6.7B", 8, 1, 1, 1, **job)
    on = evaluate("GPT-3 6.7B", 8, 1, 1, 1, overlap_data_parallel=True, **job)
    grads = memory.estimate("GPT-3 6.7B", (32, 2048), "adam", "bf16", 8).gradients
    expected = exposed_data_parallel(off.times["data"], off.times["compute"] * 2 / 3, grads)
    assert on.times["data"] == pytest.approx(expected)
    assert {k: v for k, v in on.times.items() if k != "data"} == \
        {k: v for k, v in off.times.items() if k != "data"}


def test_defaults_keep_the_chapters_numbers():
    a = Assumptions()
    assert a.virtual_stages == 1 and not a.overlap_data_parallel and not a.scatter_gather
    assert plan("GPT-2 small", 8, global_batch=32)[0].assumptions.virtual_stages == 1


def test_an_interleaved_estimate_says_so_in_its_label():
    from parlab import memory

    job = ("GPT-3 175B", (32, 2048), "adam", "bf16", 1, 8, 16, 32)
    assert memory.estimate(*job, virtual_stages=3).label.endswith(
        "32 micro-batches (interleaved 1f1b, 3 chunks a rank)")
    assert memory.estimate(*job).label.endswith("32 micro-batches (1f1b)")
