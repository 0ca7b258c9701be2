"""Context parallelism on real ranks against attention over the whole sequence in one process.

Ring, all-gather (Llama 3) and Ulysses (DeepSpeed) attention, each rank holding S/p tokens:
the output put back in sequence order, and the gradients of q, k and v, equal
``scaled_dot_product_attention`` on the whole sequence in float64, causal or not, for every
layout, on 2, 3 and 4 ranks, with gloo and with the toy backend. One launch per (backend,
ranks) runs every case (a launch costs more than all the arithmetic); its toy log gives each
rank's bytes per pass, held to the closed forms. Also the layouts' causal work, counted
against a brute-force mask.
"""
from functools import lru_cache

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from parlab.context_parallel import (
    LAYOUTS, all_gather_attention, all_gather_bytes, block_backward, block_forward, causal_pairs,
    positions, ring_attention, ring_bytes, shard, ulysses_attention, ulysses_bytes, unshard
)
from parlab.context_parallel.blocks import visible
from parlab.launch import RankError, run
from parlab.context_parallel import CP_METHODS as CONTEXT_FUNCTIONS

METHODS = {"ring": ring_attention, "gather": all_gather_attention, "ulysses": ulysses_attention}
TOL = 1e-10
BACKENDS, WORLDS = ("gloo", "toy"), (2, 3, 4)


def _gqa_shape(n):
    """(shape of q, key/value heads) for grouped-query Ulysses on n ranks: H_kv = n."""
    return {2: ((2, 4, 24, 4), 2), 3: ((2, 6, 24, 4), 3), 4: ((2, 8, 16, 4), 4)}[n]


def _plan(n):
    """Every case of one launch: (where, method, q shape, kv heads, causal, layout).

    Causal attention on every layout, and without the mask; all-gather and Ulysses also with
    grouped-query attention (fewer key/value heads). ``where``: "world"; the method's name
    (its causal zigzag case runs on a new group of every rank named for it, so that run's
    traffic stands alone in the toy log); "pairs" (on 4 ranks: ranks 0, 2 and 1, 3 as two
    groups, so ``group=`` is a subgroup and its peers' global ranks differ from theirs).
    """
    mha, (gqa, gqa_kv) = (2, 4, 24, 4), _gqa_shape(n)
    heads = gqa if n == 3 else mha  # 4 heads do not split over 3 ranks
    cases = {"ring": [(mha, 4, True, "zigzag"), (mha, 4, True, "contiguous"),
                      (mha, 4, True, "striped"), (mha, 4, False, "zigzag"),
                      (mha, 2, True, "contiguous")],
             "gather": [(mha, 2, True, "zigzag"), (mha, 4, True, "contiguous"),
                        (mha, 4, True, "striped"), (mha, 2, False, "contiguous"),
                        (mha, 4, False, "zigzag")],
             "ulysses": [(gqa, gqa_kv, True, "zigzag"), (heads, heads[1], True, "contiguous"),
                         (gqa, gqa_kv, True, "striped"), (gqa, gqa_kv, False, "contiguous"),
                         (heads, heads[1], False, "zigzag")]}
    plan = [(method if i == 0 else "world", method, *case)
            for method, runs in cases.items() for i, case in enumerate(runs)]
    if n == 4:
        plan += [("pairs", method, *runs[0]) for method, runs in cases.items()]
    return plan


def _inputs(shape, kv_heads, causal):
    """Whole-sequence q, k, v and the cotangent of the output (the same on every rank)."""
    g = torch.Generator().manual_seed(sum(shape) * 10 + kv_heads + causal)
    b, h, s, d = shape
    q = torch.randn(b, h, s, d, generator=g, dtype=torch.float64)
    k, v = (torch.randn(b, kv_heads, s, d, generator=g, dtype=torch.float64) for _ in range(2))
    return q, k, v, torch.randn(b, h, s, d, generator=g, dtype=torch.float64)


def _reference(shape, kv_heads, causal):
    """SDPA on the whole sequence: its output and the gradients of q, k and v."""
    *qkv, cotangent = _inputs(shape, kv_heads, causal)
    q, k, v = (t.requires_grad_() for t in qkv)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                         enable_gqa=shape[1] != kv_heads)
    (out * cotangent).sum().backward()
    return out.detach(), q.grad, k.grad, v.grad


def _rank(plan):
    n = dist.get_world_size()
    groups = {"world": None}
    for where, *_ in plan:  # every rank creates every group, in the same order
        if where not in groups and where != "pairs":
            groups[where] = dist.new_group(list(range(n)), group_desc=where)
    if any(where == "pairs" for where, *_ in plan):
        pairs = [dist.new_group([0, 2], group_desc="pair 0,2"),
                 dist.new_group([1, 3], group_desc="pair 1,3")]
        groups["pairs"] = pairs[dist.get_rank() % 2]
    results = []
    for where, method, shape, kv_heads, causal, layout in plan:
        group = groups[where]
        r, p = dist.get_rank(group), dist.get_world_size(group)
        *qkv, cotangent = _inputs(shape, kv_heads, causal)
        local = [shard(t, r, p, layout).requires_grad_() for t in qkv]
        out = METHODS[method](*local, causal=causal, layout=layout, group=group)
        (out * shard(cotangent, r, p, layout)).sum().backward()
        results.append((out.detach(), *(t.grad for t in local)))
    return results


@lru_cache(maxsize=None)
def _launch(backend, n):
    plan = _plan(n)
    return plan, run(_rank, n, plan, backend=backend)


def _errors(backend, n, method):
    """Per case of ``method``: the largest |difference| from SDPA of (out, dq, dk, dv)."""
    plan, record = _launch(backend, n)
    errors = {}
    for i, (where, m, shape, kv_heads, causal, layout) in enumerate(plan):
        if m != method:
            continue
        want = _reference(shape, kv_heads, causal)
        for ranks in ([0, 2], [1, 3]) if where == "pairs" else [range(n)]:
            got = [unshard([record[r][i][j] for r in ranks], layout) for j in range(4)]
            errors[(where, shape, kv_heads, causal, layout, tuple(ranks))] = \
                [(a - b).abs().max().item() for a, b in zip(got, want)]
    return errors


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("method", list(METHODS))
def test_attention_equals_sdpa_on_the_whole_sequence(method, n, backend):
    errors = _errors(backend, n, method)
    assert {case[4] for case in errors if case[3]} == set(LAYOUTS)  # causal, every layout
    assert any(not case[3] for case in errors)
    bad = {case: e for case, e in errors.items() if max(e) > TOL}
    assert not bad, f"out, dq, dk, dv differ from SDPA by: {bad}"


def test_ulysses_and_all_gather_cover_grouped_query_attention():
    for method in ("ulysses", "gather"):
        errors = _errors("gloo", 2, method)
        gqa = [e for case, e in errors.items() if case[1][1] == 4 and case[2] == 2]
        assert len(gqa) >= 2 and max(map(max, gqa)) < TOL


def _sent(log, src):
    return sum(t.nbytes for t in log.records if t.src == src)


@pytest.mark.parametrize("n", WORLDS)
def test_bytes_per_rank_per_pass_match_the_toy_log(n):
    """Each rank's bytes, forward and backward, on the named groups' runs: ring (p2p sends,
    each to the next rank; the first p - 1 of a pair are the forward's), all-gather (an
    all_gather forward, a reduce_scatter backward), Ulysses (four all-to-alls, two a pass)."""
    _, record = _launch("toy", n)
    log, element = record.traffic, 8  # float64
    shapes = {where: (shape, kv_heads) for where, _, shape, kv_heads, *_ in _plan(n)}

    def shard_bytes(method):  # this rank's (Q shard, K shard) in bytes
        (b, h, s, d), kv_heads = shapes[method]
        return b * h * s // n * d * element, b * kv_heads * s // n * d * element

    ring = log.filter(group="ring", op="send")
    assert {(t.src, t.dst) for t in ring.records} == {(r, (r + 1) % n) for r in range(n)}
    want = ring_bytes(shard_bytes("ring")[1], n)
    for r in range(n):
        mine = ring.filter(src=r).records
        assert sum(t.nbytes for t in mine if t.call < n - 1) == want["forward"]
        assert sum(t.nbytes for t in mine if t.call >= n - 1) == want["backward"]

    gather = log.filter(group="gather")
    assert {t.op for t in gather.records if t.nbytes} == {"all_gather", "reduce_scatter"}
    want = all_gather_bytes(shard_bytes("gather")[1], n)
    for r in range(n):
        assert _sent(gather.filter(op="all_gather"), r) == want["forward"]
        assert _sent(gather.filter(op="reduce_scatter"), r) == want["backward"]

    ulysses = log.filter(group="ulysses", op="all_to_all")
    calls = sorted({t.call for t in ulysses.records})
    assert len(calls) == 4
    q_bytes, kv_bytes = shard_bytes("ulysses")
    want = ulysses_bytes(q_bytes, n, kv_bytes)
    for r in range(n):
        forward = sum(_sent(ulysses.filter(call=c), r) for c in calls[:2])
        backward = sum(_sent(ulysses.filter(call=c), r) for c in calls[2:])
        assert (forward, backward) == (want["forward"], want["backward"])


def test_byte_formulas():
    b = 1000
    assert ring_bytes(b, 4) == {"forward": 6000, "backward": 6000 + 8000}
    assert all_gather_bytes(b, 4) == {"forward": 6000, "backward": 6000}
    assert ulysses_bytes(b, 4) == {"forward": 3000, "backward": 3000}
    assert ulysses_bytes(800, 4, 200) == {"forward": 1500, "backward": 1500}
    # sequence and ranks grow together (S/p, so the shard's bytes, fixed): Ulysses' bytes
    # per rank stay under 4b, all-gather's grow with p
    assert all(ulysses_bytes(b, p)["forward"] < 4 * b for p in (2, 4, 8, 64, 1024))
    assert all_gather_bytes(b, 64)["forward"] == 63 * all_gather_bytes(b, 2)["forward"]
    with pytest.raises(ValueError, match="shard_bytes must be a non-negative integer"):
        all_gather_bytes(-1, 2)
    with pytest.raises(ValueError, match="world must be a positive integer"):
        ulysses_bytes(8, 0)


def _too_many_ranks():
    q = torch.zeros(2, 4, 8, 4, dtype=torch.float64)
    kv = torch.zeros(2, 2, 8, 4, dtype=torch.float64)
    return ulysses_attention(q, kv, kv)


def test_ulysses_refuses_more_ranks_than_key_value_heads():
    with pytest.raises(RankError, match=r"2 key/value heads do not split evenly over 4 ranks.*"
                                        r"at most 2"):
        run(_too_many_ranks, 4, backend="gloo")


def _mismatched(method):
    """Rank 1 passes 6 tokens where rank 0 passes 4: a classic slip in a data loader."""
    tokens = 4 + 2 * dist.get_rank()
    q = torch.zeros(1, 2, tokens, 4, dtype=torch.float64)
    return CONTEXT_FUNCTIONS[method](q, q, q)


@pytest.mark.parametrize("backend", ["gloo", "toy"])
@pytest.mark.parametrize("method", ["ring", "all-gather", "ulysses"])
def test_sequence_shards_of_different_shapes_are_named_not_hung(method, backend):
    """Each method fails at once with every rank's shapes, on gloo and on the toy backend,
    instead of inside a collective (gloo's "Received data size doesn't match")."""
    with pytest.raises(RankError, match=r"same shapes.*rank 0: q \(1, 2, 4, 4\).*"
                                        r"rank 1: q \(1, 2, 6, 4\)"):
        run(_mismatched, 2, method, backend=backend, timeout=60)


def test_shapes_are_checked_before_any_transfer():
    q, k = torch.zeros(2, 4, 8, 4), torch.zeros(2, 3, 8, 4)
    for fn in (all_gather_attention, ulysses_attention):
        with pytest.raises(ValueError, match="3 key/value heads do not divide the 4 query"):
            fn(q, k, k)
        with pytest.raises(ValueError, match=r"got \(2, 4, 8, 4\), \(2, 4, 8, 4\), \(2, 4, 6"):
            fn(q, q, torch.zeros(2, 4, 6, 4))


# --------------------------------------------------------------------------- layouts

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("world", [1, 2, 3, 4, 6])
def test_causal_pairs_count_a_lower_triangular_mask(world, layout):
    seq = 24
    mask = torch.ones(seq, seq).tril()  # row i: the keys query i sees
    want = [int(mask[positions(seq, r, world, layout)].sum()) for r in range(world)]
    assert causal_pairs(seq, world, layout) == want
    assert sum(want) == seq * (seq + 1) // 2
    if layout == "zigzag":
        assert len(set(want)) == 1  # an early chunk and its mirror: the same work everywhere


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_contiguous_causal_blocks_last_rank_does_2p_minus_1_times_the_first(world):
    """Blocks of S/p by S/p, a diagonal (partly masked) block counted as half: rank r has r
    full blocks and one half, so the last rank does (p - 1/2) / (1/2) = 2p - 1 times rank 0."""
    seq = 4 * world
    pos = [positions(seq, r, world) for r in range(world)]

    def blocks(r):
        masks = [visible(pos[r], pos[s], True) for s in range(world)]
        return sum(1.0 if m.all() else 0.5 if m.any() else 0.0 for m in masks)

    counts = [blocks(r) for r in range(world)]
    assert counts == [r + 0.5 for r in range(world)]
    assert counts[-1] / counts[0] == 2 * world - 1
    zigzag = [positions(seq, r, world, "zigzag") for r in range(world)]
    assert len({sum(visible(zigzag[r], zigzag[s], True).float().mean().item()
                    for s in range(world)) for r in range(world)}) == 1


def test_block_math_takes_positions_on_the_cpu_for_tensors_elsewhere():
    """Ring attention keeps the positions on the CPU (it asks them which blocks to skip);
    the causal mask follows the scores to their device ("meta" stands in for a GPU here)."""
    q, pos = torch.zeros(2, 3, 4, 5, device="meta", dtype=torch.float64), torch.arange(4)
    out, lse = block_forward(q, q, q, pos, pos, True, 0.5)
    grads = block_backward(q, q, q, pos, pos, True, 0.5, q, lse, lse)
    assert out.device.type == lse.device.type == "meta"
    assert all(g.device.type == "meta" for g in grads)


def test_chapter_08_compares_the_three_methods_in_one_launch():
    """experiments.compare_methods: each method equal to one process, and each rank's bytes
    per pass (forward alone under no_grad, backward by difference) equal to the closed form;
    grouped-query attention sends only the key/value heads."""
    from parlab.experiments import compare_methods

    for runs in (compare_methods(), compare_methods(("ring", "all-gather"), kv_heads=2,
                                                    layout="contiguous")):
        for one in runs:
            assert max(one.errors.values()) < 1e-12, one
            for part in ("forward", "backward"):
                assert one.sent[part] == [one.closed_form[part]] * one.world, one
    ring, gathered = runs
    assert ring.closed_form["forward"] == gathered.closed_form["forward"]
    assert ring.closed_form["backward"] > gathered.closed_form["backward"]


def test_chapter_08_exercises_accept_the_answers_worked_by_hand():
    """08.1: 3 transfers x (K + V) of 4 tokens x 4 heads x 4 x 8 bytes; 08.2: 2p - 1 on 8
    ranks (a long sequence, within 1 %); 08.3: (p - 1)/p of Q, K, V and O shards of 1,024 B
    on 2 ranks. The classic slips get a hint, not a pass."""
    from parlab.exercises import check

    assert check("08.1", 3 * 2 * 4 * 4 * 4 * 8).ok is True
    assert check("08.1", 4 * 2 * 4 * 4 * 4 * 8).ok is False  # p transfers, not p - 1
    assert check("08.2", 15).ok is True
    assert check("08.2", 8).ok is False  # blocks computed, the diagonal counted whole
    assert check("08.3", 4 * 1024 // 2).ok is True
    assert check("08.3", 4 * 1024).ok is False


def _strided_gradient_rank():
    from parlab.context_parallel.allgather import _GatherRows

    r, n = dist.get_rank(), dist.get_world_size()
    x = (torch.arange(6.0).view(2, 3) + 10 * r).requires_grad_()
    gathered = _GatherRows.apply(x, None)                      # (2n, 3), rank order
    weights = torch.arange(6.0 * n).view(3, 2 * n) * (r + 1)   # this rank's loss weights
    (gathered.t() * weights).sum().backward()  # the gradient arrives transposed: strided
    return x.grad


@pytest.mark.parametrize("backend", BACKENDS)
def test_sequence_all_gather_backward_sums_a_strided_gradient(backend):
    """The regression the issue warns of (PyTorch's own all-gather backward on gloo got key
    and value gradients wrong for a strided gradient): each rank's rows get the sum over
    ranks of their gradient, here (1 + 2 + 3) times the transposed weights' rows."""
    n = 3
    base = torch.arange(6.0 * n).view(3, 2 * n).t()
    for r, grad in enumerate(run(_strided_gradient_rank, n, backend=backend)):
        assert torch.equal(grad, sum(range(1, n + 1)) * base[2 * r:2 * r + 2])
