"""ZBV and DualPipeV in the memory estimate and the planner (issue 30's last piece).

Every count here is held to something the estimate does not compute itself: the event-driven
simulator's action orders (walked here, chunk by chunk, under the estimate's release rule),
a real V split of a small GPT (the pipeline package's own ``split_layers`` over
``GPT.pipeline_layers()``), the per-chunk ``activation_bytes`` (another path through the
calculator) and, per chunk, what autograd really saves in a forward pass.
"""
import pytest
import torch
import torch.nn.functional as F

from parlab import memory
from parlab.hybrid import bubble_fraction, evaluate, plan, search
from parlab.models import BookMLP, build_model, TINY
from parlab.pipeline import Durations, program, split_layers, timeline

V = ("zbv", "dualpipev")
#: A GPT small enough to build in milliseconds, 8 blocks (V chunks of 1 or 2 blocks).
SMALL = TINY.replace(name="small-v", d_model=32, n_layers=8, n_heads=4, d_ff=64, vocab=96,
                     context=16)


def _runs(name, p, m):
    """The simulator's timeline, or None where the schedule refuses (p, m)."""
    try:
        return timeline(program(name, p, m), Durations(1, 1, 1))
    except ValueError:
        return None


def _held(t, rank):
    """After each of ``rank``'s actions, the (stage -> pairs) it holds: a (chunk,
    micro-batch) pair from its F until its W, or until its full backward B (the input
    gradient I frees nothing: W keeps the activations whole)."""
    held, out = {}, []
    for e in t.of_rank(rank):
        a = e.action
        held[a.stage] = held.get(a.stage, 0) + {"F": 1, "B": -1, "W": -1, "I": 0}[a.kind]
        out.append(dict(held))
    return out


def _weighted_peak(t, rank, weight):
    """The most activations ``rank`` holds at once, each pair weighing ``weight[stage]``."""
    return max(sum(weight[k] * n for k, n in h.items()) for h in _held(t, rank))


CASES = [(name, p, m) for name in V for p in (1, 2, 3, 4, 5)
         for m in sorted({1, 2, p, 2 * p - 1, 2 * p, 2 * p + 1, 3 * p + 2})]


@pytest.mark.parametrize("name, p, m", CASES)
def test_in_flight_per_rank_and_chunk_equals_the_simulator(name, p, m):
    """The closed forms' points give the simulator's peak of every weighted sum of the two
    chunks (weights 1:1, and one chunk much heavier than the other), on every rank."""
    t = _runs(name, p, m)
    if t is None:
        assert name == "dualpipev" and m < 2 * p
        return
    for r in range(p):
        down, up = r, 2 * p - 1 - r
        points = memory.v_in_flight(name, p, m, r)
        assert max(d + u for d, u in points) == t.peak_inflight[r], (name, p, m, r)
        for a, b in ((1, 1), (1, 7), (7, 1), (2, 3), (3, 2)):
            expected = _weighted_peak(t, r, {down: a, up: b})
            assert max(a * d + b * u for d, u in points) == expected, (name, p, m, r, a, b)


def test_in_flight_at_the_worked_example():
    """p = 4, m = 8 (chapter 09's): ZBV holds 2p = 8 pairs on every rank, 7 + 1 on rank 0
    (or 8 of the first chunk); DualPipeV 2p + 1 = 9, rank 0 as 8 + 1 (worked by hand)."""
    assert memory.v_in_flight("zbv", 4, 8, 0) == [(7, 1), (8, 0)]
    assert memory.v_in_flight("zbv", 4, 8, 3) == [(4, 4), (5, 3)]
    assert memory.v_in_flight("dualpipev", 4, 8, 0) == [(8, 1)]
    assert memory.v_in_flight("dualpipev", 4, 8, 3) == [(5, 4)]


@pytest.mark.parametrize("name", V)
def test_bubble_fraction_equals_the_simulator(name):
    """F = B = W = 1 per chunk: the closed form is the simulator's bubble, for m below what
    the V needs to fill (ZBV) and DualPipeV's smallest m = 2p on; below it, both refuse."""
    for p in (1, 2, 3, 4, 6, 8):
        for m in range(1, 4 * p + 3):
            t = _runs(name, p, m)
            if t is None:
                assert name == "dualpipev" and m < 2 * p
                with pytest.raises(ValueError, match=f"at least 2 x pp = {2 * p}"):
                    bubble_fraction(p, m, name)
                continue
            assert bubble_fraction(p, m, name) == pytest.approx(t.bubble_fraction), (p, m)
    # filled: p - 1 idle units in 6m + p - 1 (hand-computed: p = 4, m = 8 -> 3 / 51)
    assert bubble_fraction(4, 8, name) == pytest.approx(3 / 51)
    assert bubble_fraction(4, 8, name) < bubble_fraction(4, 8, "zb-h1") < bubble_fraction(
        4, 8, "1f1b")


def _real_v_parameters(config, p):
    """Parameters each rank really holds when the pipeline package cuts ``config``'s GPT into
    2p chunks (embeddings with the first, the head with the last) placed in a V."""
    model = build_model(config)
    layers = model.pipeline_layers()
    chunk = [split_layers(len(layers), 2 * p, k, first=1, last=1) for k in range(2 * p)]
    out = []
    for r in range(p):
        held = {id(q): q.numel() for k in (r, 2 * p - 1 - r) for j in chunk[k]
                for q in layers[j].parameters()}  # a tied embedding is one tensor: once
        out.append(sum(held.values()))
    return out


def _ranks(model, shape, schedule, p, m):
    return memory.estimate_ranks(model, shape, "sgd", "fp32", 1, 1, p, m, schedule)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("p", [1, 2, 4])
def test_parameters_per_rank_equal_a_real_v_split(tied, p):
    config = SMALL.replace(tied_embeddings=tied)
    real = _real_v_parameters(config, p)
    for name in V:
        ranks = _ranks(config, (2 * p * 2, 16), name, p, 2 * p)
        assert [b.parameters // 4 for b in ranks] == real, (name, p, tied)  # fp32: 4 B each
        assert [f"rank {r} (chunks {r} and {2 * p - 1 - r})" in b.label
                for r, b in enumerate(ranks)] == [True] * p


@pytest.mark.parametrize("n_layers", [8, 7])
@pytest.mark.parametrize("name, p, m", [("zbv", 2, 1), ("zbv", 2, 3), ("zbv", 2, 6),
                                        ("zbv", 3, 8), ("dualpipev", 2, 4),
                                        ("dualpipev", 3, 7)])
def test_activations_per_rank_equal_the_simulator_weighted_by_chunk(n_layers, name, p, m):
    """Each rank's activations are the simulator's peak of its pairs weighted by each
    chunk's ``activation_bytes(stage=k, pp=2p)``: with 7 layers the chunks differ (rank 0's
    carry the embedding and the head besides), so the weights are unequal."""
    config, mb, seq = SMALL.replace(n_layers=n_layers), 2, 16
    weight = [memory.activation_bytes(config, mb, seq, stage=k, pp=2 * p)
              for k in range(2 * p)]
    t = _runs(name, p, m)
    ranks = _ranks(config, (mb * m, seq), name, p, m)
    assert [b.activations for b in ranks] == [
        _weighted_peak(t, r, dict(enumerate(weight))) for r in range(p)]
    busiest = memory.estimate(config, (mb * m, seq), "sgd", "fp32", pp=p, microbatches=m,
                              schedule=name)
    assert busiest.total == max(b.total for b in ranks)


def test_bookmlp_v_follows_its_layers():
    """A BookMLP falls out of the same rule: rank r holds layers of chunks r and 2p-1-r."""
    mlp = BookMLP((8, 16, 16, 16, 4))
    ranks = _ranks(mlp, (8,), "zbv", 2, 4)
    sizes = [(8 * 16 + 16), (16 * 16 + 16), (16 * 16 + 16), (16 * 4 + 4)]  # chunk k = layer k
    assert [b.parameters // 4 for b in ranks] == [sizes[0] + sizes[3], sizes[1] + sizes[2]]


class _Chunk(torch.nn.Module):
    """One V chunk of the GPT: its pipeline layers, and on the last chunk the loss."""

    def __init__(self, layers, last):
        super().__init__()
        self.layers, self.last = torch.nn.Sequential(*layers), last

    def forward(self, x, targets):
        y = self.layers(x)
        return F.cross_entropy(y.flatten(0, -2), targets.flatten()) if self.last else y


def test_activations_per_rank_equal_measured_chunks_weighted_by_the_simulator():
    """What autograd really saves in each chunk's forward (a real V split of the small GPT),
    weighted by the simulator's peak, is each rank's estimated activations, to the byte:
    the estimate's per-op count of each chunk against the storages measured here."""
    p, m, mb, seq = 2, 4, 2, 16
    model = build_model(SMALL)
    layers = model.pipeline_layers()
    K = 2 * p
    ids = torch.randint(0, SMALL.vocab, (mb, seq))
    targets = torch.randint(0, SMALL.vocab, (mb, seq))
    measured, x = [], ids
    for k in range(K):
        chunk = _Chunk([layers[j] for j in split_layers(len(layers), K, k, first=1, last=1)],
                       k == K - 1)
        inputs = x if k == 0 else x.detach().requires_grad_()
        x, saved = memory.forward_saved_bytes(chunk, inputs, targets)
        measured.append(saved)
    for name in V:
        t = _runs(name, p, m)
        ranks = _ranks(SMALL, (mb * m, seq), name, p, m)
        for r in range(p):
            real = _weighted_peak(t, r, dict(enumerate(measured)))
            assert ranks[r].activations == real, (name, r)


def test_estimate_refuses_what_a_v_cannot_run():
    with pytest.raises(ValueError, match="2 x pp = 10 chunks, more than its 8 layers"):
        memory.estimate(SMALL, (10, 16), pp=5, microbatches=10, schedule="zbv")
    with pytest.raises(ValueError, match="at least 2 x pp = 4 micro-batches.*microbatches=2"):
        memory.estimate(SMALL, (4, 16), pp=2, microbatches=2, schedule="dualpipev")
    with pytest.raises(ValueError, match="choose one of.*'zbv', 'dualpipev'"):
        memory.estimate(SMALL, (4, 16), pp=2, microbatches=2, schedule="dualpipe")
    with pytest.raises(ValueError, match="a torch.nn.Module takes 1f1b, gpipe or zb-h1"):
        memory.estimate(torch.nn.Linear(4, 4), (8, 4), schedule="zbv")
    with pytest.raises(ValueError, match="use one of 1f1b, gpipe, zb-h1"):
        memory.measure(SMALL, (4, 16), microbatches=2, schedule="zbv")


def test_planner_skips_layouts_a_v_cannot_run():
    """DualPipeV's layouts all have m >= 2 pp and 2 pp <= layers; an impossible one given to
    evaluate() is a ValueError naming what is valid."""
    found = search("GPT-3 175B", 1024, schedule="dualpipev")
    assert found.layouts and all(lay.microbatches >= 2 * lay.pp for lay in found.layouts)
    assert all(2 * lay.pp <= lay.config.n_layers for lay in found.layouts)
    with pytest.raises(ValueError, match="at least 2 x pp = 32 micro-batches"):
        evaluate("GPT-3 175B", 8, 8, 16, 16, schedule="dualpipev")
    tiny = search(SMALL, 8, global_batch=8, seq=16, schedule="dualpipev")
    assert all(r.kind in ("split", "batch") for r in tiny.rejected if r.pp >= 4)
    assert any("2 x pp = 16 chunks" in r.reason for r in tiny.rejected if r.pp == 8)


def test_planner_prices_gpt3_with_every_schedule():
    """GPT-3 on 1,024 GPUs, as chapter 09 section 6 tells it: the four schedules' fastest
    layouts share their degrees; a V halves ZB-H1's bubble (about) but sends each
    micro-batch over the pipeline twice per rank, which costs it the lead; its busiest GPU is
    rank 0, yet below ZB-H1's last stage; DualPipeV takes ZBV's time with more memory."""
    from parlab.experiments import plan_schedules

    planned = plan_schedules("GPT-3 175B", 1024)
    best = {name: row.layout for name, row in planned.items()}
    assert len({(x.dp, x.tp, x.pp, x.microbatches) for x in best.values()}) == 1
    ofob, h1, zbv, dpv = (best[n] for n in ("1f1b", "zb-h1", "zbv", "dualpipev"))
    assert h1.step_time_s < zbv.step_time_s < ofob.step_time_s
    assert zbv.times["bubble"] < 0.6 * h1.times["bubble"]
    assert zbv.times["pipeline"] == pytest.approx(2 * h1.times["pipeline"])
    assert zbv.step_time_s - (zbv.times["pipeline"] - h1.times["pipeline"]) < h1.step_time_s
    assert dpv.step_time_s == pytest.approx(zbv.step_time_s, abs=1e-6)
    assert dpv.memory_per_gpu_bytes > zbv.memory_per_gpu_bytes
    v = planned["zbv"].rank_gb
    assert v[0] == max(v) > max(v[1:]) == min(v[1:])
    assert v[0] < planned["zb-h1"].rank_gb[-1] == max(planned["zb-h1"].rank_gb)
    for name in ("zbv", "dualpipev"):
        assert "rank 0 (chunks 0 and" in best[name].memory.label


def test_min_gpus_tries_only_the_depths_a_v_can_run():
    """DualPipeV with 16 micro-batches runs on at most pp = 8 ranks (m >= 2 pp), and GPT-3
    does not fit on 8 x 8 GPUs of 80 GB: the error names pp=8, not the 96 layers."""
    with pytest.raises(ValueError, match="up to tp=8, pp=8:"):
        memory.min_gpus("GPT-3 175B", (64, 2048), "adam", "bf16", microbatches=16,
                        schedule="dualpipev")
    found = memory.min_gpus("GPT-3 175B", (64, 2048), "adam", "bf16", microbatches=32,
                            schedule="dualpipev")
    assert 2 * found.pp <= 32 and found.breakdown.fits
