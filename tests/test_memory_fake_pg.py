"""The memory estimate against what the package's tensor-parallel and ZeRO code allocates on one
rank of a large job, run on PyTorch's fake process group (issue 31, item 5).

:func:`parlab.experiments.measure_rank` makes this process one rank of a dp x pp x tp layout
(the fake group is created and destroyed inside each call), builds its stage on the meta device,
shards it with ``tensor_parallel.parallelize`` and ``sharded.Zero``, takes two Adam steps and
counts the parameters, gradients and optimizer state it holds. Each layout is checked on every
kind of rank: the first stage, a middle one and the last.

The reference is counted by hand here, from the config's widths, never from the measurement:
the elements of each ZeRO unit (a block, the embeddings, the head) and ZeRO's rule for each part.
Where the package builds what the estimate models, the measurement equals
``memory.estimate_ranks`` byte for byte; where it does not (the vocabulary tables whole on every
tensor rank; ZeRO's padding per unit instead of per stage), the difference is asserted to be
exactly that, counted by hand (the module docstring of ``parlab.experiments.ch05_fake_ranks``
explains both).
"""
import math

import pytest
import torch.distributed as dist

from parlab import memory
from parlab.experiments import fake_world, measure_rank
from parlab.models import get_config

SEQ = 4


def block(c, tp: int) -> int:
    """Elements of one Megatron block on one of ``tp`` ranks, weight by weight."""
    d, f = c.d_model, c.d_ff
    qkv = 3 * d * d // tp + 3 * d // tp
    out_proj = d * d // tp + d                 # row-parallel: the bias whole on every rank
    fc1 = d * f // tp + f // tp
    fc2 = f * d // tp + d
    norms = 2 * 2 * d                          # ln1, ln2: weight and bias
    return qkv + out_proj + fc1 + fc2 + norms


def units(c, tp: int, pp: int, stage: int) -> list[int]:
    """The ZeRO units of a stage, by hand: the package's tables are whole on every tensor rank."""
    blocks = [block(c, tp)] * (c.n_layers // pp)
    embeddings, head = c.vocab * c.d_model + c.context * c.d_model, 2 * c.d_model + c.vocab * c.d_model
    if pp == 1:   # one stage holds the tied table once: Zero makes the whole model one unit
        return [embeddings + sum(blocks) + 2 * c.d_model]
    return ([embeddings] if stage == 0 else []) + blocks + ([head] if stage == pp - 1 else [])


def zero_bytes(unit_sizes, dp: int, zero: int) -> dict[str, int]:
    """fp32 Adam's model states of flat units padded to multiples of dp (ZeRO stage ``zero``)."""
    whole = sum(unit_sizes)
    shards = sum(math.ceil(n / dp) for n in unit_sizes)
    flat = dp * shards                         # every unit's buffer, padded
    return {"parameters": 4 * (shards if zero == 3 else flat),
            "gradients": 4 * (shards if zero >= 2 else whole),
            "master_weights": 0,
            "optimizer_state": 8 * (shards if zero >= 1 else whole)}


def estimate_rule(n: int, dp: int, zero: int) -> dict[str, int]:
    """ZeRO's paper's rule for n parameters: one flat buffer, ceil(n / dp) per shard."""
    shard = math.ceil(n / dp)
    return {"parameters": 4 * (shard if zero == 3 else n),
            "gradients": 4 * (shard if zero >= 2 else n), "master_weights": 0,
            "optimizer_state": 8 * (shard if zero >= 1 else n)}


def table_excess(c, tp: int, pp: int, stage: int) -> int:
    """Elements the package's whole vocabulary tables hold beyond Megatron's ceil(vocab/tp) rows."""
    ends = (stage == 0) + (stage == pp - 1) if pp > 1 else 1
    return ends * (c.vocab - math.ceil(c.vocab / tp)) * c.d_model


# (model, dp, tp, pp, ZeRO stage); GPT-3 175B in Megatron-LM's layout (tp 8, pp 16) on 1024
# GPUs, a GPT-3 XL without tensor parallelism, one stage holding the whole tied model, and
# dp = 5, which does not divide d_model, so ZeRO's per-unit padding shows. Stage 0 (no ZeRO)
# is the by-hand test below.
LAYOUTS = [("GPT-3 175B", 8, 8, 16, 1), ("GPT-3 175B", 8, 8, 16, 3),
           ("GPT-3 XL", 4, 1, 4, 2), ("GPT-3 Small", 2, 1, 1, 3),
           ("GPT-3 175B", 5, 8, 16, 2)]


@pytest.mark.parametrize("name, dp, tp, pp, zero", LAYOUTS,
                         ids=[f"{n}-dp{d}-tp{t}-pp{p}-zero{z}" for n, d, t, p, z in LAYOUTS])
def test_each_kind_of_rank_holds_what_is_counted(name, dp, tp, pp, zero):
    c = get_config(name)
    estimated = memory.estimate_ranks(c, (dp, SEQ), "adam", "fp32", dp=dp, tp=tp, pp=pp,
                                      zero=zero)
    for stage in sorted({0, min(1, pp - 1), pp - 1}):
        measured = measure_rank(c, dp, tp, pp, zero, stage, seq=SEQ)
        mine = units(c, tp, pp, stage)
        assert list(measured.units) == mine
        assert measured.parts() == zero_bytes(mine, dp, zero)
        # the estimate: Megatron's vocabulary split, the stage's parameters one flat buffer
        n = sum(mine) - table_excess(c, tp, pp, stage)
        est = {k: getattr(estimated[stage], k) for k in measured.parts()}
        assert est == estimate_rule(n, dp, zero)
        if table_excess(c, tp, pp, stage) == 0 and all(u % dp == 0 for u in mine):
            assert measured.parts() == est     # built as the estimate models it: equal


def test_a_middle_stage_of_gpt3_175b_by_hand():
    """Megatron's layout for GPT-3 175B (tp 8, pp 16, dp 8, no ZeRO): a middle rank holds 96 /
    16 = 6 blocks of (12 d^2 + 3 d + d_ff) / 8 + 6 d elements (d = 12288, d_ff = 4 d: the
    split weights and biases, then the two whole biases and the two LayerNorms)."""
    c = get_config("GPT-3 175B")
    assert block(c, 8) == 226_576_896     # (1,811,939,328 + 36,864 + 49,152) / 8 + 73,728
    measured = measure_rank(c, 8, 8, 16, 0, 7, seq=SEQ)
    assert measured.parameters == 4 * 6 * 226_576_896
    assert measured.gradients == 4 * 6 * 226_576_896
    assert measured.optimizer_state == 8 * 6 * 226_576_896
    assert measured.parts() == {k: getattr(memory.estimate_ranks(
        c, (8, SEQ), "adam", "fp32", dp=8, tp=8, pp=16)[7], k) for k in measured.parts()}


def test_the_fake_group_is_gone_afterwards_and_refuses_to_nest():
    assert not dist.is_initialized()
    with fake_world(3, 4):
        assert dist.get_rank() == 3 and dist.get_world_size() == 4
        with pytest.raises(RuntimeError, match="already exists"):
            with fake_world(0, 2):
                pass
    assert not dist.is_initialized()
