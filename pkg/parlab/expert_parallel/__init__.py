"""Expert parallelism (chapter 07): each rank holds some experts; tokens travel to them and back.

``dispatch`` (the dispatcher that replaces :class:`parlab.models.moe.LocalExperts`: tokens
out with one all-to-all, outputs home with a second, in two layouts: exact splits or
fixed-capacity buffers), ``parallelize`` (:func:`apply_expert_parallel`, which gives every MoE layer of a
model its rank's experts and that dispatcher) and ``traffic`` (the bytes: exact from a
routing, in closed form, and against tensor-parallel experts). The all-to-all itself, with
its backward, is :func:`parlab.comm.all_to_all`. Imports :mod:`parlab.models`.
"""

from parlab.expert_parallel.dispatch import AllToAllDispatcher, LAYOUTS
from parlab.expert_parallel.parallelize import (
    apply_expert_parallel, global_parameter_names, local_experts
)
from parlab.expert_parallel.traffic import (
    dispatch_bytes, routed_bytes, tensor_parallel_expert_bytes
)

__all__ = ["AllToAllDispatcher", "LAYOUTS", "apply_expert_parallel",
           "local_experts", "global_parameter_names", "dispatch_bytes", "routed_bytes",
           "tensor_parallel_expert_bytes"]
