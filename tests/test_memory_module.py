"""estimate and measure for any torch.nn.Module (issue 16, items 1, 2 and 6).

The estimate traces one training step with fake tensors (nothing allocated); measure runs two
real steps on the CPU. Every model here is written in this file: the package knows none of
them. Run with ``-s`` to see each model's error.
"""
import math
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from parlab import memory

PARTS = ("parameters", "gradients", "optimizer_state", "master_weights", "activations")


# --- the models ------------------------------------------------------------------------------

def mlp():
    return nn.Sequential(nn.Linear(300, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(),
                         nn.Linear(256, 10))


def cnn():
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AvgPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, 10))


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps).to(x.dtype) \
            * self.weight


class LlamaBlock(nn.Module):
    """Pre-norm block: grouped-query attention (n_kv < n_heads) through
    F.scaled_dot_product_attention, then a SwiGLU feed-forward layer."""

    def __init__(self, d=64, n_heads=4, n_kv=2, d_ff=172):
        super().__init__()
        self.n_heads, self.n_kv, self.head = n_heads, n_kv, d // n_heads
        self.attn_norm, self.ffn_norm = RMSNorm(d), RMSNorm(d)
        self.q = nn.Linear(d, d, bias=False)
        self.kv = nn.Linear(d, 2 * n_kv * self.head, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.gate = nn.Linear(d, d_ff, bias=False)
        self.up = nn.Linear(d, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        h = self.attn_norm(x)
        q = self.q(h).view(b, t, self.n_heads, self.head).transpose(1, 2)
        k, v = self.kv(h).view(b, t, 2, self.n_kv, self.head).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, d))
        h = self.ffn_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, vocab=512, d=64, layers=2, **block):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(LlamaBlock(d, **block) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class LSTMTagger(nn.Module):
    def __init__(self, features=32, hidden=64):
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, num_layers=2, batch_first=True)
        self.out = nn.Linear(hidden, 8)

    def forward(self, x):
        return self.out(self.lstm(x)[0])


class GRUTagger(LSTMTagger):
    def __init__(self, features=32, hidden=64):
        super().__init__(features, hidden)
        self.lstm = nn.GRU(features, hidden, num_layers=2, batch_first=True)


def _ids(batch=4, seq=32, vocab=512):
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))


#: name -> (model builder, estimate/measure input arguments)
MODELS = {
    "mlp-tanh": (mlp, dict(input_shape=(48, 300))),
    "cnn-batchnorm-pool": (cnn, dict(input_shape=(8, 3, 32, 32))),
    "llama-gqa-swiglu": (Llama, dict(example_input=_ids())),
    "lstm": (LSTMTagger, dict(input_shape=(6, 20, 32))),
    "gru": (GRUTagger, dict(input_shape=(6, 20, 32))),
}


def _build(name):
    torch.manual_seed(0)
    return MODELS[name][0]()


def _error(predicted, measured) -> float:
    return abs(predicted - measured) / measured


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("name", list(MODELS))
def test_estimate_is_within_5_percent_of_a_real_step(name, optimizer, precision):
    model, inputs = _build(name), MODELS[name][1]
    try:
        measured = memory.measure(model, optimizer=optimizer, precision=precision, **inputs)
    except ValueError as error:  # a CPU kernel without bf16: say so, test fp16 instead
        if precision != "bf16" or "not implemented" not in str(error):
            raise
        pytest.skip(f"{name}: an op has no bf16 kernel on this CPU ({error})")
    predicted = memory.estimate(model, optimizer=optimizer, precision=precision, **inputs)
    act = _error(predicted.activations, measured.activations)
    total = _error(predicted.total, measured.total)
    print(f"\n{name:<20} {optimizer:<5} {precision}: activations estimated "
          f"{predicted.activations} B, measured {measured.activations} B, error "
          f"{100 * act:.3f} %; total {predicted.total} B vs {measured.total} B, error "
          f"{100 * total:.3f} %")
    assert measured.activations > 0
    assert act < 0.05 and total < 0.05
    for part in PARTS:
        assert getattr(predicted, part) == pytest.approx(getattr(measured, part), rel=0.05)


def test_a_large_lstm_workspace_is_extrapolated_from_small_probes(monkeypatch):
    """oneDNN's LSTM workspace is asked of the real kernel at batches whose workspace fits a
    budget (64 MB; 4 MB here, to test it quickly), then extrapolated to the micro-batch."""
    monkeypatch.setattr("parlab.memory.tracing._PROBE_BYTES", 4 * 2**20)
    torch.manual_seed(0)
    model = nn.LSTM(32, 64, batch_first=True)
    predicted = memory.estimate(model, (512, 20, 32), "sgd")
    measured = memory.measure(model, (512, 20, 32), "sgd")
    error = _error(predicted.activations, measured.activations)
    print(f"\nlstm workspace extrapolated: activations estimated {predicted.activations} B, "
          f"measured {measured.activations} B, error {100 * error:.3f} %")
    assert error < 0.05


def test_data_parallel_halves_the_batch_of_each_replica():
    model, inputs = _build("cnn-batchnorm-pool"), MODELS["cnn-batchnorm-pool"][1]
    one = memory.estimate(model, optimizer="sgd", **inputs)
    predicted = memory.estimate(model, optimizer="sgd", dp=2, **inputs)
    measured = memory.measure(model, optimizer="sgd", dp=2, **inputs)
    error = _error(predicted.activations, measured.activations)
    print(f"\ncnn dp=2: activations estimated {predicted.activations} B, measured "
          f"{measured.activations} B, error {100 * error:.3f} %")
    assert error < 0.05 and _error(predicted.total, measured.total) < 0.05
    assert predicted.activations == pytest.approx(one.activations / 2, rel=0.01)
    assert predicted.parameters == one.parameters
    zero3 = memory.estimate(model, optimizer="adam", dp=2, zero=3, **inputs)
    assert zero3.parameters == math.ceil(one.parameters / 4 / 2) * 4  # ZeRO-3 halves them


def test_micro_batches_in_flight_follow_the_schedule():
    model = _build("mlp-tanh")
    one = memory.estimate(model, (48, 300), "sgd", microbatches=4)
    gpipe = memory.estimate(model, (48, 300), "sgd", microbatches=4, schedule="gpipe")
    measured = memory.measure(model, (48, 300), "sgd", microbatches=4, schedule="gpipe")
    assert gpipe.activations == 4 * one.activations
    assert _error(gpipe.activations, measured.activations) < 0.05


def test_pipeline_stage_equals_measuring_its_children_alone():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 512), nn.Tanh(), nn.Linear(512, 512), nn.Tanh(),
                          nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 64))
    x = torch.randn(32, 64)
    # balanced by parameters: 295 k on each side of child 4 (a Tanh stays with its Linear)
    assert [list(r) for r in memory.stage_ranges(model, 2)] == [[0, 1, 2, 3], [4, 5, 6]]
    # the busiest stage is the one with more children: first [0, 5), then [2, 7)
    for cut, busiest in ((5, 0), (2, 1)):
        stage = list(model)[:cut] if busiest == 0 else list(model)[cut:]
        with torch.no_grad():
            stage_input = x if busiest == 0 else model[:cut](x)
        predicted = memory.estimate(model, example_input=x, optimizer="adam", pp=2,
                                    split_points=[cut])
        # stage 0 has no loss: its backward starts from the gradient stage 1 sends back, so
        # alone it is measured with a loss that saves nothing (sum), not the default one
        no_loss = (lambda out, *inputs: out.sum()) if busiest == 0 else None
        measured = memory.measure(nn.Sequential(*stage), example_input=stage_input,
                                  loss_fn=no_loss)
        # stage 1 keeps the activation it received (its first Linear saves it); measured
        # alone, that is the example input, which measure does not count
        received = stage_input.untyped_storage().nbytes() if busiest == 1 else 0
        error = _error(predicted.activations, measured.activations + received)
        print(f"\npp=2 split at {cut}, stage {busiest}: activations estimated "
              f"{predicted.activations} B, measured alone {measured.activations} B + received "
              f"{received} B, error {100 * error:.3f} %")
        assert predicted.label.endswith(f", stage {busiest}")
        assert predicted.parameters == measured.parameters
        assert error < 0.05 and _error(predicted.total, measured.total + received) < 0.05
    # 1F1B: the first stage holds min(pp, m) = 2 micro-batches in flight, GPipe all 4
    one = memory.estimate(model, example_input=x, pp=2, split_points=[5], microbatches=4)
    gpipe = memory.estimate(model, example_input=x, pp=2, split_points=[5], microbatches=4,
                            schedule="gpipe")
    assert gpipe.activations == 2 * one.activations > 0


def test_full_recompute_keeps_each_child_input_and_rebuilds_one_child():
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
                            for _ in range(4)])
    x = torch.randn(32, 64)
    loss = lambda out, *inputs: out.float().square().mean()  # noqa: E731 - the default loss
    plain = memory.estimate(model, example_input=x, optimizer="sgd")
    full = memory.estimate(model, example_input=x, optimizer="sgd", recompute="full")
    run = memory.measure_recompute(model, x, recompute="full", loss_fn=loss)
    measured = run.activations + run.recomputed
    error = _error(full.activations, measured)
    print(f"\nfull recompute: activations estimated {full.activations} B (without: "
          f"{plain.activations} B), measured {run.activations} B kept + {run.recomputed} B "
          f"rebuilt, error {100 * error:.3f} %")
    assert full.activations < plain.activations / 2
    assert error < 0.05
    with pytest.raises(ValueError, match="selective recompute .* transformer configs"):
        memory.estimate(model, example_input=x, recompute="selective")


def test_a_7b_model_on_the_meta_device_is_estimated_in_seconds_without_memory():
    script = textwrap.dedent("""
        import os, resource, time
        began = time.perf_counter()
        import torch
        from torch import nn
        from parlab import memory
        imports = time.perf_counter() - began
        with open("/proc/self/statm") as f:  # resident now, in kB
            before = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
        start = time.perf_counter()
        with torch.device("meta"):
            model = nn.Sequential(nn.Embedding(32000, 4096), *[nn.Sequential(
                nn.Linear(4096, 26112, bias=False), nn.SiLU(),
                nn.Linear(26112, 4096, bias=False)) for _ in range(32)])
        b = memory.estimate(model, optimizer="adam", precision="bf16",
                            example_input=torch.zeros(8, 2048, dtype=torch.long))
        seconds = time.perf_counter() - start
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before  # peak, kB
        n = sum(p.numel() for p in model.parameters())
        print(n, b.parameters, b.activations, imports, seconds, grown)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    n, parameters, activations, imports, seconds, grown_kb = out.stdout.split()[-6:]
    n, seconds, grown_mb = int(n), float(seconds), int(grown_kb) / 1024
    print(f"\n7B on meta: {n / 1e9:.2f} B parameters, built and estimated in {seconds:.1f} s "
          f"(after {float(imports):.1f} s of imports), peak RSS {grown_mb:.0f} MB above the "
          f"resident size before; "
          f"parameters {int(parameters) / 1e9:.1f} GB, activations "
          f"{int(activations) / 1e9:.1f} GB")
    assert 6.8e9 < n < 7.2e9
    assert int(parameters) == 2 * n
    # each block keeps its input and the SiLU input and output, bf16: 8 x 2048 x 4096 x 2 B ...
    assert int(activations) > 32 * 8 * 2048 * 26112 * 2
    assert seconds < 30
    assert grown_mb < 1024


# --- bad input -------------------------------------------------------------------------------

def test_a_forward_that_fails_names_the_shape_and_the_error_in_one_line():
    with pytest.raises(ValueError) as info:
        memory.estimate(mlp(), (48, 30))
    message = str(info.value)
    assert "\n" not in message
    assert "(48, 30)" in message and "Sequential" in message
    assert "[48, 30] X [300, 256]" in message  # the module's own words
    with pytest.raises(ValueError, match=r"input of shape \(48, 30\): .*48x30 and 300x256"):
        memory.measure(mlp(), (48, 30))


@pytest.mark.parametrize("fn", [memory.estimate, memory.measure])
def test_input_shape_or_example_input_exactly_one(fn):
    for kwargs in ({}, dict(input_shape=(4, 300), example_input=torch.zeros(4, 300))):
        with pytest.raises(ValueError, match="exactly one of input_shape .* or example_input"):
            fn(mlp(), **kwargs)
    with pytest.raises(TypeError, match="example_input must be a tensor or a tuple of tensors"):
        fn(mlp(), example_input=[[0.0] * 300])
    with pytest.raises(TypeError, match="example_input must be a tensor"):
        fn(mlp(), example_input="x")
    with pytest.raises(ValueError, match="first dimension of every example_input"):
        fn(mlp(), example_input=(torch.zeros(4, 300), torch.zeros(5, 3)))
    with pytest.raises(ValueError, match="input_shape must be the global batch"):
        fn(mlp(), (4, 0))


def test_module_only_arguments_are_checked():
    model, x = mlp(), torch.zeros(8, 300)
    with pytest.raises(ValueError, match="tensor parallelism is modelled for transformer"):
        memory.estimate(model, example_input=x, tp=2)
    with pytest.raises(ValueError, match="pp=9 stages for the 5 top-level children"):
        memory.estimate(model, example_input=x, pp=9)
    with pytest.raises(ValueError, match=r"split_points=\[2\] cut 2 stages but pp=3"):
        memory.estimate(model, example_input=x, pp=3, split_points=[2])
    with pytest.raises(ValueError, match="split_points must be increasing child indices"):
        memory.estimate(model, example_input=x, pp=3, split_points=[3, 2])
    with pytest.raises(ValueError, match="does not split into dp=3"):
        memory.estimate(model, example_input=x, dp=3)
    with pytest.raises(TypeError, match="loss_fn must be callable"):
        memory.estimate(model, example_input=x, loss_fn="mse")
    from parlab.models import TINY
    with pytest.raises(ValueError, match="example_input: for a torch.nn.Module only"):
        memory.estimate(TINY, (2, 16), example_input=x)


def test_measure_needs_a_real_module_and_reports_running_out_of_memory():
    with torch.device("meta"):
        meta = mlp()
    assert memory.estimate(meta, (8, 300)).activations > 0  # the estimate is fine on meta
    with pytest.raises(ValueError, match="on the meta device: build it on the CPU"):
        memory.measure(meta, (8, 300))
    huge = (2**40, 300)  # 1.3 PB of input: the allocator refuses at once
    with pytest.raises(MemoryError, match="measure ran out of memory.*estimate"):
        memory.measure(mlp(), huge)
    assert memory.estimate(mlp(), huge).activations > 10**15


def test_a_custom_loss_and_a_tuple_of_inputs():
    class TwoInputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.mix = nn.Embedding(100, 16), nn.Linear(32, 4)

        def forward(self, ids, features):
            return self.mix(torch.cat([self.embed(ids), features], -1))

    torch.manual_seed(0)
    model = TwoInputs()
    inputs = (torch.randint(0, 100, (8, 5)), torch.randn(8, 5, 16))
    target = lambda out, ids, features: F.cross_entropy(out.flatten(0, 1),  # noqa: E731
                                                        ids.flatten() % 4)
    predicted = memory.estimate(model, example_input=inputs, loss_fn=target, optimizer="sgd")
    measured = memory.measure(model, example_input=inputs, loss_fn=target, optimizer="sgd")
    assert predicted.activations == pytest.approx(measured.activations, rel=0.05)
    assert predicted.parameters == measured.parameters == 4 * (100 * 16 + 32 * 4 + 4)


def test_min_gpus_splits_a_module_by_data_and_pipeline(monkeypatch):
    import parlab.memory.modules as modules
    model, shape = mlp(), (64, 300)
    one = memory.estimate(model, shape, "adam")
    calls, trace = [], modules.trace_module

    def counted(*args, **kwargs):
        calls.append(args[2])  # the micro-batch
        return trace(*args, **kwargs)

    for zero, frac in ((0, 1.5), (3, 3)):
        gb = one.total / frac / 1e9    # a GPU that holds 1/frac of the whole job
        calls.clear()
        with monkeypatch.context() as patch:
            patch.setattr(modules, "trace_module", counted)
            plan = memory.min_gpus(model, shape, "adam", gpu_memory_gb=gb, zero=zero)
        assert calls and len(calls) == len(set(calls))  # one trace per micro-batch size
        assert plan.tp == 1 and plan.breakdown.fits and plan.gpus >= plan.ideal >= 2
        assert plan.breakdown == memory.estimate(model, shape, "adam", dp=plan.dp, pp=plan.pp,
                                                 gpu_memory_gb=gb, zero=zero)
        for dp in (1, 2, 4, 8, 16, 32, 64):     # an exhaustive search finds nothing smaller
            for pp in range(1, 6):
                if dp * pp < plan.gpus:
                    assert not memory.estimate(model, shape, "adam", dp=dp, pp=pp,
                                               gpu_memory_gb=gb, zero=zero).fits
    assert (plan.dp, plan.pp) == (2, 2)      # ZeRO-3 shards the states over the replicas
    with pytest.raises(ValueError, match=r"does not fit: Sequential .* on any split up to "
                                         r"pp=5: use more micro-batches, ZeRO"):
        memory.min_gpus(model, shape, "adam", gpu_memory_gb=one.total / 3 / 1e9)
