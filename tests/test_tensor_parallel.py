"""Tensor-parallel layers and attention: equal to one device (outputs and gradients), and the
bytes the toy backend logs equal the formulas of parlab.tensor_parallel.counting."""
import pytest
import torch
import torch.distributed as dist

from parlab.comm import ring_wire_bytes
from parlab.tensor_parallel import counting
from parlab.launch import run
from parlab.tensor_parallel import collective_wire_bytes
from parlab.experiments import run_attention
from parlab.experiments import run_embedding, run_layer_strategy, run_mlp

BACKENDS = ["gloo", "toy"]


def measured(comparison) -> dict:
    """{phase: {op: bytes}} without empty phases' missing keys."""
    return {phase: ops for phase, ops in comparison.bytes_by_op().items()}


def assert_matches(comparison):
    assert set(comparison.parallel) == set(comparison.reference)
    assert comparison.max_error < 1e-5, (comparison.name, comparison.max_error)


def _comm_rank():
    """Each conjugate pair of parlab.tensor_parallel.mappings on a small tensor; returns the input gradients."""
    from parlab.tensor_parallel import mappings as tp_comm
    r, n = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    full = torch.randn(3, 4, generator=g)  # the same tensor on every rank
    w = [torch.randn(3, 4, generator=g) for _ in range(n)]  # w[r]: rank r's own use of it
    grads = {}

    def grad_of(name, x, op, weight):
        x = x.clone().requires_grad_()
        (op(x) * weight).sum().backward()
        grads[name] = x.grad

    mine = full.chunk(n, -1)[r]
    grad_of("copy_to_region", full, tp_comm.copy_to_region, w[r])
    grad_of("reduce_from_region", full, tp_comm.reduce_from_region, w[0])
    grad_of("gather_from_region", mine, tp_comm.gather_from_region, w[0])
    grad_of("scatter_to_region", full, tp_comm.scatter_to_region, w[0].chunk(n, -1)[r])
    grad_of("gather_for_use", mine, tp_comm.gather_for_use, w[r])
    grad_of("broadcast_from", full if r == 0 else torch.zeros_like(full),
            tp_comm.broadcast_from, w[r])
    return grads, w


def test_each_communication_pair_has_the_right_backward():
    results = run(_comm_rank, 2, backend="toy")
    w = results[0][1]
    total = w[0] + w[1]  # a tensor that two ranks use differently gets both uses' gradients
    for r, (grads, _) in enumerate(results):
        expected = {"copy_to_region": total, "reduce_from_region": w[0],
                    "gather_from_region": w[0].chunk(2, -1)[r],
                    "scatter_to_region": w[0], "gather_for_use": total.chunk(2, -1)[r],
                    "broadcast_from": total if r == 0 else torch.zeros_like(total)}
        for name, want in expected.items():
            assert torch.allclose(grads[name], want, atol=1e-6), (r, name)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("variant", ["book", "megatron"])
def test_attention_variants_equal_one_device(variant, backend):
    c = run_attention(variant, backend=backend)
    assert_matches(c)
    assert {"output", "x.grad", "q_proj.weight.grad", "k_proj.bias.grad",
            "out_proj.weight.grad", "out_proj.bias.grad"} <= set(c.parallel)
    if backend == "toy":
        assert measured(c) == counting.attention_bytes(variant, 2, 4, 8, n=2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_pytorch_api_equals_one_device_and_issues_one_all_reduce_each_way(backend):
    c = run_attention("pytorch", backend=backend)
    assert_matches(c)
    payload = 2 * 4 * 8 * 4  # batch x seq x d_model x fp32
    calls = c.info["collectives"]  # as PyTorch's dispatcher saw them
    assert calls == {"forward": [("all_reduce", payload)], "backward": [("all_reduce", payload)]}
    if backend == "toy":  # DTensor's collectives ran on the toy backend and are in its log
        assert measured(c) == counting.attention_bytes("pytorch", 2, 4, 8, n=2)
        assert c.total_bytes() == collective_wire_bytes(calls, 2)
    # without declaring the input replicated, each ColwiseParallel all-reduces its own
    # input gradient: three all-reduces in the backward pass
    unprepared = run_attention("pytorch", backend=backend, prepare_input=False)
    assert_matches(unprepared)
    assert unprepared.info["collectives"]["backward"] == [("all_reduce", payload)] * 3
    if backend == "toy":
        assert unprepared.total_bytes() == collective_wire_bytes(unprepared.info["collectives"], 2)


def test_books_way_splits_inside_a_head_and_on_four_ranks():
    one_head = run_attention("book", n_heads=1, backend="toy")
    assert_matches(one_head)
    assert measured(one_head) == counting.attention_bytes("book", 2, 4, 8, n=2)
    four = run_attention("book", d_model=12, n_heads=3, world_size=4, backend="toy")
    assert_matches(four)
    assert measured(four) == counting.attention_bytes("book", 2, 4, 12, n=4)


def test_books_backward_with_reduce_scatter_moves_less():
    c = run_attention("book", backend="toy", grad_sync="reduce_scatter")
    assert_matches(c)
    predicted = counting.attention_bytes("book", 2, 4, 8, grad_sync="reduce_scatter")
    assert measured(c) == predicted
    chapter = counting.total(counting.attention_bytes("book", 2, 4, 8))
    assert counting.total(predicted)["backward"] < chapter["backward"]


def test_megatron_moves_fewer_bytes_than_the_book_at_gpt3_size():
    book = counting.total(counting.attention_bytes("book", 1, 2048, 12288, n=8, element=2))
    megatron = counting.total(counting.attention_bytes("megatron", 1, 2048, 12288, n=8, element=2))
    assert book["forward"] > 2 * megatron["forward"]
    assert book["backward"] > 2 * megatron["backward"]


def test_attention_bad_degrees_are_clear_errors():
    with pytest.raises(ValueError,
                       match=r"degree 2 does not divide the 3 attention heads; "
                             r"valid degrees: \[1, 3\]"):
        run_attention("megatron", d_model=6, n_heads=3, world_size=2)
    with pytest.raises(ValueError, match=r"degree 3 does not divide the 8 features"):
        run_attention("book", world_size=3)
    with pytest.raises(ValueError, match="more ranks than attention heads"):
        run_attention("pytorch", n_heads=1)
    with pytest.raises(ValueError, match="unknown variant"):
        run_attention("zigzag")


def test_reference_attention_is_the_models_attention():
    from parlab.models.transformer import Attention
    from parlab.tensor_parallel import SelfAttention
    torch.manual_seed(3)
    theirs = Attention(8, 2)
    ours = SelfAttention.from_module(theirs)
    x = torch.randn(2, 5, 8)
    assert torch.allclose(ours(x), theirs(x), atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_megatron_mlp_equals_one_device_with_one_all_reduce_each_way(backend):
    c = run_mlp(backend=backend)
    assert_matches(c)
    if backend == "toy":
        S = 2 * 4 * 8 * 4
        assert measured(c) == {"forward": {"all_reduce": 2 * S}, "backward": {"all_reduce": 2 * S}}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["broadcast", "vocab"])
def test_embeddings_equal_one_device(kind, backend):
    c = run_embedding(kind, vocab=11, world_size=3, backend=backend)
    assert_matches(c)
    if backend == "toy":
        S = 2 * 3 * 4 * 4  # the looked-up vectors
        expected = ({"forward": {"broadcast": 2 * S}, "backward": {"reduce": 2 * S + 2 * S / 3}}
                    if kind == "broadcast"
                    else {"forward": {"all_reduce": 4 * S}, "backward": {"all_reduce": 4 * S}})
        assert measured(c) == expected


def test_embedding_errors():
    with pytest.raises(ValueError, match="more ranks than token ids"):
        run_embedding("vocab", vocab=2, world_size=3)
    with pytest.raises(ValueError, match="unknown embedding"):
        run_embedding("hashed")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("strategy", ["data", "partition_output", "reduce_output"])
def test_slide_strategies_equal_one_device_and_move_the_predicted_bytes(strategy, backend):
    c = run_layer_strategy(strategy, batch=4, c_in=6, c_out=10, backend=backend)
    assert_matches(c)
    if backend == "toy":
        got = measured(c)
        assert got == counting.strategy_bytes(strategy, 4, 6, 10)
        # the slide's term, in bytes: the one collective of data parallelism, the output
        # all-gather of partition-output, the input-gradient all-gather of reduce-output
        term = counting.slide_costs(4, 6, 10)[strategy] * 4
        slide_op = {"data": ("backward", "all_reduce", 2),
                    "partition_output": ("forward", "all_gather", 1),
                    "reduce_output": ("backward", "all_gather", 1)}[strategy]
        phase, op, factor = slide_op
        assert got[phase][op] == factor * term


def test_strategy_errors():
    with pytest.raises(ValueError, match=r"degree 4 does not divide the 6 input features"):
        run_layer_strategy("reduce_output", c_in=6, world_size=4)
    with pytest.raises(ValueError, match="unknown strategy"):
        run_layer_strategy("pipeline")
    with pytest.raises(ValueError, match="no formula"):
        ring_wire_bytes("gossip", 8, 2)
