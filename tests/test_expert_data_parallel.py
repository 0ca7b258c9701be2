"""Expert parallelism composed with data parallelism (dp 4 = 2 expert-data x ep 2), equal to one
process, and the mesh arithmetic that carves the expert groups out of the data-parallel ranks."""
import pytest
import torch

from parlab.comm import Mesh
from parlab.hybrid import MoEBlock, run_expert_data
from parlab.models import MoEConfig


def test_expert_groups_are_carved_out_of_the_data_parallel_ranks():
    assert Mesh(dp=4).expert_ranks(2) == {"expert": [[0, 1], [2, 3]],
                                           "expert_data": [[0, 2], [1, 3]]}
    # with tensor parallelism inside each copy, the data lines are strided by tp
    assert Mesh(dp=4, tp=2).expert_ranks(2) == {
        "expert": [[0, 2], [4, 6], [1, 3], [5, 7]],
        "expert_data": [[0, 4], [2, 6], [1, 5], [3, 7]]}
    with pytest.raises(ValueError, match="ep=3 must divide dp=4"):
        Mesh(dp=4).expert_ranks(3)


@pytest.mark.parametrize("backend", ["gloo", "toy"])
def test_expert_and_data_parallel_equal_one_process(backend):
    config = MoEConfig(8, 16, 4, top_k=2, capacity_factor=1.0, shared_experts=1)
    result = run_expert_data(config, dp=4, ep=2, backend=backend)
    assert result.max_error < 1e-6
    for rank, params in enumerate(result.ranks):  # each rank holds its run's half of the experts
        held = sorted({int(n.split(".")[2]) for n in params if ".experts." in n})
        assert held == ([0, 1] if rank % 2 == 0 else [2, 3])
        assert "moe.router.gate.weight" in params and "proj.weight" in params
    # the case drops tokens (capacity counted per rank's 8 tokens) and training moved the weights
    assert result.dropped > 0
    assert not torch.equal(result.reference["proj.weight"], MoEBlock(config).proj.weight)
    if backend == "toy":  # each strategy on its own groups
        labels = {(t.op, t.group) for t in result.traffic.records}
        assert ("all_to_all", "expert") in labels
        assert ("all_reduce", "expert_data") in labels and ("all_reduce", "world") in labels
        assert not {g for op, g in labels if op == "all_to_all"} - {"expert"}
