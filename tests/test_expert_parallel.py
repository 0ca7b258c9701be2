"""Expert parallelism on real ranks against the same MoE layer in one process.

Each rank routes its own tokens (capacity counted over them, as in the reference's groups),
sends every kept assignment to the rank that holds its expert and gets the outputs back.
Several SGD steps: the router and the shared expert are replicated, so their gradients are
summed over the ranks; each expert's gradient is complete on its one rank.
"""
import pytest
import torch
import torch.distributed as dist

from parlab.comm import all_to_all
from parlab.expert_parallel import (
    apply_expert_parallel, dispatch_bytes, local_experts, routed_bytes,
    tensor_parallel_expert_bytes
)
from parlab.experiments import example_layer
from parlab.launch import RankError, run
from parlab.models import MoE, MoEConfig

TOKENS, D, STEPS, LR = 12, 8, 3, 0.1

#: (name, config, layout, skewed): the skewed router sends most first choices to expert 0
#: and never picks the last expert, so capacity drops tokens and one split is zero.
CASES = [
    ("top2", MoEConfig(D, 16, 4, top_k=2), "uneven", False),
    ("top2-drop", MoEConfig(D, 16, 4, top_k=2, capacity_factor=1.0), "uneven", False),
    ("top2-skew-drop", MoEConfig(D, 16, 4, top_k=2, capacity_factor=1.0), "uneven", True),
    ("top2-skew-drop-padded", MoEConfig(D, 16, 4, top_k=2, capacity_factor=1.0), "capacity",
     True),
    ("switch-skew", MoEConfig(D, 16, 4, top_k=1, router="switch"), "uneven", True),
    ("deepseek-shared-drop", MoEConfig(D, 16, 8, top_k=2, router="deepseek",
                                       capacity_factor=1.25, shared_experts=1), "uneven", False),
]


def _data(n, skewed):
    torch.manual_seed(1)
    # skewed: positive inputs, so the router rows set in _model decide the first and last place
    x = torch.rand(STEPS, n * TOKENS, D) if skewed else torch.randn(STEPS, n * TOKENS, D)
    return x, torch.randn(STEPS, n * TOKENS, D)


def _model(config, skewed):
    return example_layer(config, skewed)  # skewed: expert 0's router row raised, the last sunk


def _train(moe, x, w, groups, sync=lambda moe: None):
    opt = torch.optim.SGD(moe.parameters(), lr=LR)
    outs, loads, dropped = [], [], 0
    for step in range(STEPS):
        opt.zero_grad()
        out = moe(x[step], groups=groups)
        (out * w[step]).sum().backward()
        sync(moe)
        opt.step()
        outs.append(out.detach())
        loads.append(moe.last.load)
        dropped += moe.last.dropped
    return outs, loads, dropped


def _sum_replicated(moe):
    for name, p in moe.named_parameters():
        if not name.startswith("experts."):
            dist.all_reduce(p.grad)


def _ep_rank(cases):
    n, r = dist.get_world_size(), dist.get_rank()
    results = {}
    for name, config, layout, skewed in cases:
        x, w = _data(n, skewed)
        mine = slice(r * TOKENS, (r + 1) * TOKENS)
        moe = apply_expert_parallel(_model(config, skewed), layout=layout)
        outs, loads, dropped = _train(moe, x[:, mine], w[:, mine], 1, _sum_replicated)
        results[name] = {"outs": outs, "loads": loads, "dropped": dropped,
                         "params": {k: v.detach() for k, v in moe.named_parameters()}}
    return results


def _global_name(name, rank, config, n):
    if not name.startswith("experts."):
        return name
    _, i, rest = name.split(".", 2)
    return f"experts.{local_experts(config.n_experts, n, rank)[int(i)]}.{rest}"


@pytest.mark.parametrize("backend, n", [("gloo", 2), ("gloo", 4), ("toy", 2), ("toy", 4)])
def test_expert_parallel_equals_one_process(backend, n):
    ranks = run(_ep_rank, n, CASES, backend=backend)
    for name, config, _, skewed in CASES:
        x, w = _data(n, skewed)
        ref = _model(config, skewed)
        outs, loads, dropped = _train(ref, x, w, n)
        for step in range(STEPS):
            got = torch.cat([rank[name]["outs"][step] for rank in ranks])
            assert (got - outs[step]).abs().max().item() < 1e-5, (name, step)
            assert sum(rank[name]["loads"][step] for rank in ranks).tolist() == \
                loads[step].tolist(), (name, step)
        assert sum(rank[name]["dropped"] for rank in ranks) == dropped, name
        want = dict(ref.named_parameters())
        for rank, result in enumerate(ranks):
            for pname, p in result[name]["params"].items():
                ref_p = want[_global_name(pname, rank, config, n)]
                assert (p - ref_p).abs().max().item() < 1e-5, (name, rank, pname)
        if "drop" in name:
            assert dropped > 0, name  # the case really drops tokens
        if skewed:  # the last expert gets nothing: a zero split on the wire
            assert all(load[-1].item() == 0 for load in loads), name


def _non_contiguous(n):
    r = dist.get_rank()
    torch.manual_seed(r)
    base = torch.randn(5, 2 * n, requires_grad=True)
    x = base.t()  # rows of x are columns of base: not contiguous
    splits_in = [(r + s) % 3 for s in range(n)]
    rows = sum(splits_in)
    x = x[:rows]
    splits_out = [(s + r) % 3 for s in range(n)]  # what rank s sends me
    out = all_to_all(x, splits_out, splits_in)
    weight = torch.arange(out.numel(), dtype=torch.float32).view(out.shape).t().contiguous().t()
    (out * weight).sum().backward()
    return x.detach(), out.detach(), base.grad, splits_in


@pytest.mark.parametrize("backend", ["gloo", "toy"])
def test_expert_all_to_all_moves_rows_and_gradients_of_non_contiguous_tensors(backend):
    n = 3
    ranks = run(_non_contiguous, n, n, backend=backend)
    for r, (_, out, grad, _) in enumerate(ranks):
        want = []
        for s, (x_s, _, _, splits_s) in enumerate(ranks):
            start = sum(splits_s[:r])
            want.append(x_s[start:start + splits_s[r]])
        assert torch.equal(out, torch.cat(want))
        # d(loss)/d(x) on rank r: the weights its rows met on the ranks they went to
        _, _, _, splits_r = ranks[r]
        expected = torch.zeros(5, 2 * n)
        row = 0
        for s in range(n):
            _, out_s, _, _ = ranks[s]
            weight = torch.arange(out_s.numel(), dtype=torch.float32).view(out_s.shape)
            start = sum((r2 + s) % 3 for r2 in range(r))  # rows from ranks before r on s
            for i in range(splits_r[s]):
                expected[:, row] = weight[start + i]
                row += 1
        assert torch.equal(grad, expected)


def test_expert_parallel_bad_input_is_named():
    with pytest.raises(ValueError, match="n_experts=6 does not split over ep=4 ranks"):
        local_experts(6, 4, 0)

    def uneven_experts():
        apply_expert_parallel(MoE(MoEConfig(D, 16, 3)))
    with pytest.raises(RankError, match="n_experts=3 does not split over ep=2 ranks"):
        run(uneven_experts, 2)

    def padded_without_capacity():
        moe = apply_expert_parallel(MoE(MoEConfig(D, 16, 4)), layout="capacity")
        moe(torch.zeros(4, D))
    with pytest.raises(RankError, match="needs MoEConfig.capacity_factor"):
        run(padded_without_capacity, 2)


def _route_once(config, skewed, layout="uneven"):
    n, r = dist.get_world_size(), dist.get_rank()
    x, _ = _data(n, skewed)
    moe = apply_expert_parallel(_model(config, skewed), layout=layout)
    with torch.no_grad():
        moe(x[0, r * TOKENS:(r + 1) * TOKENS])
    return moe.last.routing.experts, moe.last.kept


@pytest.mark.parametrize("n", [2, 4])
def test_expert_dispatch_bytes_follow_the_routing(n):
    """Dispatch: rank s sends rank d one row of D floats per kept assignment to an expert of d;
    the combine sends as many back. From the toy log, against the ranks' own routing."""
    config = MoEConfig(D, 16, 4, top_k=2, capacity_factor=1.0)
    record = run(_route_once, n, config, True, backend="toy")
    log = record.traffic.filter(op="all_to_all")
    calls = sorted({t.call for t in log.records})
    assert len(calls) == 3  # counts, tokens out, outputs back
    owner = {e: rank for rank in range(n) for e in local_experts(4, n, rank)}
    want = {}
    for src, (experts, kept) in enumerate(record):
        for e in experts[kept].tolist():
            if owner[e] != src:
                want[src, owner[e]] = want.get((src, owner[e]), 0) + D * 4
    for src, (experts, kept) in enumerate(record):  # the package's count says the same
        sent = routed_bytes(experts, kept, 4, n, D)
        assert {(src, dst): b for dst, b in enumerate(sent) if b and dst != src} == \
            {key: b for key, b in want.items() if key[0] == src}
    for call, direction in ((calls[1], 1), (calls[2], -1)):
        got = {}
        for t in log.filter(call=call).records:
            got[(t.src, t.dst)[::direction]] = got.get((t.src, t.dst)[::direction], 0) + t.nbytes
        assert got == want
    counts = log.filter(call=calls[0]).records  # E_local int64 counts to every other rank
    assert {t.nbytes for t in counts} == {8 * 4 // n} and len(counts) == n * (n - 1)


def test_expert_dispatch_closed_form_and_what_sending_once_per_rank_saves():
    # an even routing: 8 tokens, top-2, 4 experts on 2 ranks, every expert chosen 4 times
    experts = torch.tensor([[0, 2], [1, 3], [2, 0], [3, 1]] * 2)
    kept = torch.ones_like(experts, dtype=torch.bool)
    sent = routed_bytes(experts, kept, 4, 2, D)
    # k T d b (n-1)/n: 2 x 8 x 8 x 4 x 1/2 bytes leave rank 0 (the rest stays home)
    assert sent[1] == dispatch_bytes(8, 2, D, 2) == 2 * 8 * D * 4 // 2
    # both choices on rank 1 (experts 2 and 3): sent once per rank, the token travels once
    twice = torch.tensor([[2, 3], [0, 1], [2, 0]])
    naive = routed_bytes(twice, torch.ones_like(twice, dtype=torch.bool), 4, 2, D)
    once = routed_bytes(twice, torch.ones_like(twice, dtype=torch.bool), 4, 2, D,
                        once_per_rank=True)
    assert naive == [3 * D * 4, 3 * D * 4] and once == [2 * D * 4, 2 * D * 4]
    # tensor-parallel experts instead: a ring all-reduce of T x d per layer, 2(n-1)/n of it
    assert tensor_parallel_expert_bytes(8, D, 4) == 2 * 3 / 4 * 8 * D * 4


def test_expert_fixed_capacity_buffers_cost_the_same_whatever_the_routing():
    """Capacity layout: every rank sends every other rank its E/n experts' buffers of C rows of
    D floats, padding included, in the dispatch and again in the combine; no counts first."""
    config = MoEConfig(D, 16, 4, top_k=2, capacity_factor=1.0)
    n, capacity = 4, -(-2 * TOKENS * 1 // 4)
    record = run(_route_once, n, config, True, "capacity", backend="toy")
    log = record.traffic.filter(op="all_to_all")
    calls = sorted({t.call for t in log.records})
    assert len(calls) == 2  # tokens out, outputs back
    for call in calls:
        pairs = {(t.src, t.dst): t.nbytes for t in log.filter(call=call).records}
        assert pairs == {(s, d): (4 // n) * capacity * D * 4
                         for s in range(n) for d in range(n) if s != d}


def test_expert_layer_step_counts_every_all_to_all_of_both_passes():
    """What chapter 07 compares with tensor-parallel experts: per rank, the forward pass sends
    the counts (E_local int64 to each peer), the dispatch (its kept rows to other ranks) and the
    combine (back every row it received); the backward pass the dispatch and combine again."""
    from parlab.experiments import run_expert_layer
    run = run_expert_layer()
    n = run.ranks
    for r in range(n):
        dispatch = sum(b for d, b in enumerate(run.routed[r]) if d != r)
        received = sum(run.routed[s][r] for s in range(n) if s != r)
        counts = (n - 1) * (4 // n) * 8
        assert run.sent["forward"][r] == counts + dispatch + received
        assert run.sent["backward"][r] == dispatch + received
