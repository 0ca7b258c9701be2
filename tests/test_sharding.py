"""parlab.tensor_parallel.sharding: who owns which slice, printed, cut and glued back, with clear errors."""
import pytest
import torch

from parlab.tensor_parallel import (
    balanced_ranges, check_degree, describe, divisors, even_ranges, merge, shard_spec, split
)


def test_rows_and_columns_cut_and_merge_back():
    t = torch.arange(48.0).view(6, 8)
    for kind, dim in (("rows", 0), ("columns", 1)):
        specs = shard_spec("W", t.shape, kind, 2)
        pieces = split(t, specs)
        assert [s.dim for s in specs] == [dim, dim]
        assert pieces[0].shape == specs[0].local_shape
        assert torch.equal(merge(pieces, specs), t)
        assert torch.equal(merge(pieces[::-1], specs[::-1]), t)  # order of the list is free


def test_heads_are_whole_and_printed():
    specs = shard_spec("W_Q", (8, 8), "heads", 2, n_heads=4, owners=["A1", "A2"])
    assert [(s.start, s.stop) for s in specs] == [(0, 4), (4, 8)]
    assert specs[1].units == (2, 4)
    text = describe(specs)
    assert "W_Q rank 0 (A1): heads 0-1 of 4 [dim 0, 0:4] -> local (4, 8)" in text
    q = torch.randn(2, 3, 8)  # an activation: heads along the last dim
    specs = shard_spec("Q", q.shape, "heads", 4, n_heads=4, dim=-1)
    assert all(s.local_shape == (2, 3, 2) for s in specs)
    assert torch.equal(merge(split(q, specs), specs), q)
    assert "head 3" in str(specs[3])


def test_vocabulary_ranges_are_balanced_when_the_vocabulary_does_not_divide():
    ranges = balanced_ranges(50257, 8)
    sizes = [b - a for a, b in ranges]
    assert ranges[0][0] == 0 and ranges[-1][1] == 50257
    assert max(sizes) - min(sizes) == 1 and sum(sizes) == 50257
    table = torch.randn(11, 3)
    specs = shard_spec("E", table.shape, "vocab", 3)
    assert [s.local_shape[0] for s in specs] == [4, 4, 3]
    assert torch.equal(merge(split(table, specs), specs), table)
    assert "token ids 0-3 of 11" in str(specs[0])


def test_neurons_split_like_figure_8_19_and_biases_follow():
    specs = shard_spec("W H1", (6, 4), "neurons", 2, owners=["A1", "B1"])
    assert [(s.start, s.stop, s.owner) for s in specs] == [(0, 3, "A1"), (3, 6, "B1")]
    bias = specs[1].bias()
    assert bias.shape == (6,) and (bias.start, bias.stop) == (3, 6) and bias.local_shape == (3,)
    with pytest.raises(ValueError, match="its bias is not split"):
        shard_spec("W_O", (6, 4), "columns", 2)[0].bias()
    assert str(specs[1]).startswith("W H1 rank 1 (B1): neurons 3-5 of 6")


def test_bad_degrees_name_the_value_and_the_valid_ones():
    with pytest.raises(ValueError,
                       match=r"degree 3 does not divide the 8 heads; "
                             r"valid degrees: \[1, 2, 4, 8\]"):
        shard_spec("W_Q", (64, 64), "heads", 3, n_heads=8)
    with pytest.raises(ValueError, match="3 ranks for 2 neurons: more ranks than neurons"):
        shard_spec("W", (2, 4), "neurons", 3)
    with pytest.raises(ValueError, match="more ranks than token ids"):
        shard_spec("E", (3, 4), "vocab", 4)
    with pytest.raises(ValueError, match="positive integer"):
        check_degree(0, 8, "heads")
    with pytest.raises(ValueError, match="unknown kind"):
        shard_spec("W", (4, 4), "diagonal", 2)
    with pytest.raises(ValueError, match="needs n_heads"):
        shard_spec("W", (4, 4), "heads", 2)
    assert even_ranges(6, 3) == [(0, 2), (2, 4), (4, 6)] and divisors(12) == [1, 2, 3, 4, 6, 12]


def test_merge_rejects_pieces_that_do_not_fit():
    t = torch.randn(4, 6)
    specs = shard_spec("W", t.shape, "columns", 2)
    pieces = split(t, specs)
    with pytest.raises(ValueError, match="piece has shape"):
        merge([pieces[0], pieces[1][:, :2]], specs)
    with pytest.raises(ValueError, match="do not tile"):
        merge([pieces[0], pieces[0]], [specs[0], specs[0]])
    with pytest.raises(ValueError, match="spec is for shape"):
        specs[0].take(torch.randn(5, 6))
