"""Figure 8-1's byte count: a tensor's own bytes (not its storage's), A1 with a peer against
one GPU alone, and which of the book's "model parameters" really are parameters."""
import pytest
import torch

from parlab.models import BookMLP, bytes_by_scaling, held_bytes, tensor_bytes
from parlab.experiments import book_step

SIZES = (4, 5, 5, 2)


def _floats_held(sizes, batch, peer):
    """Count by hand, float by float: per-sample rows, per-weight copies, one lr per layer."""
    widths = sizes[1:]
    weights = sum(a * b + b for a, b in zip(sizes, sizes[1:]))
    per_sample = (sizes[0] + sizes[-1]              # x and its targets
                  + sum(widths)                      # z of every layer
                  + sum(widths[:-1])                 # y (the linear output's y is its z)
                  + sum(widths))                     # E of every layer
    copies = 4 if peer else 3                        # W and b, local grads, [remote], Δ
    return batch * per_sample + copies * weights + len(widths)


def test_a_view_counts_its_own_elements_and_held_bytes_counts_its_storage():
    x = torch.zeros(8, 4)
    half = x[:4]
    assert tensor_bytes(half) == 4 * 4 * 4 == 64
    assert tensor_bytes(x[:, :1]) == 8 * 4          # a strided view: 8 elements
    assert tensor_bytes(torch.zeros(3, dtype=torch.float64)) == 24

    class Holder:
        def __init__(self, t):
            self.t = t
    assert held_bytes(Holder(half)) == 128          # the view keeps all of x alive


@pytest.mark.parametrize("peer", [False, True])
def test_figure_8_1_rows_count_the_data_a1_trains_on(peer):
    mlp = book_step(SIZES, batch=8, with_peer=peer)
    rows = {r.key: r for r in mlp.memory_rows() if r.layer == "input"}
    samples = 4 if peer else 8
    assert rows["x"].nbytes == samples * SIZES[0] * 4
    assert rows["target"].nbytes == samples * SIZES[-1] * 4
    total = sum(r.nbytes for r in mlp.memory_rows())
    assert total == 4 * _floats_held(SIZES, samples, peer)
    assert total == held_bytes(mlp)                 # A1 keeps its own copy of its half


def test_a1_with_a_peer_holds_less_than_one_gpu_alone_and_why():
    alone = bytes_by_scaling(book_step(SIZES, batch=8, with_peer=False))
    a1 = bytes_by_scaling(book_step(SIZES, batch=8, with_peer=True))
    weights = 4 * sum(a * b + b for a, b in zip(SIZES, SIZES[1:]))
    assert a1["batch"] * 2 == alone["batch"]                 # half the samples
    assert a1["parameters"] - alone["parameters"] == weights  # one more copy: remote grads
    assert a1["constant"] == alone["constant"] == 4 * 3      # one learning rate per layer
    assert sum(a1.values()) < sum(alone.values())


def test_a_step_on_a_view_lists_fewer_bytes_than_it_keeps_alive():
    g = torch.Generator().manual_seed(0)
    x, t = torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)
    mlp = BookMLP(SIZES)
    mlp.step(x[:4], t[:4])
    listed = sum(r.nbytes for r in mlp.memory_rows())
    assert held_bytes(mlp) - listed == (4 * 4 + 4 * 2) * 4   # the other half of x and t


def test_only_w_and_b_are_parameters():
    mlp = book_step(SIZES, batch=8, with_peer=True)
    module_params = sum(p.numel() for p in mlp.to_torch().parameters())
    rows = mlp.memory_rows()
    w_b = sum(r.nbytes for r in rows if r.key in ("W", "b")) // 4
    assert module_params == w_b == sum(a * b + b for a, b in zip(SIZES, SIZES[1:]))
    others = {r.key for r in rows if r.nbytes and r.key not in ("W", "b")}
    assert {"z", "y", "E", "local_grad_W", "remote_grad_W", "lr", "delta_W"} <= others


def test_the_datasets_stay_in_host_memory_and_a_step_gets_one_batch():
    from parlab.experiments import datasets_and_batch
    where = datasets_and_batch(sizes=SIZES, train_samples=1000, test_samples=200, batch=8)
    per_sample = (SIZES[0] + SIZES[-1]) * 4                 # x and target, fp32
    assert where["train_bytes"] == 1000 * per_sample
    assert where["test_bytes"] == 200 * per_sample
    assert where["batch_bytes"] == 8 * per_sample
    assert where["batch_shapes"] == ((8, SIZES[0]), (8, SIZES[-1]))
    # training keeps x and each hidden layer's activations (the linear layers share them)
    assert where["saved_training"] == 8 * (SIZES[0] + sum(SIZES[1:-1])) * 4
    assert where["saved_evaluation"] == 0
