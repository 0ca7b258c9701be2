"""The CNN measurements behind the slides' advice (data parallel convs, tensor parallel FCs)."""
import pytest
import torch

from parlab.models import SmallCNN, communication_per_layer, profile, share_by_kind


@pytest.fixture(scope="module")
def profiles():
    return profile(SmallCNN(), (3, 32, 32), batch=8)


def test_convolutions_do_the_work_fully_connected_layers_hold_the_weights(profiles):
    shares = share_by_kind(profiles)
    assert 0.90 <= shares["conv"]["flops"] <= 0.96
    assert shares["conv"]["params"] <= 0.07
    assert shares["fc"]["params"] >= 0.93 and shares["fc"]["flops"] <= 0.10


def test_profile_counts_match_the_model(profiles):
    model = SmallCNN()
    assert sum(p.params for p in profiles) == sum(p.numel() for p in model.parameters())
    conv2 = next(p for p in profiles if p.name == "conv2")
    # a 3x3 conv: 2 FLOPs per multiply-add, forward + input grad + weight grad = 3 matmuls
    macs = 32 * 32 * 64 * 64 * 9 * 8
    assert conv2.flops == 3 * 2 * macs
    assert (conv2.input_elems, conv2.output_elems) == (64 * 32 * 32, 64 * 32 * 32)


def test_cheapest_strategy_per_layer_kind(profiles):
    rows = communication_per_layer(profiles, batch=8)

    def total(kind, key):
        return sum(r[key] for r in rows if r["kind"] == kind)

    tp = ("tp_partition_output", "tp_reduce_output")
    # summed over each kind, the slides' advice holds: replicate convs, shard the FC layers
    assert total("conv", "data_parallel") < min(total("conv", k) for k in tp)
    assert min(total("fc", k) for k in tp) < total("fc", "data_parallel")
    # the early, wide-image convolutions are data parallel's by a large margin
    assert [r["cheapest"] for r in rows[:4]] == ["data_parallel"] * 4
    fc1 = next(r for r in rows if r["layer"] == "fc1")
    assert fc1["data_parallel"] == (4096 * 2048 + 2048) * 4
    assert fc1["tp_partition_output"] == 8 * 2048 * 4


def test_data_parallel_bytes_do_not_depend_on_the_batch(profiles):
    small = communication_per_layer(profiles, batch=1)
    large = communication_per_layer(profiles, batch=64)
    assert [r["data_parallel"] for r in small] == [r["data_parallel"] for r in large]
    assert all(b["tp_partition_output"] == 64 * s["tp_partition_output"]
               for s, b in zip(small, large))


def test_bad_batch_is_a_clear_error():
    with pytest.raises(ValueError, match="positive number"):
        profile(SmallCNN(), (3, 32, 32), batch=0)
    with pytest.raises(ValueError, match="no Conv2d or Linear"):
        profile(torch.nn.ReLU(), (3,), batch=1)


@pytest.mark.parametrize("world_size", [2, 4])
def test_hybrid_data_and_tensor_parallel_step_equals_one_process(world_size):
    from parlab.hybrid import hybrid_step
    from parlab.hybrid.cnn_step import reference_step
    from parlab.launch import run

    reference = reference_step(batch=8)
    ranks = run(hybrid_step, world_size, 8)
    hidden = reference["fc1.bias"].numel()
    for name, value in reference.items():
        if name.startswith("conv"):
            for r in ranks:  # every replica holds the same, correct convolution weights
                torch.testing.assert_close(r[name], value, rtol=1e-5, atol=1e-6)
    stitched_w1 = torch.cat([r["fc1.weight"] for r in ranks], dim=0)
    stitched_b1 = torch.cat([r["fc1.bias"] for r in ranks])
    stitched_w2 = torch.cat([r["fc2.weight"] for r in ranks], dim=1)
    assert stitched_w1.shape[0] == hidden
    torch.testing.assert_close(stitched_w1, reference["fc1.weight"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stitched_b1, reference["fc1.bias"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stitched_w2, reference["fc2.weight"], rtol=1e-5, atol=1e-6)
    for r in ranks:
        torch.testing.assert_close(r["fc2.bias"], reference["fc2.bias"], rtol=1e-5, atol=1e-6)


def test_hybrid_rejects_a_batch_that_does_not_split():
    from parlab.hybrid import hybrid_step
    from parlab.launch import RankError, run
    with pytest.raises(RankError, match="does not split over 4 ranks"):
        run(hybrid_step, 4, 6)
