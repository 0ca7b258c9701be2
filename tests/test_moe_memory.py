"""The memory calculator on MoE layers: a trace without values assumes an even load; expert
parallelism divides the experts' model states over ``ep`` GPUs and nothing else."""
import pytest
import torch

from parlab import memory
from parlab.models import MoE, MoEConfig, build_model, get_config


def _states_bytes(model, ep):
    """fp32 parameters one GPU holds: everything, the experts divided by ep (by hand)."""
    experts = {id(p) for m in model.modules() if isinstance(m, MoE)
               for p in m.experts.parameters()}
    return 4 * sum(p.numel() // ep if id(p) in experts else p.numel()
                   for p in model.parameters())


def test_moe_estimate_equals_measurement_without_dropping():
    """Without a capacity, every token's k assignments are computed wherever they go, so an
    even load (the estimate's assumption) saves the same bytes as the real routing."""
    moe = MoE(MoEConfig(64, 128, 8, top_k=2))
    estimated, measured = memory.estimate(moe, (16, 64)), memory.measure(moe, (16, 64))
    assert estimated.activations == measured.activations
    assert estimated.parameters == measured.parameters == _states_bytes(moe, 1)


def test_moe_estimate_bounds_measurement_with_dropping():
    moe = MoE(MoEConfig(64, 128, 8, top_k=2, capacity_factor=1.0))
    x = torch.randn(16, 64)
    moe(x)
    assert moe.last.dropped > 0  # the real routing drops, the even load does not
    estimated, measured = memory.estimate(moe, (16, 64)), memory.measure(moe, (16, 64))
    assert measured.activations < estimated.activations
    assert moe.last is not None  # the estimate's trace left the last real pass in place


@pytest.mark.parametrize("ep", [1, 2, 4])
def test_expert_parallelism_divides_only_the_experts_model_states(ep):
    small = get_config("Mixtral-8x7B").replace(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                               d_ff=48, vocab=64, n_experts=4,
                                               experts_per_token=2)
    model = build_model(small)
    ids = torch.randint(0, 64, (8, 16))
    b = memory.estimate(model, optimizer="adam", dp=4, ep=ep, example_input=ids,
                        loss_fn=lambda out, idx: out.float().square().mean())
    assert b.parameters == _states_bytes(model, ep)
    assert b.optimizer_state == 2 * b.parameters  # Adam's two fp32 moments
    assert f"ep={ep}" in b.label or ep == 1


def test_min_gpus_with_expert_parallelism_tries_only_dp_that_ep_divides():
    moe = MoE(MoEConfig(64, 128, 8, top_k=2))
    plan = memory.min_gpus(moe, (16, 64), ep=4, gpu_memory_gb=0.0005)
    assert plan.dp % 4 == 0 and plan.breakdown.fits


def test_moe_memory_bad_input_is_named():
    moe = MoE(MoEConfig(64, 128, 8, top_k=2))
    with pytest.raises(ValueError, match="ep=3 does not divide n_experts=8"):
        memory.estimate(moe, (12, 64), dp=3, ep=3)
    with pytest.raises(ValueError, match="ep=2 must divide dp=1"):
        memory.estimate(moe, (16, 64), ep=2)
    with pytest.raises(ValueError, match="ep must be a positive integer"):
        memory.estimate(moe, (16, 64), ep=0)
    with pytest.raises(ValueError, match="ep=2: expert parallelism is modelled for a torch.nn"):
        memory.estimate("GPT-3 175B", (8, 128), dp=2, ep=2)
    with pytest.raises(ValueError, match="has no MoE layer"):
        memory.estimate(torch.nn.Linear(4, 4), (8, 4), dp=2, ep=2)
