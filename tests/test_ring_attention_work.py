"""Ring attention's causal work per rank, counted by PyTorch's FlopCounterMode (floating-point
operations of the matrix products, not wall time, which 4 ranks on 2 cores cannot show)."""
import pytest
import torch
import torch.distributed as dist
from torch.utils.flop_counter import FlopCounterMode

from parlab.context_parallel import ring_attention, shard
from parlab.launch import run

BATCH, HEADS, SEQ, D_HEAD = 1, 2, 32, 4


def _ring_flops(layout):
    r, n = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    q, k, v = (shard(torch.randn(BATCH, HEADS, SEQ, D_HEAD, generator=g), r, n, layout)
               for _ in range(3))
    with FlopCounterMode(display=False) as counter:
        ring_attention(q, k, v, causal=True, layout=layout)
    return counter.get_total_flops()


@pytest.mark.parametrize("world", [2, 4])
def test_ring_causal_work_per_rank_by_layout(world):
    chunk = SEQ // world
    block = 2 * 2 * BATCH * HEADS * chunk * chunk * D_HEAD  # QK^T and PV of one S/p block
    contiguous = run(_ring_flops, world, "contiguous")
    # rank r computes the r blocks before it and its diagonal block: the last does p times
    # the first (2p - 1 times, counting the diagonal block's unmasked half only)
    assert contiguous == [(r + 1) * block for r in range(world)]
    # zigzag: the diagonal block and half a block at each of the p - 1 other steps
    zigzag = run(_ring_flops, world, "zigzag")
    assert zigzag == [(world + 1) * block // 2] * world
    assert sum(zigzag) <= sum(contiguous)
