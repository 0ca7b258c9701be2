"""ZeRO at scale: bytes per GPU per step, memory per GPU, and communication against compute.

Why this module exists: the runs in :mod:`parlab.sharded.runs` have four ranks and a few
thousand parameters; the reader's question is about billions of parameters on hundreds of
GPUs. The same quantities, in closed form, with every formula borrowed from its one home:
ring bytes from :func:`parlab.comm.ring_wire_bytes`, model states from
:func:`parlab.memory.model_state_bytes`, compute time from
:func:`parlab.models.compute_seconds`. The tests hold the bytes against the toy log.

Bytes each rank sends per step, for parameters of P bytes over N ranks (ring collectives,
each rank sending 1/N of the wire bytes):

- stages 0, 1, 2: one reduce-scatter and one all-gather of P: 2 (N-1)/N P, the same as an
  all-reduce (stage 0 *is* that all-reduce);
- stage 3: all-gather in forward, again in backward, and a reduce-scatter: 3 (N-1)/N P.

Time per step is the alpha-free bandwidth term, bytes / NIC bandwidth, beside the compute of
the rank's share of a fixed global batch; nothing overlaps in this model (frameworks hide
some communication behind compute, so this is the pessimistic end).
"""

from __future__ import annotations

from parlab.hardware import NIC_GBPS
from parlab.comm import nic, ring_wire_bytes
from parlab.memory import model_state_bytes
from parlab.models import compute_seconds
from parlab.sharded.zero import check_stage

__all__ = ["ZERO_COLLECTIVES", "zero_bytes_per_rank", "zero_scaling", "GLOBAL_BATCH",
           "GLOBAL_TOKENS"]

#: The collectives of one step per stage, each over the whole parameter payload.
ZERO_COLLECTIVES = {0: ("all_reduce",), 1: ("reduce_scatter", "all_gather"),
                    2: ("reduce_scatter", "all_gather"),
                    3: ("all_gather", "all_gather", "reduce_scatter")}
#: One global batch for :func:`zero_scaling`: (sequences, tokens per sequence).
GLOBAL_BATCH = (2048, 2048)
#: Its tokens (about 4 M, a common LLM batch).
GLOBAL_TOKENS = GLOBAL_BATCH[0] * GLOBAL_BATCH[1]


def zero_bytes_per_rank(parameter_bytes: float, n: int, stage: int) -> float:
    """Bytes each of ``n`` ranks sends in one step of ZeRO ``stage`` (ring collectives)."""
    check_stage(stage)
    return sum(ring_wire_bytes(op, parameter_bytes, n) for op in ZERO_COLLECTIVES[stage]) / n


def zero_scaling(params: float, gpus=(8, 16, 32, 64, 128, 256, 512, 1024), *,
                 precision: str = "bf16", optimizer: str = "adam", gbps: float = NIC_GBPS,
                 global_tokens: int = GLOBAL_TOKENS):
    """One row per (GPU count, stage): model-state GB per GPU, GB sent, seconds of each.

    ``params`` parameters in ``precision`` (the collectives carry 2-byte values in mixed
    precision), trained with ``optimizer``; a global batch of ``global_tokens`` tokens split
    evenly over the GPUs; a ``gbps`` NIC per GPU.
    """
    import pandas as pd

    if not params > 0:
        raise ValueError(f"params must be a positive number of parameters, got {params!r}")
    states = {stage: [model_state_bytes(int(params), optimizer, precision, n, stage) for n in gpus]
              for stage in ZERO_COLLECTIVES}
    element = states[0][0].parameters / int(params)
    bandwidth = nic(gbps).bandwidth
    rows = []
    for i, n in enumerate(gpus):
        compute = compute_seconds(params, global_tokens / n)
        for stage in ZERO_COLLECTIVES:
            sent = zero_bytes_per_rank(params * element, n, stage)
            rows.append({"gpus": n, "stage": stage, "GB per GPU": states[stage][i].total / 1e9,
                         "GB sent per GPU": sent / 1e9, "comm s": sent / bandwidth,
                         "compute s": compute})
    return pd.DataFrame(rows)
