"""Chapter 01 says 64 GPUs for GPT-3, chapter 05 128 per model copy: one assumption at a time."""
from parlab import memory
from parlab.experiments import copy_sizes
from parlab.models import GPT3_175B


def test_both_counts_hold_under_their_own_assumptions():
    few, same, fewest, recomputed, planner = copy_sizes("GPT-3 175B")
    assert (few.gpus, few.memory.fits) == (64, True)
    assert few.bubble > 0.9                       # one micro-batch: the pipeline mostly idles
    assert (same.tp, same.pp) == (few.tp, few.pp) and not same.memory.fits
    assert same.bubble < 0.05
    # 1F1B keeps pp micro-batches on the first stage: pp times one micro-batch's activations
    one = memory.estimate(GPT3_175B, (1, 2048), "adam", "bf16", tp=same.tp, pp=same.pp,
                          microbatches=1).activations
    assert same.memory.activations == same.pp * one
    assert few.gpus < fewest.gpus < planner.gpus == 128
    assert 1024 % fewest.gpus or 96 % fewest.pp   # the planner cannot use that copy size
    assert recomputed.gpus < fewest.gpus and recomputed.memory.fits
    assert planner.memory.fits and 1024 % planner.gpus == 0 and 96 % planner.pp == 0
    assert all(r.label in r.row() for r in (few, same, fewest, recomputed, planner))


def test_copy_table_has_one_header_and_a_row_per_size():
    from parlab.experiments import copy_table
    rows = copy_sizes("GPT-3 175B")
    lines = copy_table(rows).splitlines()
    assert lines[0].split()[:2] == ["job", "GPUs"] and lines[1:] == [r.row() for r in rows]
    assert rows[1].sequences == 1536 and rows[0].sequences == 8  # chapter 05's step; 01's 8


def test_depth_table_shows_every_part_and_the_one_that_stays():
    from parlab.experiments import depth_table
    lines = depth_table("GPT-3 175B", tp=8, depths=(8, 16, 32)).splitlines()
    assert lines[0].split()[-6:] == ["pp", "8", "pp", "16", "pp", "32"]
    rows = {line[:18].strip(): [float(v) for v in line[18:].split()] for line in lines[1:]}
    assert list(rows) == ["parameters", "gradients", "optimizer state", "master weights",
                          "activations", "total"]
    # 1F1B: pp micro-batches of L/pp layers on the first stage, L layers' worth whatever pp
    assert len(set(rows["activations"])) == 1
    for part in ("parameters", "gradients", "optimizer state", "master weights"):
        a, b, c = rows[part]
        assert a > b > c and 1.7 < a / b < 2.0    # about half as many layers per stage
    for column in range(3):
        parts = sum(values[column] for name, values in rows.items() if name != "total")
        assert abs(parts - rows["total"][column]) <= 0.3   # printed to 0.1 GB each
