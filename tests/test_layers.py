"""BookMLP: the hand-written step equals autograd, and its table accounts for every byte."""
import pytest
import torch

from parlab.models import BookMLP, book_table, held_bytes


def _data(sizes, batch=6, seed=1, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, sizes[0], generator=g, dtype=dtype),
            torch.randn(batch, sizes[-1], generator=g, dtype=dtype))


@pytest.mark.parametrize("activation", ["relu", "sigmoid", "tanh"])
def test_forward_and_backward_match_autograd(activation):
    sizes = (4, 6, 5, 3)
    mlp = BookMLP(sizes, activation=activation, lr=0.05, dtype=torch.float64)
    x, t = _data(sizes)
    ref = mlp.to_torch()
    linears = [m for m in ref if isinstance(m, torch.nn.Linear)]
    zs = []
    for linear in linears:
        linear.register_forward_hook(lambda mod, inp, out: (out.retain_grad(), zs.append(out))[1])
    out = ref(x)
    loss = torch.nn.functional.mse_loss(out, t)
    loss.backward()
    W_before = [layer.W.clone() for layer in mlp.layers]

    assert mlp.step(x, t) == pytest.approx(loss.item(), rel=1e-12)
    for layer, linear, z, W0 in zip(mlp.layers, linears, zs, W_before):
        assert torch.allclose(layer.z, z, atol=1e-12)
        assert torch.allclose(layer.E, z.grad, atol=1e-12)
        assert torch.allclose(layer.local_grad_W, linear.weight.grad, atol=1e-12)
        assert torch.allclose(layer.local_grad_b, linear.bias.grad, atol=1e-12)
        assert torch.allclose(layer.delta_W, -0.05 * linear.weight.grad, atol=1e-12)
        assert torch.allclose(layer.W, W0 + layer.delta_W)
        assert layer.remote_grad_W is None


def test_remote_gradients_make_a_data_parallel_step_equal_to_one_big_batch():
    sizes = (3, 4, 2)
    x, t = _data(sizes, batch=8)
    whole = BookMLP(sizes, dtype=torch.float64)
    whole.step(x, t)
    a, b = BookMLP(sizes, dtype=torch.float64), BookMLP(sizes, dtype=torch.float64)
    b.forward(x[4:])
    b.backward(t[4:])
    a.step(x[:4], t[:4], exchange=lambda local: b.local_grads(), world_size=2)
    for la, lw, lb in zip(a.layers, whole.layers, b.layers):
        assert torch.equal(la.remote_grad_W, lb.local_grad_W)
        assert torch.allclose(la.W, lw.W, atol=1e-12)   # mean of halves = whole-batch mean


def test_table_total_equals_the_bytes_the_object_holds():
    sizes = (4, 5, 5, 2)
    mlp = BookMLP(sizes)
    x, t = _data(sizes, batch=4, dtype=torch.float32)
    mlp.step(x, t)
    rows = mlp.memory_rows()
    total = sum(r.nbytes for r in rows)
    assert total == held_bytes(mlp)
    # the linear output layer's y is its z: one storage, counted once
    shared = [r for r in rows if r.note.startswith("same memory")]
    assert [(r.layer, r.item[:2]) for r in shared] == [("layer 3", "c)")]
    z_bytes = sum(r.nbytes for r in rows if r.item.startswith("b)"))
    assert z_bytes == 4 * 4 * (5 + 5 + 2)
    assert book_table(mlp).splitlines()[-1].split()[-1] == str(total)
    assert all(r.nbytes == 0 and r.note == "absent (no peers)"
               for r in rows if r.item.startswith("f)"))


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="positive integers"):
        BookMLP((4, -2, 1))
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        BookMLP((4, 2), activation="swish")
    mlp = BookMLP((4, 2))
    with pytest.raises(ValueError, match=r"shape \(batch, 4\)"):
        mlp.forward(torch.zeros(3, 5))
    with pytest.raises(RuntimeError, match="before apply"):
        mlp.apply()
    mlp.forward(torch.zeros(3, 4))
    mlp.backward(torch.zeros(3, 2))
    with pytest.raises(ValueError, match="needs remote gradients"):
        mlp.apply(world_size=2)
