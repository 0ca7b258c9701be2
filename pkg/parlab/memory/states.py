"""Model states per GPU: parameters, gradients, fp32 master weights and optimizer state, and ZeRO.

Why this module exists: every byte count of the model states in the companion (the
calculator's :func:`parlab.memory.estimate`, its search :func:`parlab.memory.min_gpus`, and
ZeRO, issue 17) comes from the one function here, :func:`model_state_bytes`, and the two
tables it reads, :data:`PRECISIONS` and :data:`OPTIMIZERS`. Split from
:mod:`parlab.memory.calculator` to keep each module short and each formula in one place.

The maths (Rajbhandari et al., 2020, "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", section 5). A model of Psi parameters trained in mixed precision keeps
2 Psi bytes of fp16/bf16 parameters, 2 Psi bytes of gradients and K Psi bytes of "optimizer
states", where K counts the fp32 master copy (4) and the optimizer's fp32 buffers (4 each:
Adam's two moments give K = 4 + 8 = 12). Every data-parallel rank of plain data parallelism
holds all of it, (2 + 2 + K) Psi: 16 Psi for mixed-precision Adam. ZeRO shards the states
over the N_d data-parallel ranks, one more kind per stage:

- stage 0 (plain data parallelism)  (2 + 2 + K) Psi
- stage 1, P_os (optimizer states)  2 Psi + 2 Psi + K Psi / N_d
- stage 2, P_os+g (and gradients)   2 Psi + (2 + K) Psi / N_d
- stage 3, P_os+g+p (and params)    (2 + 2 + K) Psi / N_d

In fp32 there is no master copy: parameters and gradients take 4 bytes each and K is the
optimizer's buffers alone (SGD 0, momentum 4, Adam 8).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import NamedTuple

import torch

from parlab.checks import check_count

__all__ = ["PRECISIONS", "OPTIMIZERS", "ZERO_STAGES", "Precision", "ModelStates",
           "model_state_bytes", "bytes_per_parameter_table", "check_zero", "check_precision",
           "check_optimizer", "check_split"]


class Precision(NamedTuple):
    name: str
    dtype: torch.dtype
    bytes: int      # bytes per parameter, gradient and activation element
    master: bool    # an fp32 copy of the weights for the optimizer


PRECISIONS = {p.name: p for p in (Precision("fp32", torch.float32, 4, False),
                                   Precision("fp16", torch.float16, 2, True),
                                   Precision("bf16", torch.bfloat16, 2, True))}
#: fp32 state values the optimizer keeps per parameter
OPTIMIZERS = {"sgd": 0, "momentum": 1, "adam": 2}
#: ZeRO stages: 0 none, 1 optimizer states (with the master weights), 2 and gradients,
#: 3 and parameters
ZERO_STAGES = (0, 1, 2, 3)
_FP32 = 4  # bytes of an fp32 master weight or optimizer value


@dataclass(frozen=True)
class ModelStates:
    """Bytes of the model states on one GPU, part by part; ``total`` adds them up."""

    parameters: int
    gradients: int
    master_weights: int
    optimizer_state: int

    @property
    def total(self) -> int:
        return sum(self.parts().values())

    def parts(self) -> dict[str, int]:
        """Part name -> bytes, in field order."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def check_split(batch, dp, tp, pp, microbatches) -> None:
    """Positive degrees, and a global ``batch`` that splits into dp x microbatches equal parts."""
    check_count("batch", batch)
    for name, value in (("dp", dp), ("tp", tp), ("pp", pp), ("microbatches", microbatches)):
        check_count(name, value)
    if batch % (dp * microbatches):
        raise ValueError(f"batch={batch} does not split into dp={dp} x microbatches="
                         f"{microbatches} equal micro-batches")


def check_zero(zero) -> int:
    """``zero`` if it is a ZeRO stage, else a ValueError that lists :data:`ZERO_STAGES`."""
    if isinstance(zero, bool) or not isinstance(zero, int) or zero not in ZERO_STAGES:
        raise ValueError(f"zero must be a ZeRO stage, one of {list(ZERO_STAGES)} (0: none, "
                         f"1: optimizer states, 2: and gradients, 3: and parameters), "
                         f"got {zero!r}")
    return zero


def check_precision(precision) -> Precision:
    """The :class:`Precision` named ``precision``, else a ValueError listing the valid ones."""
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {list(PRECISIONS)} "
                         f"(fp16/bf16 mean mixed precision with fp32 master weights)")
    return PRECISIONS[precision]


def check_optimizer(optimizer) -> str:
    """``optimizer`` if it is a key of :data:`OPTIMIZERS`, else a ValueError listing them."""
    if not isinstance(optimizer, str) or optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; choose one of {list(OPTIMIZERS)}")
    return optimizer


def model_state_bytes(parameters: int, optimizer: str = "adam", precision: str = "bf16",
                      dp: int = 1, zero: int = 0) -> ModelStates:
    """Bytes per GPU of the model states of a replica of ``parameters`` parameters.

    Per element: parameters and gradients take ``PRECISIONS[precision].bytes`` (4 in fp32,
    2 in fp16/bf16); mixed precision adds a 4-byte fp32 master weight; the optimizer keeps
    ``OPTIMIZERS[optimizer]`` fp32 values (4 bytes each). So K, the paper's bytes of
    "optimizer states" per parameter, is 4 (master) + 4 x OPTIMIZERS[optimizer]: 12 for
    mixed-precision Adam, and the whole replica is (2 + 2 + K) Psi = 16 Psi.

    Under ZeRO stage ``zero`` over ``dp`` data-parallel ranks (Rajbhandari et al., 2020,
    section 5; see the module docstring for the four formulas):

    - 0: nothing is sharded: (2 + 2 + K) Psi;
    - 1 (P_os): the optimizer state and the fp32 master weights (the paper counts the master
      copy in K): 2 Psi + 2 Psi + K Psi / N_d;
    - 2 (P_os+g): also the gradients: 2 Psi + (2 + K) Psi / N_d;
    - 3 (P_os+g+p): also the parameters: (2 + 2 + K) Psi / N_d.

    A sharded part holds ``ceil(parameters / dp)`` elements on every rank: the flat buffer
    is padded so that every shard has the same size, as PyTorch FSDP and DeepSpeed do (the
    collectives need equal chunks), so the shards may add up to a little more than the
    whole. Counted is what lives between steps; the transient buffers of the collectives
    (ZeRO-3's gathered layer, ZeRO-2's gradient buckets) are not, as in the paper.
    """
    check_count("parameters", parameters)
    check_count("dp", dp)
    check_zero(zero)
    p = check_precision(precision)
    state_values = OPTIMIZERS[check_optimizer(optimizer)]
    whole, shard = parameters, -(-parameters // dp)  # ceil, exact for any int

    def held(stage: int) -> int:
        """Elements of a part that ZeRO shards from ``stage`` on."""
        return shard if zero >= stage else whole

    return ModelStates(parameters=p.bytes * held(3), gradients=p.bytes * held(2),
                       master_weights=_FP32 * held(1) if p.master else 0,
                       optimizer_state=_FP32 * state_values * held(1))


def bytes_per_parameter_table(settings=(("fp32", "sgd"), ("fp32", "adam"), ("bf16", "adam"))
                              ) -> str:
    """The model states of one parameter, part by part, for each (precision, optimizer);
    "-" where the precision keeps no fp32 master copy."""
    header = (f"{'precision, optimizer':<22}{'weights':>8}{'gradients':>10}{'master':>7}"
              f"{'optimizer':>10}{'bytes':>6}")
    rows = [header]
    for precision, optimizer in settings:
        states = model_state_bytes(1, optimizer, precision)
        master = states.master_weights if check_precision(precision).master else "-"
        rows.append(f"{precision + ', ' + optimizer:<22}{states.parameters:>8}"
                    f"{states.gradients:>10}{master:>7}{states.optimizer_state:>10}"
                    f"{states.total:>6}")
    return "\n".join(rows)
