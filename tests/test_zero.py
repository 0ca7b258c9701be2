"""ZeRO stages 0-3 by hand and PyTorch's FSDP2, on real ranks, against one process training alone.

Each (stage, ranks, backend) runs once (module-scoped cache) and is checked three ways:
the parameters after every step equal plain single-process Adam written here with torch
only; the model-state bytes each rank held equal the ZeRO paper's formula, written here
independently; on the toy backend, the bytes each rank sent per step equal the closed
forms 2(N-1)/N Psi (stages 0-2) and 3(N-1)/N Psi (stage 3).
"""

import functools

import pytest
import torch
import torch.nn.functional as F

from parlab import sharded
from parlab.launch import preload
from parlab.memory import model_state_bytes

SPEC = sharded.ZeroSpec(sizes=(16, 32, 32, 8), samples=16, steps=3, lr=1e-2)
PSI_BYTES = 4 * (16 * 32 + 32 + 32 * 32 + 32 + 32 * 8 + 8)     # fp32 parameters
TOL = 1e-6
preload("torch.optim", "torch.distributed.fsdp")


@functools.cache
def torch_reference(spec=SPEC):
    """Per step: the loss and every layer's weight and bias end to end, one process, whole batch."""
    model = sharded.make_zero_model(spec)
    optimizer = torch.optim.Adam(model.parameters(), lr=spec.lr)
    out = []
    for step in range(spec.steps):
        x, y = sharded.make_zero_batch(spec, step)
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        layers = [torch.cat([m.weight.detach().reshape(-1), m.bias.detach()])
                  for m in model if isinstance(m, torch.nn.Linear)]
        out.append((loss.item(), layers))
    return out


@functools.cache
def zero_run(stage, n, backend):
    return sharded.train_zero(stage, n, SPEC, backend=backend)


@functools.cache
def fsdp_run(n, backend):
    return sharded.train_fsdp(n, SPEC, backend=backend)


def paper_bytes(stage, n, psi=PSI_BYTES):
    """Rajbhandari et al.: fp32 Adam keeps params psi, grads psi, two moments 2 psi; stage k
    divides the optimizer state (k>=1), gradients (k>=2) and parameters (k=3) by N."""
    return {"parameters": psi // n if stage == 3 else psi,
            "gradients": psi // n if stage >= 2 else psi,
            "optimizer_state": 2 * psi // n if stage >= 1 else 2 * psi}


def assert_equals_reference(run):
    for step, (loss, layers) in enumerate(torch_reference()):
        assert run.losses()[step] == pytest.approx(loss, abs=TOL)
        for mine, theirs in zip(run.parameters(step), layers):
            torch.testing.assert_close(mine, theirs, atol=TOL, rtol=0)


@pytest.mark.parametrize("backend", ["gloo", "toy"])
@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_stage_equals_single_process(stage, n, backend):
    assert_equals_reference(zero_run(stage, n, backend))


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_memory_per_rank_equals_paper_formula(stage, n):
    run = zero_run(stage, n, "gloo")
    for held in run.state_bytes():
        assert held == paper_bytes(stage, n)
        formula = model_state_bytes(SPEC.parameters, "adam", "fp32", n, stage)
        assert held == {k: v for k, v in formula.parts().items() if k != "master_weights"}


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_traffic_equals_closed_forms(stage, n):
    run = zero_run(stage, n, "toy")
    factor = 3 if stage == 3 else 2
    assert run.bytes_sent_per_step() == factor * (n - 1) * PSI_BYTES / n
    sent = run.log.per_rank()["sent"]
    assert set(sent) == {factor * (n - 1) * PSI_BYTES // n * SPEC.steps}   # every rank alike


def test_zero3_gathers_every_layer_twice_and_scatters_once():
    table = sharded.train_zero(3, 2, SPEC.replace(steps=1), backend="toy").collectives()
    layers = range(len(SPEC.sizes) - 1)
    for layer in layers:
        rows = table[table.layer == layer]
        assert sorted(zip(rows.collective, rows.phase)) == [
            ("all_gather", "backward"), ("all_gather", "forward"), ("reduce_scatter", "backward")]
    assert list(table.phase[:len(layers)]) == ["forward"] * len(layers)


@pytest.mark.parametrize("backend", ["gloo", "toy"])
@pytest.mark.parametrize("n", [2, 4])
def test_fsdp2_equals_single_process_and_ours(n, backend):
    run = fsdp_run(n, backend)
    assert_equals_reference(run)
    assert run.state_bytes() == zero_run(3, n, "gloo").state_bytes()


def test_fsdp2_moves_the_same_bytes_as_our_stage_3():
    assert fsdp_run(2, "toy").log.total_bytes() == zero_run(3, 2, "toy").log.total_bytes()
    ops = set(fsdp_run(2, "toy").log.to_pandas().op)
    assert ops == {"all_gather", "reduce_scatter"}


@pytest.mark.parametrize("bad, match", [
    (dict(stage=4), "stage must be one of"), (dict(stage=True), "stage must be one of"),
    (dict(world_size=3), "does not split evenly"), (dict(world_size=0), "world_size"),
])
def test_zero_bad_input_fails_before_any_rank_starts(bad, match):
    args = dict(stage=1, world_size=2) | bad
    with pytest.raises(ValueError, match=match):
        sharded.train_zero(args["stage"], args["world_size"], SPEC)


def test_zero_unknown_optimizer_is_named():
    with pytest.raises(ValueError, match="unknown optimizer 'lamb'"):
        sharded.ZeroSpec(optimizer="lamb")


def test_zero_flat_shard_pads_to_equal_shards():
    layer = torch.nn.Linear(3, 3)       # 12 parameters over 5 ranks: 3 each, 3 of padding
    shard = sharded.FlatShard(layer, rank=4, world_size=5, own_shard=True)
    assert (shard.numel, shard.shard_numel, shard.padded) == (12, 3, 15)
    assert shard.values().numel() == 0                   # rank 4 owns only padding
    expected = torch.cat([layer.weight.detach().reshape(-1), layer.bias.detach()])
    torch.testing.assert_close(shard.full[:12], expected)


def test_zero_exercises_accept_independent_answers_and_hide_them():
    from parlab.exercises import check

    psi, n = 7.5e9, 64
    stage_2_gb = (2 * psi + (2 + 12) * psi / n) / 1e9          # the paper's P_os+g
    assert check("06.1", stage_2_gb).ok is True
    for other in (120, 31.4, 1.875):                           # stages 0, 1, 3
        verdict = check("06.1", other)
        assert verdict.ok is False and f"{stage_2_gb:.3g}" not in verdict.message
    assert check("06.2", 3 * 3 / 4).ok is True
    assert check("06.2", 2 * 3 / 4).ok is False
    assert check("06.3", 14).ok is True                        # 16 x 70e9 / 80e9 = 14 exactly
    assert check("06.3", 15).ok is False and "14" not in check("06.3", 15).message
    assert check("06.3", 13).ok is False
    assert check("06.4", 4 / 3).ok is True                     # (2 + 4 + 2) / (2 + 4)
    assert check("06.4", 2).ok is False


def test_zero_exercise_06_5_runs_the_readers_code_and_counts_its_bytes():
    from parlab.exercises import check

    def halves(t):
        import torch
        import torch.distributed as dist
        piece = torch.empty(t.numel() // dist.get_world_size())
        dist.reduce_scatter_tensor(piece, t)
        dist.all_gather_into_tensor(t, piece)

    def cheat(t):
        import torch.distributed as dist
        dist.all_reduce(t)

    def half_only(t):
        import torch
        import torch.distributed as dist
        piece = torch.empty(t.numel() // dist.get_world_size())
        dist.reduce_scatter_tensor(piece, t)

    assert check("06.5", halves).ok is True
    assert "all_reduce" in check("06.5", cheat).message
    assert check("06.5", half_only).ok is False


def test_zero_in_the_planner_shrinks_memory_and_stage_3_costs_more_data_time():
    from parlab.hybrid import evaluate
    layouts = {z: evaluate("GPT-3 175B", 16, 8, 8, 96, zero=z) for z in range(4)}
    memory = [layouts[z].memory_per_gpu_bytes for z in range(4)]
    assert memory == sorted(memory, reverse=True) and memory[0] > memory[3]
    data = [layouts[z].times["data"] for z in range(4)]
    assert data[0] == data[1] == data[2] and data[3] == pytest.approx(1.5 * data[0])
    with pytest.raises(ValueError, match="zero must be one of"):
        evaluate("GPT-3 175B", 16, 8, 8, 96, zero=4)


def test_all_stages_in_one_launch_equal_separate_launches():
    """train_stages runs stages 0-3 and FSDP2 one after another in the same ranks, clearing
    the toy log between them: each run must equal its own launch, byte for byte."""
    from parlab.sharded import train_fsdp, train_stages, train_zero, zero_reference, ZeroSpec

    together = train_stages(2, backend="toy")
    apart = [train_zero(stage, 2, backend="toy") for stage in range(4)] + [train_fsdp(2, backend="toy")]
    ref = zero_reference(ZeroSpec())
    for one, other in zip(together, apart):
        assert one.stage == other.stage
        assert one.state_bytes() == other.state_bytes()
        assert one.log.matrix().tolist() == other.log.matrix().tolist()
        assert len(one.log) == len(other.log) > 0
        assert one.collectives().equals(other.collectives())
        assert one.max_difference(ref) < 1e-5
