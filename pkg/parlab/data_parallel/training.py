"""Data-parallel training runs: many steps on N real ranks, checked against one process.

Why a module of its own: :mod:`parlab.data_parallel` is the recipe (split the batch, sum
and average the gradients, step); this is the experiment around it. :func:`train` runs a
small, deterministic problem (:class:`TrainSpec`) for several steps through
:func:`parlab.launch.run`, either with the hand-built step or with PyTorch's
``DistributedDataParallel`` for comparison; it can save checkpoints, resume from them, and
inject a lost transfer into one rank's gradient sync to show that every rank stops.
:func:`reference` is one process training on the whole batch, the result every parallel
run must equal.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist
from torch import nn

from parlab.comm import chrome_trace
from parlab.data_parallel.sync import SyncStats, split_batch, step
from parlab.launch import recording, span
from parlab.models import BookMLP
from parlab.checks import check_count

__all__ = ["TrainSpec", "RankRun", "make_model", "make_batch", "make_optimizer", "train",
           "train_rank", "reference", "LostTransfer", "latest_checkpoint", "read_journal",
           "training_trace"]


@dataclass(frozen=True)
class TrainSpec:
    """A small, fully deterministic training problem: model, data, optimizer, batch split.

    The model is :class:`BookMLP` (``sizes``, ``activation``, ``seed``) as ``nn.Sequential``;
    the data are fresh random inputs every step with targets from a fixed smooth function.
    """

    sizes: tuple = (4, 6, 6, 2)
    activation: str = "relu"
    seed: int = 0
    lr: float = 0.1
    momentum: float = 0.0
    samples: int = 16
    micro_batches: int = 8
    steps: int = 1
    uneven: bool = False
    bucket_cap_bytes: int | None = None

    def replace(self, **changes) -> "TrainSpec":
        return replace(self, **changes)


def make_optimizer(spec: TrainSpec, params) -> torch.optim.SGD:
    """The spec's optimizer: ``torch.optim.SGD`` with ``spec.momentum`` (no dampening, no
    Nesterov), the book's Δw = -lr · G when the momentum is 0. (Creating it imports
    ``torch._dynamo``, seconds in a fresh process: the launcher's forkserver preloads it.)"""
    return torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum)


def make_model(spec: TrainSpec) -> nn.Sequential:
    """The spec's network as ``nn.Linear`` layers, with :class:`BookMLP`'s initial weights."""
    return BookMLP(spec.sizes, spec.activation, lr=spec.lr, seed=spec.seed).to_torch()


def make_batch(spec: TrainSpec, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch number ``index`` (inputs and targets); the same on every rank and every run."""
    g = torch.Generator().manual_seed(1_000_003 * (spec.seed + 1) + index)
    x = torch.randn(spec.samples, spec.sizes[0], generator=g)
    mix = torch.randn(spec.sizes[0], spec.sizes[-1],
                      generator=torch.Generator().manual_seed(spec.seed + 7))
    return x, torch.sin(x @ mix / 2)


@dataclass
class RankRun:
    """What one rank (or the single-process reference) did: losses, sync counts, final weights,
    and ``spans``, its timed work (forward and backward per micro-batch, one all_reduce per
    bucket, the optimizer step; each with its ``step`` in the args): see :func:`training_trace`.
    """

    rank: int
    losses: list[float]
    calls: list[int]
    sync_bytes: list[int]
    state: dict[str, torch.Tensor]
    checkpoint: dict | None = None
    spans: list = field(default_factory=list, repr=False)

    def extend(self, later: "RankRun") -> "RankRun":
        """This run followed by ``later`` (a run resumed from this one's checkpoint)."""
        return RankRun(self.rank, self.losses + later.losses, self.calls + later.calls,
                       self.sync_bytes + later.sync_bytes, later.state, later.checkpoint,
                       self.spans + later.spans)


class LostTransfer(RuntimeError):
    """A gradient transfer that never arrived: what a dropped packet means to a collective."""


def _cpu_state(model) -> dict:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def _on_cpu(value):
    """A copy of a (nested) state dict with every tensor on the CPU: a checkpoint must not
    share the optimizer's live buffers, nor need a GPU to be read."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, dict):
        return {k: _on_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_on_cpu(v) for v in value)
    return value


def _checkpoint(model, optimizer, done: int) -> dict:
    return {"step": done, "model": _cpu_state(model), "optimizer": _on_cpu(optimizer.state_dict())}


def _journal(directory, text: str) -> None:
    if directory:
        with open(os.path.join(directory, f"rank{dist.get_rank()}.log"), "a") as f:
            f.write(text + "\n")


def train_rank(spec: TrainSpec, engine: str = "hand", start: dict | None = None,
               stop: int | None = None, fail_at: tuple | None = None,
               lose_at: tuple | None = None, checkpoint_dir: str | None = None,
               checkpoint_every: int | None = None, journal_dir: str | None = None) -> RankRun:
    """Run on every rank: train steps ``start["step"]`` (or 0) to ``stop`` (or ``spec.steps``).

    ``engine="hand"`` uses :func:`step`; ``"ddp"`` wraps the model in
    ``DistributedDataParallel`` (same data, same loss weighting, ``no_sync`` for all but the
    last micro-batch). ``fail_at=(rank, step, bucket)`` makes that rank raise
    :class:`LostTransfer` just before that bucket's all-reduce; ``lose_at=(rank, step)``
    makes that rank silently keep its local gradient instead. Rank 0 writes a checkpoint
    every ``checkpoint_every`` steps into ``checkpoint_dir``; ``journal_dir`` gets one log
    file per rank (buckets sent, updates applied). Steps are counted from 1 there, as a
    reader counts them; a checkpoint's ``"step"`` is the number of steps done.
    """
    from parlab.launch import rank_device

    _check_engine(engine, fail_at, lose_at)
    rank, world, device = dist.get_rank(), dist.get_world_size(), rank_device()
    shares = split_batch(spec.samples, spec.micro_batches, world, spec.uneven)[rank]
    model = make_model(spec).to(device)
    optimizer = make_optimizer(spec, model.parameters())
    first = 0
    if start is not None:
        model.load_state_dict(start["model"])
        optimizer.load_state_dict(start["optimizer"])
        first = start["step"]
    with recording() as recorder:
        with span("broadcast weights", "communication", op="broadcast", root=0,
                  bytes=sum(p.numel() * p.element_size() for p in model.parameters())):
            for p in model.parameters():  # every replica starts from rank 0's weights (DDP too)
                dist.broadcast(p.data, src=0)
        net = model if engine == "hand" else _ddp(model, spec)
        run = RankRun(rank, [], [], [], {})
        for i in range(first, spec.steps if stop is None else stop):
            recorder.tags["step"] = i + 1  # steps counted from 1, in every span of this step
            x, target = (t.to(device) for t in make_batch(spec, i))
            micro = [(x[a:b], target[a:b]) for a, b in shares]

            def inject(k, n=i + 1):
                if fail_at is not None and tuple(fail_at) == (rank, n, k):
                    raise LostTransfer(f"rank {rank} lost its gradient transfer (bucket {k}) "
                                       f"in step {n}")
                _journal(journal_dir, f"step {n}: bucket {k} sent")

            if engine == "hand":
                lost = lose_at is not None and tuple(lose_at) == (rank, i + 1)
                loss, stats = step(net, optimizer, nn.functional.mse_loss, micro, spec.samples,
                                   bucket_cap_bytes=spec.bucket_cap_bytes, inject=inject,
                                   keep_local=lost)
            else:
                loss, stats = _ddp_step(net, optimizer, micro, spec.samples, world)
            if journal_dir:
                total = sum(float(p.detach().sum()) for p in model.parameters())
                _journal(journal_dir, f"step {i + 1}: update applied, sum of weights {total:.4f}")
            run.losses.append(loss)
            run.calls.append(stats.calls)
            run.sync_bytes.append(stats.bytes)
            if rank == 0 and checkpoint_dir and checkpoint_every \
                    and (i + 1) % checkpoint_every == 0:
                path = os.path.join(checkpoint_dir, f"step_{i + 1:06d}.pt")
                torch.save(_checkpoint(model, optimizer, i + 1), path + ".tmp")
                os.replace(path + ".tmp", path)  # a crash mid-write never leaves half a checkpoint
    run.spans = recorder.spans
    run.state = _cpu_state(model)
    if rank == 0:
        run.checkpoint = _checkpoint(model, optimizer, i + 1) if run.losses else start
    return run


def _check_engine(engine, fail_at=None, lose_at=None) -> None:
    if engine not in ("hand", "ddp"):
        raise ValueError(f"engine must be 'hand' or 'ddp', got {engine!r}")
    if engine == "ddp" and (fail_at or lose_at):
        raise ValueError("fail_at and lose_at act inside the hand-built sync; use engine='hand'")


def _ddp(model, spec):
    if spec.bucket_cap_bytes is None:  # DDP's own defaults, 1 MiB first bucket included
        return nn.parallel.DistributedDataParallel(model)
    return nn.parallel.DistributedDataParallel(model, bucket_cap_mb=spec.bucket_cap_bytes / 2**20)


def _ddp_step(ddp, optimizer, micro, samples, world):
    """The production loop: DDP all-reduces (and averages) during the last backward."""
    optimizer.zero_grad()
    total, count = 0.0, 0
    for j, (x, target) in enumerate(micro):
        last = j == len(micro) - 1
        with ddp.no_sync() if not last else contextlib.nullcontext():
            with span(f"forward {j}", "compute", microbatch=j):
                loss = nn.functional.mse_loss(ddp(x), target)
            # the last backward also runs DDP's all-reduces, hidden inside it
            with span(f"backward {j}", "compute", microbatch=j, ddp_sync=last):
                (loss * (len(x) * world / samples)).backward()
        total, count = total + loss.item() * len(x), count + len(x)
    with span("optimizer step", "compute"):
        optimizer.step()
    return total / count, SyncStats()  # DDP does not report its calls


def train(spec: TrainSpec, world_size: int, *, backend: str = "gloo", engine: str = "hand",
          start: dict | None = None, segments: int = 1, progress: bool = False,
          timeout: float = 60, **options) -> list[RankRun]:
    """Train ``spec`` on ``world_size`` ranks; return each rank's :class:`RankRun`.

    ``segments > 1`` cuts the run into that many launches, each resuming from the last
    one's in-memory checkpoint (weights and optimizer state); ``progress`` shows a tqdm bar
    that advances per segment. ``start`` resumes from a checkpoint (see
    :func:`latest_checkpoint`); other options go to :func:`train_rank`.
    """
    from parlab.launch import run as launch
    from parlab.progress import progress_bar

    _check_engine(engine, options.get("fail_at"), options.get("lose_at"))
    first = start["step"] if start else 0
    check_count("segments", segments)
    split_batch(spec.samples, spec.micro_batches, world_size, spec.uneven)  # before any rank
    stops = sorted({first + round((spec.steps - first) * (s + 1) / segments)
                    for s in range(segments)})
    runs, done = None, first
    bar = progress_bar(total=spec.steps - first, unit="step",
                       desc=f"{world_size} rank(s), {backend}") if progress else None
    for stop in stops:
        part = launch(train_rank, world_size, spec, engine=engine, start=start, stop=stop,
                      backend=backend, timeout=timeout, **options)
        runs = part if runs is None else [a.extend(b) for a, b in zip(runs, part)]
        start = part[0].checkpoint
        if bar is not None:
            bar.update(stop - done)
        done = stop
    if bar is not None:
        bar.close()
    return runs


def training_trace(runs, path=None) -> dict:
    """The ranks' timeline of a :func:`train` run as a Chrome trace (one track per rank:
    forward and backward per micro-batch and the optimizer step on the "compute" row, the
    weight broadcast and one all_reduce per bucket and step on "communication"); also
    written to ``path`` (``.json`` or ``.json.gz``) when given, for https://ui.perfetto.dev."""
    if not isinstance(runs, (list, tuple)) or not all(isinstance(r, RankRun) for r in runs):
        raise TypeError(f"runs must be the list of RankRun that train() returns, got {runs!r}")
    return chrome_trace([r.spans for r in sorted(runs, key=lambda r: r.rank)], path=path)


def reference(spec: TrainSpec) -> RankRun:
    """One process, no torch.distributed: SGD on the whole batch at once.

    The update is written out, as :func:`make_optimizer`'s ``torch.optim.SGD`` computes it
    (momentum buffer b = g on the first step, then b = m·b + g; w -= lr·b): an independent
    check of the ranks' optimizer, and no ``torch._dynamo`` import (seconds) in the caller.
    """
    model = make_model(spec)
    params = list(model.parameters())
    buffers: list = [None] * len(params)
    run = RankRun(0, [], [], [], {})
    for i in range(spec.steps):
        x, target = make_batch(spec, i)
        model.zero_grad()
        loss = nn.functional.mse_loss(model(x), target)
        loss.backward()
        with torch.no_grad():
            for j, p in enumerate(params):
                update = p.grad
                if spec.momentum:
                    buffers[j] = (update.clone() if buffers[j] is None
                                  else buffers[j].mul_(spec.momentum).add_(update))
                    update = buffers[j]
                p.add_(update, alpha=-spec.lr)
        run.losses.append(loss.item())
    run.state = _cpu_state(model)
    return run


def latest_checkpoint(directory: str) -> dict | None:
    """The newest checkpoint rank 0 wrote into ``directory`` (None if there is none)."""
    files = sorted(f for f in os.listdir(directory) if f.startswith("step_") and f.endswith(".pt"))
    return torch.load(os.path.join(directory, files[-1])) if files else None


def read_journal(directory: str, rank: int) -> list[str]:
    """The lines rank ``rank`` wrote into its journal during :func:`train`."""
    path = os.path.join(directory, f"rank{rank}.log")
    return open(path).read().splitlines() if os.path.exists(path) else []


