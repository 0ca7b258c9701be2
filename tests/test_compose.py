"""Strategies compose on one DeviceMesh without knowing about each other.

ZeRO (parlab.sharded.Zero) over the ``dp`` sub-mesh, Megatron's MLP
(parlab.tensor_parallel.TensorParallelMLP) over the ``tp`` sub-mesh, 2 x 2 toy ranks: every
ZeRO stage equals one process training the unsplit MLP; each rank holds the model-state
bytes ZeRO's rule gives for its *local* tensor-parallel pieces (counted here by hand from
the MLP's shape); and the toy log puts each strategy's bytes in its own group.
"""
import pytest

from parlab.hybrid import run_zero_tensor

D, FF, DP, TP, BATCH = 8, 32, 2, 2, 8
#: one tensor rank's piece of the MLP: fc1 rows (FF/TP x D) and bias, fc2 columns (D x FF/TP),
#: fc2's bias whole; fp32
LOCAL = (FF // TP * D + FF // TP + D * FF // TP + D) * 4
#: ZeRO with SGD (no optimizer state), after backward: parameters + gradients per rank
HELD = {0: 2 * LOCAL, 1: 2 * LOCAL, 2: LOCAL + LOCAL // DP, 3: 2 * LOCAL // DP}


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_over_dp_and_megatron_over_tp_equal_one_process(stage):
    run = run_zero_tensor(dp=DP, tp=TP, stage=stage, batch=BATCH)
    assert run.max_error < 1e-6
    assert run.held == [HELD[stage]] * (DP * TP)
    by_group = {}
    for rec in run.traffic.records:
        if rec.nbytes:
            by_group.setdefault(rec.group, {}).setdefault(rec.op, 0)
            by_group[rec.group][rec.op] += rec.nbytes
    # tensor: the forward all-reduce of fc2's partial sums (BATCH/DP rows x D floats) on each
    # rank; a ring of 2 sends the whole tensor once per rank; the input needs no gradient
    assert by_group["tensor"] == {"all_reduce": DP * TP * (BATCH // DP) * D * 4}
    # data: a ring all-reduce, or a reduce-scatter and all-gathers, of each rank's local pieces
    # among its DP copies: (DP-1)/DP of them per collective per rank; stage 3 gathers before
    # the forward, before the backward, and once more so the test can read the parameters
    piece = DP * TP * LOCAL * (DP - 1) // DP
    expected = {0: {"all_reduce": 2 * piece},
                1: {"reduce_scatter": piece, "all_gather": piece},
                2: {"reduce_scatter": piece, "all_gather": piece},
                3: {"reduce_scatter": piece, "all_gather": 3 * piece}}[stage]
    assert by_group["data"] == expected
