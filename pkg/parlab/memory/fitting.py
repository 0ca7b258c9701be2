"""The fewest GPUs a job fits on: every data, tensor and pipeline split tried, busiest GPU first.

Why this module exists: chapter 01 asks how many 80 GB GPUs a model needs to train at all.
:func:`min_gpus` answers by pricing splits with :func:`parlab.memory.estimate` (for a config)
or one fake trace per micro-batch size (for a ``torch.nn.Module``) until the busiest GPU fits.
"""

from __future__ import annotations

import math

from torch import nn

from parlab.checks import check_count
from parlab.hardware import gpu_memory
from parlab.memory.breakdown import describe_setup, Plan
from parlab.memory.calculator import estimate
from parlab.memory.setup import resolve_setup
from parlab.memory.decoders import DECODERS, tp_problem
from parlab.memory.modules import module_pricer
from parlab.memory.tracing import module_children
from parlab.memory.vshape import v_problem

__all__ = ["min_gpus"]


def min_gpus(model, input_shape=None, optimizer: str = "adam", precision: str = "fp32",
             gpu_memory_gb: float | None = None, microbatches: int = 1, schedule: str = "1f1b",
             max_tp: int = 8, zero: int = 0, recompute: str | None = None, *,
             example_input=None, loss_fn=None, ep: int = 1, gpu: str | None = None) -> Plan:
    """The fewest GPUs (dp x tp x pp) whose busiest GPU fits in ``gpu_memory_gb``.

    Tensor parallelism is kept within one server and to powers of two (up to ``max_tp``, 8
    GPUs), as in practice; pipeline stages may hold unequal numbers of layers.
    Plain data parallelism (``zero=0``) copies the whole model state, so it only helps by
    cutting the activations of each replica; with ZeRO (``zero`` 1 to 3) it also shards the
    model states. ``recompute`` trades activations for compute (:func:`estimate`).

    ``model`` is anything :func:`estimate` takes. A ``torch.nn.Module`` (with
    ``input_shape`` or ``example_input``, and ``loss_fn``, as for :func:`estimate`) is split
    by data parallelism and by pipeline stages of contiguous top-level children, balanced
    by parameter count (tp stays 1); it is traced once per micro-batch size tried. With ``ep``
    (its MoE layers' experts over ``ep`` GPUs), only data-parallel degrees that ``ep`` divides
    are tried. ``gpu``: a name in :data:`parlab.hardware.GPUS`, whose capacity is the limit
    (as in :func:`estimate`; None: ``gpu_memory_gb``, else 80 GB).
    """
    check_count("max_tp", max_tp)
    gpu_memory_gb = gpu_memory(gpu, gpu_memory_gb)
    s = resolve_setup(model, input_shape, optimizer, precision, ep, 1, 1, microbatches,
                      schedule, gpu_memory_gb, zero, recompute, example_input=example_input,
                      loss_fn=loss_fn, ep=ep)
    if isinstance(s.model, nn.Module):
        module_price = module_pricer(s, "estimate per GPU")
        price = lambda dp, tp, pp: module_price(dp, pp)
        layers, tps = len(module_children(s.model)), [1]
    else:
        price = lambda dp, tp, pp: estimate(s.model, input_shape, optimizer, precision, dp, tp,
                                            pp, microbatches, schedule, gpu_memory_gb, zero,
                                            recompute)
        decoder = isinstance(s.model, DECODERS)
        layers = s.model.n_layers if decoder else len(s.model.layers)
        tps = [2**i for i in range(max_tp.bit_length()) if decoder and 2**i <= max_tp
               and not tp_problem(s.model, 2**i)] or [1]
    ideal = math.ceil(price(1, 1, 1).total / s.capacity)
    dps = [d for d in range(1, s.batch + 1) if s.batch % (d * microbatches) == 0
           and d % s.ep == 0]
    best = None
    for dp in dps:
        for tp in tps:
            for pp in range(1, layers + 1):
                if best is not None and dp * tp * pp >= best.gpus:
                    break
                if v_problem(s.schedule, pp, microbatches, layers):
                    break
                b = price(dp, tp, pp)
                if b is None:  # a module whose children do not run in order: no pipeline
                    break
                if b.fits:
                    best = Plan(dp * tp * pp, dp, tp, pp, b, ideal)
                    break
    if best is None:
        deepest = max(pp for pp in range(1, layers + 1)  # a V: 2 pp chunks, m >= 2 pp
                      if not v_problem(s.schedule, pp, microbatches, layers))
        split = f"tp={max(tps)}, pp={deepest}" if tps != [1] else f"pp={deepest}"
        raise ValueError(f"{describe_setup(s, 'does not fit')} on any split up to {split}: use "
                         f"more micro-batches, "
                         + (f"ZeRO (zero={s.zero + 1} to 3), " if s.zero < 3 else "")
                         + ("recompute='full', " if s.recompute != "full" else "")
                         + "or a bigger GPU")
    return best
