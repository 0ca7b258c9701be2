"""Activation recomputation: the live-bytes tracker, a measured step with and without
checkpointed layers, and the estimate's recompute formulas checked against it."""
import pytest
import torch
from torch import nn

from parlab import memory
from parlab.models import BookMLP, build_model, count_parameters, GPT3_6_7B, TINY

B, T = 4, 16                        # a tiny GPT micro-batch: 4 sequences of 16 tokens
F32 = 4                             # bytes per fp32 element
LOSS = F32                          # the loss scalar: alive at the end of forward, never saved


def _mse_loss_bytes(output, target):
    """What the loss of F.mse_loss holds: on CPU a 0-dim view of its whole elementwise buffer
    (output.numel() floats, not one; the tracker found it)."""
    return torch.nn.functional.mse_loss(output, target).untyped_storage().nbytes()


def _tokens(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, TINY.vocab, (B, T), generator=g) for _ in "xt"]


@pytest.fixture(scope="module")
def gpt_runs():
    model = build_model(TINY, seed=0)
    x, t = _tokens()
    return {r: memory.measure_recompute(model, x, t, recompute=r) for r in memory.RECOMPUTE}


def _ffn_stack(d=32, layers=3):
    """Plain PyTorch: each layer Linear(d, 4d) -> GELU -> Linear(4d, d), as a transformer's FFN."""
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
                           for _ in range(layers)])


# --- the tracker, checked on its own ---------------------------------------------------------

def test_trace_counts_a_known_sequence_of_allocations():
    before = torch.zeros(100)                       # made before the trace: never counted
    with memory.Trace() as trace:
        a = torch.empty(1000)                       # 4000 B
        b = torch.ones(500, dtype=torch.float64)    # 4000 B
        assert trace.mark("a and b") == 8000
        view = b[2:10]                              # views and in-place ops make nothing new
        b.add_(1)
        before.mul_(2)
        before_view = before.view(10, 10)
        assert trace.current == 8000
        del a
        assert trace.current == 4000
        c = torch.cat([b, b])                       # 8000 B
        assert trace.current == 12000
        del b                                       # the view still holds b's storage
        assert trace.current == 12000
        del view
        assert trace.current == 8000
        d = before_view + 1                         # an op on an old tensor makes a new one
        assert trace.current == 8400
    assert (trace.peak, trace.marks) == (12000, {"a and b": 8000})
    del c, d                                        # after the trace: frozen
    assert trace.current == 8400


def test_trace_sees_what_autograd_holds_after_the_names_are_gone():
    x = torch.randn(1000, requires_grad=True)
    with memory.Trace() as trace:
        loss = x.exp().sum()        # exp keeps its output (4000 B) for the backward pass
        assert trace.current == 4000 + LOSS
        loss.backward()             # the saved output is freed, x.grad (4000 B) is made
    assert trace.current == 4000 + LOSS and x.grad is not None
    assert memory.live_bytes(lambda: torch.ones(10)).current == 40


def test_trace_agrees_with_the_saved_tensors_that_measure_counts(gpt_runs):
    # measure() counts the distinct storages autograd saved (a saved_tensors_hooks pair); the
    # tracker counts every storage made during the forward pass and still alive at its end.
    # Two differences, both exact: the token ids and targets are saved (embedding, loss) but
    # were made before the step, so the tracker leaves them out (input_bytes); the loss scalar
    # is alive but not saved.
    saved = memory.measure(TINY, (B, T), "sgd").activations
    plain = gpt_runs[None]
    assert plain.input_bytes == 2 * B * T * 8
    assert plain.activations + plain.input_bytes - LOSS == saved


# --- the measured step -----------------------------------------------------------------------

def test_full_recompute_keeps_only_each_blocks_input(gpt_runs):
    plain, full = gpt_runs[None], gpt_runs["full"]
    block = memory.activations_per_layer(TINY, B, T)["block 1"]  # = measured, test_memory.py
    block_input = B * T * TINY.d_model * F32
    assert full.activations == plain.activations - TINY.n_layers * (block - block_input)
    assert full.recomputed == block - block_input    # one block rebuilt at a time, its input kept
    assert plain.recomputed == 0
    assert full.peak < plain.peak
    print(f"tiny GPT b={B} T={T}: activations {plain.activations} B plain, {full.activations} B "
          f"full recompute (+{full.recomputed} B rebuilt per block); peak {plain.peak} -> "
          f"{full.peak} B")


def test_gradients_are_the_same_with_and_without_recompute(gpt_runs):
    plain, full = gpt_runs[None], gpt_runs["full"]
    assert plain.loss == full.loss
    assert plain.grads.keys() == full.grads.keys() and len(plain.grads) > 0
    for name, grad in plain.grads.items():
        torch.testing.assert_close(full.grads[name], grad, rtol=1e-6, atol=1e-7, msg=name)


def test_full_recompute_adds_one_forward_pass_of_the_blocks(gpt_runs):
    plain, full = gpt_runs[None], gpt_runs["full"]
    assert plain.flops == 3 * plain.forward_flops     # every product: forward 1, backward 2
    assert full.forward_flops == plain.forward_flops
    extra = full.flops - plain.flops
    assert extra == plain.layer_forward_flops         # the blocks' forward, once more
    # the formula: per token and block 2 (4 d^2 + 2 d d_ff) + 4 T d; exact for this model
    assert extra == pytest.approx(memory.recompute_flops(TINY, B * T, "full", seq=T).extra,
                                  rel=0.02)
    # the embeddings are lookups (no FLOPs); the head's product is not recomputed
    head = 2 * B * T * TINY.d_model * TINY.vocab
    assert plain.forward_flops == plain.layer_forward_flops + head
    print(f"FLOPs: {plain.flops} plain, {full.flops} full recompute "
          f"(x{full.flops / plain.flops:.3f})")


def test_measure_recompute_leaves_the_model_as_it_was():
    model = build_model(TINY, seed=0)
    x, t = _tokens()
    memory.measure_recompute(model, x, t, recompute="full")
    assert all(p.grad is None for p in model.parameters())
    assert all("forward" not in block.__dict__ for block in model.blocks)
    torch.testing.assert_close(model.loss(x, t).item(),
                               memory.measure_recompute(model, x, t).loss)


def test_a_plain_pytorch_mlp_keeps_each_layers_input():
    d, n, batch = 32, 3, 8
    model = _ffn_stack(d, n)
    x, t = torch.randn(batch, d), torch.randn(batch, d)
    plain = memory.measure_recompute(model, x, t)
    full = memory.measure_recompute(model, x, t, recompute="full")
    # plain, each layer saves its input, fc1's output (GELU's input) and GELU's output
    # (fc2's input); full keeps only the inputs: 2 x 4d per sample and layer are dropped
    assert plain.activations - full.activations == n * 2 * batch * 4 * d * F32
    # what remains: layers 2..n's inputs, the last output (MSE saves it) and the loss
    assert full.activations == (n - 1) * batch * d * F32 + batch * d * F32 + _mse_loss_bytes(x, t)
    assert full.recomputed == 2 * batch * 4 * d * F32
    for name, grad in plain.grads.items():
        torch.testing.assert_close(full.grads[name], grad, rtol=1e-6, atol=1e-7, msg=name)
    assert full.flops - plain.flops == plain.forward_flops == plain.layer_forward_flops


# --- the estimate ----------------------------------------------------------------------------

@pytest.mark.parametrize("recompute", memory.RECOMPUTE)
def test_estimate_matches_the_measurement_within_5_percent(gpt_runs, recompute):
    measured = gpt_runs[recompute]
    estimated = memory.estimate(TINY, (B, T), "sgd", recompute=recompute).activations
    # Term by term, the estimate is kept bytes + one rebuilt block:
    # - kept: positions 8T, the n_layers block inputs b T d s (full), the blocks without their
    #   probabilities and mask (selective: the checkpoint keeps q, k, v as the projections made
    #   them, the same bytes as the head copies it no longer keeps) or the whole blocks (None),
    #   the head (final LayerNorm, log-probs, the loss's total weight): all in
    #   ``activations``; the token ids and targets, 8 b T each: in ``input_bytes``;
    # - rebuilt: the block (full) or attention core (selective: probabilities, mask and the
    #   Q, K, V head copies the batched products make again) being recomputed, minus what is
    #   already kept: ``recomputed``;
    # - the loss scalar (4 B) is alive but not saved: measured, not estimated.
    total = measured.activations + measured.input_bytes + measured.recomputed
    error = abs(estimated - total) / total
    print(f"recompute={recompute}: estimated {estimated} B, measured {total} B, "
          f"error {100 * error:.4f} %")
    assert error < 0.01
    assert estimated == total - LOSS


def test_selective_rebuilds_the_probabilities_mask_and_head_copies(gpt_runs):
    # counted independently of the formula: the core's saved tensors, by shape
    probabilities, mask, head = B * TINY.n_heads * T * T * F32, T * T, B * T * TINY.d_model * F32
    assert gpt_runs["selective"].recomputed == probabilities + mask + 3 * head


def test_micro_batches_in_flight_multiply_only_what_is_kept():
    kept, rebuilt = memory.layer_activations(
        TINY, memory.activations_per_layer(TINY, 2, T)["block 1"], 2, T, F32, recompute="full")
    one = memory.activation_bytes(TINY, 2, T, recompute="full")
    gpipe = memory.estimate(TINY, (4, T), "sgd", microbatches=2, schedule="gpipe",
                            recompute="full").activations
    assert gpipe == 2 * (one - rebuilt) + rebuilt
    assert kept == 2 * T * TINY.d_model * F32


def test_selective_recompute_drops_the_attention_probabilities():
    plain = memory.activation_bytes(TINY, B, T)
    selective = memory.activation_bytes(TINY, B, T, recompute="selective")
    scores = B * TINY.n_heads * T * T * F32 + T * T   # probabilities and the causal mask
    heads = 3 * B * T * TINY.d_model * F32            # the Q, K, V head copies, rebuilt too
    # every block drops the scores; one block at a time rebuilds them and the head copies
    assert selective == plain - TINY.n_layers * scores + scores + heads


def test_a_7b_model_keeps_far_less_with_full_recompute():
    shape = (1, 2048)
    acts = {r: memory.estimate(GPT3_6_7B, shape, "adam", "bf16", recompute=r).activations
            for r in memory.RECOMPUTE}
    print({r: f"{a / 1e9:.2f} GB" for r, a in acts.items()})
    assert acts["full"] < acts[None] / 10
    assert acts["full"] < acts["selective"] < acts[None]
    plans = {r: memory.min_gpus(GPT3_6_7B, (8, 2048), "adam", "bf16", recompute=r).gpus
             for r in memory.RECOMPUTE}
    assert plans["full"] <= plans["selective"] <= plans[None]
    assert plans["full"] < plans[None]


def test_recompute_flops_are_a_third_for_full_and_a_few_percent_for_selective():
    tokens, d, layers = 2048, GPT3_6_7B.d_model, GPT3_6_7B.n_layers
    n = count_parameters(GPT3_6_7B)["total"]
    full = memory.recompute_flops(GPT3_6_7B, tokens, "full")
    selective = memory.recompute_flops(GPT3_6_7B, tokens, "selective")
    assert full.training == 6 * n * tokens                   # 2 N forward + 4 N backward
    assert full.fraction == pytest.approx(1 / 3, abs=0.03)   # one more forward: 2 N of 6 N
    assert selective.extra == tokens * layers * 4 * 2048 * d  # QK^T and (probs) V, T = 2048
    assert selective.fraction < 0.05
    assert memory.recompute_flops(GPT3_6_7B, tokens).extra == 0


def test_a_book_mlp_gains_nothing_from_full_recompute():
    # each layer (Linear + ReLU) keeps only its output, which the next layer needs anyway: full
    # recompute drops nothing and rebuilds the largest layer's output as it goes back
    mlp = BookMLP((64, 256, 256, 10))
    net = mlp.to_torch()
    layers = nn.Sequential(*[nn.Sequential(*list(net)[i:i + 2]) for i in range(0, len(net), 2)])
    x, t = torch.randn(32, 64), torch.randn(32, 10)
    plain = memory.measure_recompute(layers, x, t)
    full = memory.measure_recompute(layers, x, t, recompute="full")
    assert full.activations == plain.activations
    assert full.recomputed == 32 * 256 * F32
    estimated = {r: memory.estimate(mlp, (32,), "sgd", recompute=r).activations
                 for r in memory.RECOMPUTE}
    assert estimated["full"] == estimated[None] + 32 * 256 * F32
    loss = _mse_loss_bytes(t, t)  # alive, not saved: measured, not estimated
    assert estimated["full"] == full.activations + full.input_bytes + full.recomputed - loss
    assert estimated["selective"] == estimated[None]            # no attention to drop


@pytest.mark.parametrize("bad", ["fulll", "Full", "", True, 1])
def test_bad_recompute_values_are_refused(bad):
    calls = [lambda: memory.estimate(TINY, (B, T), recompute=bad),
             lambda: memory.activation_bytes(TINY, B, T, recompute=bad),
             lambda: memory.min_gpus(TINY, (B, T), recompute=bad),
             lambda: memory.recompute_flops(TINY, B * T, bad),
             lambda: memory.measure_recompute(build_model(TINY), *_tokens(), recompute=bad)]
    for call in calls:
        with pytest.raises(ValueError, match=r"\[None, 'full', 'selective'\]"):
            call()


def test_selective_recompute_measured_reruns_only_the_attention_core():
    model = build_model(TINY, seed=0)
    x, t = _tokens()
    plain = memory.measure_recompute(model, x, t)
    selective = memory.measure_recompute(model, x, t, recompute="selective")
    full = memory.measure_recompute(model, x, t, recompute="full")
    # QK^T and PV again: 2 matmuls of 2·b·h·T²·d_head FLOPs each, per block
    assert selective.flops - plain.flops == 4 * B * T * T * TINY.d_model * TINY.n_layers
    assert full.activations < selective.activations < plain.activations
    for name, grad in plain.grads.items():
        torch.testing.assert_close(selective.grads[name], grad, rtol=1e-6, atol=1e-7, msg=name)


def test_selective_recompute_needs_an_attention_core():
    with pytest.raises(ValueError, match="attention core"):
        memory.measure_recompute(torch.nn.Sequential(torch.nn.Linear(4, 4)), torch.ones(2, 4),
                                 recompute="selective")


# --- what the result reports for chapter 06's prose -------------------------------------------

@pytest.mark.parametrize("recompute", memory.RECOMPUTE)
def test_the_result_names_the_loss_the_estimate_leaves_out(gpt_runs, recompute):
    measured = gpt_runs[recompute]
    assert measured.loss_bytes == LOSS                       # one fp32 scalar, by hand
    assert measured.held == measured.activations + measured.input_bytes + measured.recomputed
    estimated = memory.estimate(TINY, (B, T), "sgd", recompute=recompute).activations
    assert measured.held - estimated == measured.loss_bytes


def test_the_loss_bytes_are_its_storage_even_when_that_is_not_one_scalar():
    layers = nn.Sequential(nn.Linear(8, 4), nn.Linear(4, 3))
    x, t = torch.randn(5, 8), torch.randn(5, 3)
    assert memory.measure_recompute(layers, x, t).loss_bytes == _mse_loss_bytes(t, t)
