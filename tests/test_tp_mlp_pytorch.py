"""The Megatron MLP through PyTorch's API (ColwiseParallel fc1, RowwiseParallel fc2) beside ours.

The reference is computed here, on one process, from the recipe the runs document
(``torch.manual_seed(seed)`` then fc1 and fc2 as ``nn.Linear``; input and loss weights from
a generator seeded ``seed + 1``), with plain autograd. The collectives are read from the toy
backend's log, which sees every message on the wire whoever issued it.
"""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from parlab.comm import ring_wire_bytes
from parlab.launch import run
from parlab.tensor_parallel import collective_wire_bytes, dtensor_mlp
from parlab.experiments import collective_calls, run_mlp

D, FF, B, S = 8, 32, 2, 4


def _reference(seed=0, d=D, ff=FF, batch=B, seq=S):
    """Output and every gradient of gelu(x W1^T + b1) W2^T + b2 under loss sum(out * w)."""
    torch.manual_seed(seed)
    fc1, fc2 = nn.Linear(d, ff), nn.Linear(ff, d)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch, seq, d, generator=g).requires_grad_()
    w = torch.randn(batch, seq, d, generator=g)
    W1, b1, W2, b2 = (p.detach().clone().requires_grad_() for p in
                      (fc1.weight, fc1.bias, fc2.weight, fc2.bias))
    out = F.gelu(x @ W1.T + b1) @ W2.T + b2
    (out * w).sum().backward()
    return {"output": out.detach(), "x.grad": x.grad, "fc1.weight.grad": W1.grad,
            "fc1.bias.grad": b1.grad, "fc2.weight.grad": W2.grad, "fc2.bias.grad": b2.grad}


def _assert_equal_to_reference(c, **sizes):
    want = _reference(**sizes)
    assert set(c.parallel) == set(want)
    for name, tensor in want.items():
        torch.testing.assert_close(c.parallel[name], tensor, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("backend", ["gloo", "toy"])
def test_pytorch_mlp_equals_one_process(backend):
    c = run_mlp(backend=backend, variant="pytorch")
    _assert_equal_to_reference(c)
    # the shards DTensor kept on A1: fc1 by output rows, fc2 by input columns, bias of fc2 whole
    specs = c.info["specs"][0]
    assert (specs["fc1.weight"].dim, specs["fc1.weight"].start, specs["fc1.weight"].stop) == (0, 0, 16)
    assert (specs["fc2.weight"].dim, specs["fc2.weight"].start, specs["fc2.weight"].stop) == (1, 0, 16)
    assert specs["fc2.bias"] is None


def test_pytorch_and_ours_issue_the_same_collectives_with_the_same_bytes():
    ours, theirs = (run_mlp(backend="toy", variant=v) for v in ("megatron", "pytorch"))
    _assert_equal_to_reference(ours)
    x_bytes = B * S * D * 4  # every collective carries a tensor of the input's size
    for phase in ("forward", "backward"):
        calls = {name: [(k.op, k.payload) for k in collective_calls(c.traffic[phase])]
                 for name, c in (("ours", ours), ("theirs", theirs))}
        assert calls["ours"] == calls["theirs"] == [("all_reduce", x_bytes)], phase
        # what PyTorch's CommDebugMode saw is what crossed the wire
        assert theirs.info["collectives"][phase] == calls["theirs"], phase
        assert theirs.info["comm_counts"][phase] == {"c10d_functional.all_reduce": 1}, phase
    wire = 2 * (2 - 1) * x_bytes  # ring all-reduce on 2 ranks: every rank sends (N-1)/N twice
    assert ours.bytes_by_op() == theirs.bytes_by_op() == {
        "forward": {"all_reduce": wire}, "backward": {"all_reduce": wire}}
    assert collective_wire_bytes(theirs.info["collectives"], 2) == theirs.total_bytes()
    # ours has no CommDebugMode report
    assert ours.info["collectives"] is None and ours.info["comm_table"] is None


def test_comm_table_files_the_forward_all_reduce_under_fc2_and_the_backward_under_fc1():
    table = run_mlp(backend="toy", variant="pytorch").info["comm_table"]
    lines = [ln.strip() for ln in table.splitlines()]
    fc1, fc2 = lines.index("MLP.fc1"), lines.index("MLP.fc2")
    assert lines[fc1 + 1:fc1 + 3] == ["BACKWARD PASS", "*c10d_functional.all_reduce: 1"]
    assert lines[fc2 + 1:fc2 + 3] == ["FORWARD PASS", "*c10d_functional.all_reduce: 1"]


def test_four_ranks_and_another_seed():
    c = run_mlp(d_model=6, d_ff=24, batch=3, seq=2, world_size=4, backend="toy", seed=3,
                variant="pytorch")
    _assert_equal_to_reference(c, seed=3, d=6, ff=24, batch=3, seq=2)
    x_bytes = 3 * 2 * 6 * 4
    assert c.total_bytes() == {"forward": ring_wire_bytes("all_reduce", x_bytes, 4),
                               "backward": ring_wire_bytes("all_reduce", x_bytes, 4)}
    assert c.total_bytes()["forward"] == 2 * 3 * x_bytes  # 2 (N-1) S over all ranks, by hand


def _sequential_rank():
    """An nn.Sequential MLP parallelized by name ("0" colwise, "2" rowwise), plus ours."""
    from parlab.tensor_parallel import TensorParallelMLP, dtensor_local_grads
    from parlab.tensor_parallel.debug import CommBytes
    torch.manual_seed(0)
    seq = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1)).requires_grad_()
    layer = dtensor_mlp(seq, column="0", row="2")
    with CommBytes() as comm:
        layer(x).pow(2).sum().backward()
    grads = dtensor_local_grads(layer)
    # our layers on the same weights, under the same PyTorch debug mode (gloo: c10d ops)
    named = nn.Module()
    named.fc1, named.fc2 = seq[0], seq[2]
    ours = TensorParallelMLP.from_mlp(named)
    y = x.detach().clone().requires_grad_()
    with CommBytes() as ours_comm:
        ours(y).pow(2).sum().backward()
    return {"x.grad": x.grad, "grads": grads, "records": comm.by_phase(),
            "ours": ours_comm.by_phase(), "ours_x.grad": y.grad, "rank": dist.get_rank()}


def test_a_plain_sequential_is_parallelized_by_layer_names():
    results = run(_sequential_rank, 2, backend="gloo")
    torch.manual_seed(0)
    seq = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1)).requires_grad_()
    seq(x).pow(2).sum().backward()
    for r in results:
        torch.testing.assert_close(r["x.grad"], x.grad)
        torch.testing.assert_close(r["ours_x.grad"], x.grad)
        rows = slice(4 * r["rank"], 4 * r["rank"] + 4)
        torch.testing.assert_close(r["grads"]["0.weight"][0], seq[0].weight.grad[rows])
        torch.testing.assert_close(r["grads"]["2.weight"][0], seq[2].weight.grad[:, rows])
        torch.testing.assert_close(r["grads"]["2.bias"][0], seq[2].bias.grad)
        payload = 3 * 4 * 4
        expected = {"forward": [("all_reduce", payload)], "backward": [("all_reduce", payload)]}
        assert r["records"] == expected
        assert r["ours"] == expected  # PyTorch's debug mode sees our collectives alike on gloo


def test_bad_input_is_refused_before_any_rank_starts():
    with pytest.raises(ValueError, match=r"unknown variant 'dtensor'; choose one of "
                                         r"\['megatron', 'pytorch'\]"):
        run_mlp(variant="dtensor")
    with pytest.raises(ValueError, match=r"degree 3 does not divide the 32 hidden neurons of the "
                                         r"MLP \(d_ff\); valid degrees: \[1, 2, 4, 8, 16, 32\]"):
        run_mlp(d_ff=32, world_size=3, variant="pytorch")
    seq = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))
    with pytest.raises(ValueError, match=r"column='fc1' is not an nn.Linear of the module; its "
                                         r"linear layers are \['0', '2'\]"):
        dtensor_mlp(seq)
    with pytest.raises(ValueError, match=r"'0' gives 8 features but '0' takes 4"):
        dtensor_mlp(seq, column="0", row="0")
