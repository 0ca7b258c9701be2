"""CommBytes: PyTorch's CommDebugMode with payload bytes, checked against the toy backend's log.

The toy backend logs every transfer on the wire, independently of PyTorch's dispatcher:
read back into collectives (``collective_calls``), it says how many ran in each phase, of
which kind, and how big each tensor was. CommDebugMode's counts and CommBytes' bytes must
say the same.
"""
import pickle
from collections import Counter

import pytest
import torch
import torch.distributed as dist

from parlab.launch import run
from parlab.tensor_parallel import collective_wire_bytes
from parlab.tensor_parallel.debug import CommBytes
from parlab.experiments import calls_table, collective_calls, run_attention


def _short(counts: dict) -> dict:
    """CommDebugMode's op names ('c10d_functional.all_reduce') as the toy log names them."""
    return {op.rsplit(".", 1)[-1]: n for op, n in counts.items()}


@pytest.mark.parametrize("prepare_input", [True, False])
def test_counts_and_bytes_equal_the_toy_log_per_phase(prepare_input):
    c = run_attention("pytorch", backend="toy", prepare_input=prepare_input)
    assert set(c.info["comm_counts"]) == set(c.traffic) == {"forward", "backward"}
    for phase, log in c.traffic.items():
        calls = collective_calls(log)  # the wire's view: one entry per collective
        assert calls, phase
        assert _short(c.info["comm_counts"][phase]) == dict(Counter(k.op for k in calls)), phase
        # CommBytes' records, in call order, carry the tensors the wire log implies
        assert c.info["collectives"][phase] == [(k.op, k.payload) for k in calls], (
            phase, calls_table(calls))
    assert collective_wire_bytes(c.info["collectives"], 2) == c.total_bytes()
    # without PrepareModuleInput, each of q, k, v all-reduces its own input gradient
    assert sum(c.info["comm_counts"]["backward"].values()) == (1 if prepare_input else 3)


def test_gloo_sees_the_same_collectives_as_toy():
    toy, gloo = (run_attention("pytorch", backend=b) for b in ("toy", "gloo"))
    for key in ("collectives", "comm_counts", "comm_table"):
        assert gloo.info[key] == toy.info[key], key
    torch.testing.assert_close(gloo.parallel["output"], toy.parallel["output"])


def _section(table: str, module: str) -> list[str]:
    """The stripped lines under ``module`` in CommDebugMode's table, up to the next module."""
    lines = table.splitlines()
    start = [ln.strip() for ln in lines].index(module)
    depth = len(lines[start]) - len(lines[start].lstrip())
    out = []
    for line in lines[start + 1:]:
        indent = len(line) - len(line.lstrip())
        if line.strip() and not line.strip().startswith(("*", "FORWARD", "BACKWARD")) \
                and indent <= depth + 4:
            break
        out.append(line.strip())
    return [ln for ln in out if ln]


def test_table_names_the_modules_and_their_collectives():
    c = run_attention("pytorch", backend="toy", prepare_input=False)
    table = c.info["comm_table"]
    assert "\x1b" not in table  # colour codes stripped
    # RowwiseParallel all-reduces out_proj's output in the forward pass (Megatron's g) ...
    assert _section(table, "SelfAttention.out_proj") == [
        "FORWARD PASS", "*c10d_functional.all_reduce: 1"]
    # ... and each ColwiseParallel projection all-reduces its input gradient backward (f)
    for name in ("q_proj", "k_proj", "v_proj"):
        assert _section(table, f"SelfAttention.{name}") == [
            "BACKWARD PASS", "*c10d_functional.all_reduce: 1"], name
    assert _section(table, "Global")[:4] == [
        "FORWARD PASS", "*c10d_functional.all_reduce: 1",
        "BACKWARD PASS", "*c10d_functional.all_reduce: 3"]


def test_the_result_is_plain_data_that_pickles():
    c = run_attention("pytorch", backend="toy")
    back = pickle.loads(pickle.dumps(c.info))
    for key in ("collectives", "comm_counts", "comm_table"):
        assert back[key] == c.info[key], key
    assert isinstance(back["comm_table"], str)
    assert all(isinstance(op, str) and isinstance(n, int)
               for counts in back["comm_counts"].values() for op, n in counts.items())
    assert run_attention("megatron", backend="toy").info["comm_counts"] is None


def _redistribute_rank():
    """An all-gather, a reduce-scatter and an all-reduce issued by DTensor under CommBytes."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    local = torch.arange(12.0).reshape(4, 3) + dist.get_rank()
    with CommBytes() as comm:  # from_local moves nothing; each redistribute one collective
        gathered = DTensor.from_local(local, mesh, [Shard(0)]).redistribute(mesh, [Replicate()])
        scattered = DTensor.from_local(local, mesh, [Partial()]).redistribute(mesh, [Shard(0)])
        summed = DTensor.from_local(local, mesh, [Partial()]).redistribute(mesh, [Replicate()])
    return (comm.records, comm.phases, {str(k): v for k, v in comm.get_comm_counts().items()},
            gathered.to_local(), scattered.to_local(), summed.to_local())


def test_payload_is_the_whole_tensor_for_gathers_and_scatters():
    # gloo: the toy backend cannot run DTensor's functional all-gather and reduce-scatter
    # under torch 2.13 (its group has no per-device backend), so the sizes are checked by hand
    results = run(_redistribute_rank, 2, backend="gloo")
    records, phases, counts, gathered, scattered, summed = results[0]
    local = torch.arange(12.0).reshape(4, 3)
    torch.testing.assert_close(gathered, torch.cat([local, local + 1]))
    torch.testing.assert_close(summed, 2 * local + 1)
    torch.testing.assert_close(scattered, (2 * local + 1)[:2])
    piece = 4 * 3 * 4  # fp32 bytes of each rank's tensor; the all-gather assembles two
    assert records == [("all_gather", 2 * piece), ("reduce_scatter", piece),
                       ("all_reduce", piece)]
    assert phases == ["forward"] * 3
    assert counts == {"c10d_functional.all_gather_into_tensor": 1,
                      "c10d_functional.reduce_scatter_tensor": 1,
                      "c10d_functional.all_reduce": 1}  # CommDebugMode's own counts, intact
    # 2 ranks, both together: in the all-gather each sends its whole piece; in the
    # reduce-scatter the half of its piece it does not keep; the all-reduce does both steps
    wire = {"all_gather": 2 * piece, "reduce_scatter": 2 * (piece // 2),
            "all_reduce": 2 * (piece // 2) + 2 * (piece // 2)}
    assert collective_wire_bytes({"all": records}, 2) == {"all": sum(wire.values())}


def test_bad_noise_level_is_a_clear_error():
    with pytest.raises(ValueError, match=r"noise_level must be one of \[0, 1, 2, 3\], got 7"):
        CommBytes().table(7)
