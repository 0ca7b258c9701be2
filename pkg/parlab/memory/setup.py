"""Every argument of a memory estimate checked once, into one :class:`Setup`.

:func:`resolve_setup` is the single door of :func:`parlab.memory.estimate`,
:func:`parlab.memory.measure`, :func:`parlab.memory.estimate_ranks` and
:func:`parlab.memory.min_gpus`: a bad value fails here, with an error that names it and the
valid ones, before any formula or trace runs.
"""

from __future__ import annotations

import os

from torch import nn

from parlab.memory.breakdown import check_capacity, check_schedule, Setup
from parlab.memory.decoders import (check_dropout, check_sequence_split, CP_METHODS, DECODERS,
                                    tp_problem)
from parlab.memory.modules import module_setup
from parlab.memory.recompute import check_recompute
from parlab.memory.states import check_optimizer, check_precision, check_split, check_zero
from parlab.memory.interleaved import interleave_problem
from parlab.memory.stages import check_stage_layers, rank_layers
from parlab.memory.vshape import V_SCHEDULES, v_problem
from parlab.models import BookMLP, DeepSeekV3Config, get_config
from parlab.checks import check_choice, check_count

__all__ = ["resolve_setup"]


def resolve_setup(model, input_shape, optimizer, precision, dp, tp, pp, microbatches, schedule,
                  gpu_memory_gb, zero=0, recompute=None, *, example_input=None, loss_fn=None,
                  split_points=None, ep=1, cp=1, cp_method="ring",
                  sequence_parallel=False, virtual_stages=1, stage_layers=None,
                  dropout=False) -> Setup:
    """Check every argument once, with an error that names the bad value and the valid ones.

    A ``torch.nn.Module`` is checked by :func:`parlab.memory.modules.module_setup`;
    ``example_input``, ``loss_fn``, ``split_points`` and ``ep`` are for modules only,
    ``cp``, ``cp_method`` and ``sequence_parallel`` for transformer configs only,
    ``stage_layers`` (:mod:`parlab.memory.stages`) for a config or a BookMLP, ``dropout``
    (:func:`parlab.memory.decoders.block_terms`) for a GPT config."""
    check_count("cp", cp, "context-parallel ranks")
    check_choice("cp_method", cp_method, CP_METHODS)
    if not isinstance(sequence_parallel, bool):
        raise TypeError(f"sequence_parallel must be True or False, got {sequence_parallel!r}")
    if (cp > 1 or sequence_parallel) and not isinstance(model, (str, dict, os.PathLike, *DECODERS)):
        raise ValueError(f"cp={cp} and sequence_parallel={sequence_parallel} split a transformer "
                         f"config's sequence (a TransformerConfig or LlamaConfig, or its name); "
                         f"got {type(model).__name__}")
    if isinstance(model, (str, dict, os.PathLike)):
        model = get_config(model)
    if isinstance(model, DeepSeekV3Config):
        model.check_modelled("the memory calculator")
    if not isinstance(model, (*DECODERS, BookMLP, nn.Module)):
        raise TypeError(f"model must be a TransformerConfig or a LlamaConfig (or a config name, "
                        f"a Hugging Face config dict or config.json path), a BookMLP, or any "
                        f"torch.nn.Module, got {type(model).__name__}")
    check_dropout(model, dropout, cp)
    precision = check_precision(precision)
    optimizer = check_optimizer(optimizer)
    check_schedule(schedule)
    check_zero(zero)
    check_recompute(recompute)
    capacity = check_capacity(gpu_memory_gb)
    if isinstance(model, nn.Module):
        if stage_layers is not None:
            raise ValueError(f"stage_layers={stage_layers!r} counts a config's layers; a "
                             f"torch.nn.Module's stages are cut at split_points (child indices)")
        if schedule in V_SCHEDULES or virtual_stages != 1:
            raise ValueError(f"schedule={schedule!r}, virtual_stages={virtual_stages!r}: a "
                             f"torch.nn.Module takes 1f1b, gpipe or zb-h1 with one chunk per rank")
        return module_setup(model, input_shape, example_input, precision, optimizer, dp, tp, pp,
                            microbatches, schedule, capacity, zero, recompute, loss_fn,
                            split_points, ep)
    extra = [k for k, v in (("example_input", example_input), ("loss_fn", loss_fn),
                            ("split_points", split_points)) if v is not None]
    if ep != 1:
        raise ValueError(f"ep={ep!r}: expert parallelism is modelled for a torch.nn.Module with "
                         f"MoE layers (a config with experts is not modelled yet); a config "
                         f"takes ep=1")
    if extra:
        raise ValueError(f"{', '.join(extra)}: for a torch.nn.Module only; a config or a BookMLP "
                         f"takes input_shape")
    if isinstance(input_shape, (tuple, list)) and input_shape:
        shape = tuple(input_shape)
    elif isinstance(input_shape, int) and not isinstance(input_shape, bool):
        shape = (input_shape,)
    else:
        raise ValueError(f"input_shape must be the global batch as a tuple of ints, (batch, "
                         f"seq) for a transformer or (batch,) for an MLP, got {input_shape!r}")
    decoder = isinstance(model, DECODERS)
    if decoder:
        if len(shape) != 2:
            raise ValueError(f"a transformer's input_shape is (batch, seq), got {input_shape!r}")
        batch, seq = shape
        check_count("seq", seq)
        if seq > model.context:
            raise ValueError(f"seq={seq} exceeds {model.name}'s context of {model.context}")
    else:
        if len(shape) not in (1, 2) or (len(shape) == 2 and shape[1] != model.sizes[0]):
            raise ValueError(f"an MLP's input_shape is (batch,) or (batch, {model.sizes[0]}), "
                             f"got {input_shape!r}")
        batch, seq = shape[0], 1
    check_split(batch, dp, tp, pp, microbatches)
    layers = model.n_layers if decoder else len(model.layers)
    if pp > layers:
        raise ValueError(f"pp={pp} stages for {layers} layers: at most one stage per layer")
    stage_layers = check_stage_layers(stage_layers, layers, pp, getattr(model, "name", "the model"))
    rank_layers(layers, pp, schedule, virtual_stages, stage_layers)  # one chunk per rank
    for problem in (v_problem(schedule, pp, microbatches, layers),
                    interleave_problem(schedule, pp, microbatches, virtual_stages, layers)):
        if problem:
            raise ValueError(problem)
    if decoder and tp_problem(model, tp):
        raise ValueError(tp_problem(model, tp))
    if decoder:
        check_sequence_split(model, seq, tp, cp, cp_method, sequence_parallel, recompute)
    if not decoder and tp != 1:
        raise ValueError(f"tensor parallelism is modelled for transformer configs; "
                         f"use tp=1 for {model!r}")
    return Setup(model, batch, seq, precision, optimizer, dp, tp, pp, microbatches, schedule,
                 capacity, zero, recompute, cp=cp, cp_method=cp_method,
                 sequence_parallel=sequence_parallel, virtual_stages=virtual_stages,
                 stage_layers=stage_layers, dropout=dropout)
