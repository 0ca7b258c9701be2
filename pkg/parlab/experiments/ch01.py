"""Chapter 01's experiments and figure recipes: a real training step (:func:`book_step`), where
the datasets sit while it trains (:func:`datasets_and_batch`), the memory calculator against
80 GB, the fewest GPUs for GPT-3, and the cost of failures.

Each recipe runs or computes here and hands the result to :mod:`parlab.viz.plots`, which
only draws.
"""

from __future__ import annotations

import torch

from parlab.checks import check_count
from parlab.memory import estimate, min_gpus, training_cost, waste_curve
from parlab.models import BookMLP, CONFIGS
from parlab.viz import figure
from parlab.viz.plots import checkpoint_curve, figure_8_1, memory_bars, memory_split

__all__ = ["book_step", "datasets_and_batch", "model_sizes_figure", "gpt3_split_figure"]


def book_step(sizes=(4, 5, 5, 2), batch: int = 8, seed: int = 0,
              with_peer: bool = True) -> BookMLP:
    """One real training step of a :class:`BookMLP`, as rank A1 of two data-parallel replicas.

    With ``with_peer`` a second, identical replica (A2) computes its local gradients on the
    other half of the batch, and A1 receives them as its remote gradients (world size 2);
    without it A1 trains alone on the whole batch and has no remote gradients.
    """
    if check_count("batch", batch) < 2 and with_peer:
        raise ValueError(f"batch must be at least 2 with with_peer=True (one half per replica), "
                         f"got {batch!r}")
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, sizes[0], generator=g)
    target = torch.randn(batch, sizes[-1], generator=g)
    mlp = BookMLP(sizes, seed=seed)
    if not with_peer:
        mlp.step(x, target)
        return mlp
    half = batch // 2
    peer = BookMLP(sizes, seed=seed)
    peer.forward(x[half:])
    peer.backward(target[half:])
    # A1's own copy of its half, as on its own GPU (a view would keep A2's half alive too)
    mlp.step(x[:half].clone(), target[:half].clone(), exchange=lambda local: peer.local_grads(),
             world_size=2)
    return mlp


def datasets_and_batch(sizes=(4, 5, 5, 2), train_samples: int = 10_000,
                       test_samples: int = 2_000, batch: int = 8, seed: int = 0) -> dict:
    """Where the book's "training and test datasets" are while a network trains.

    Both sets live in host memory, as a ``DataLoader`` keeps them; one training step is handed
    one batch (what a GPU would be sent). Returns the bytes of each set and of that batch,
    and what autograd keeps for a backward pass (``saved_tensors_hooks``; the weights, kept
    anyway, left out) in a training forward pass and in an evaluation pass over a test batch under ``torch.no_grad``.
    """
    from torch.utils.data import DataLoader, TensorDataset
    for name, value in (("train_samples", train_samples), ("test_samples", test_samples),
                        ("batch", batch)):
        check_count(name, value)

    g = torch.Generator().manual_seed(seed)

    def dataset(n):
        return TensorDataset(torch.randn(n, sizes[0], generator=g),
                             torch.randn(n, sizes[-1], generator=g))

    train, test = dataset(train_samples), dataset(test_samples)
    x, target = next(iter(DataLoader(train, batch_size=batch, shuffle=True, generator=g)))
    test_x, _ = next(iter(DataLoader(test, batch_size=batch)))
    model = BookMLP(sizes, seed=seed).to_torch()

    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def saved_bytes(inputs, grad):
        saved = {}  # storage -> bytes: the tensors saved for backward, weights left out

        def pack(t):
            ptr = t.untyped_storage().data_ptr()
            if ptr not in weights:
                saved[ptr] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with torch.set_grad_enabled(grad):
                model(inputs)
        return sum(saved.values())

    def nbytes(ds):
        return sum(t.numel() * t.element_size() for t in ds.tensors)

    return {"train_bytes": nbytes(train), "test_bytes": nbytes(test),
            "batch_shapes": (tuple(x.shape), tuple(target.shape)),
            "batch_bytes": x.numel() * x.element_size() + target.numel() * target.element_size(),
            "saved_training": saved_bytes(x, True), "saved_evaluation": saved_bytes(test_x, False)}


@figure("fig-8-01-gpu-memory", "Figure 8-1: what one GPU keeps during a real training step")
def _figure_8_1():
    """Figure 8-1 for GPU A1 of two data-parallel replicas."""
    return figure_8_1(book_step())


@figure("fig-01-memory-bar", "Training memory per GPU: GPT-2 and GPT-3 sizes against 80 GB")
def model_sizes_figure(shape: tuple[int, int] = (8, 1024)):
    """Six model sizes in fp32 with Adam, ``shape`` = (sequences, tokens) each, each on one
    GPU, against 80 GB."""
    names = ["GPT-2 small", "GPT-2 medium", "GPT-2 large", "GPT-2 XL", "GPT-3 2.7B",
             "GPT-3 6.7B"]
    bars = [estimate(CONFIGS[n], shape, "adam", "fp32") for n in names]
    return memory_bars(names, bars, f"fp32, Adam, batch {shape[0]} x {shape[1]} tokens, all on "
                       "one GPU")


@figure("fig-01-gpt3-split", "GPT-3 175B: one GPU against the fewest GPUs that hold it")
def gpt3_split_figure():
    """GPT-3 175B on one GPU, beside the busiest GPU of the fewest-GPU split."""
    one = estimate(CONFIGS["GPT-3 175B"], (8, 2048), "adam", "bf16")
    plan = min_gpus(CONFIGS["GPT-3 175B"], (8, 2048), "adam", "bf16")
    return memory_split(one, plan.breakdown, f"{plan.gpus} GPUs\n(tp {plan.tp} x pp {plan.pp})",
                        "GPT-3 175B, bf16 + Adam, batch 8 x 2048")


@figure("fig-01-checkpoint-cost", "Expected cost of failures against the checkpoint interval")
def _checkpoint_cost():
    """The book's run with failures every 8 hours and 10-minute checkpoints."""
    run = training_cost(gpus=50_000, watts_per_gpu=350, days=60, usd_per_kwh=0.10)
    return checkpoint_curve(waste_curve(run, mtbf_hours=8))
