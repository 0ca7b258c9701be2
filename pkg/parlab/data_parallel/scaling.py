"""The traffic of data parallelism: measured on the toy backend, then modelled at cluster scale.

Measured: :func:`traffic_table` trains on N toy-backend ranks and counts the bytes each rank
sends per step, beside :func:`parlab.comm.allreduce_bytes_per_rank`; :func:`layer_traffic`
shows that a layer's gradient traffic is its weight count, whatever the batch. Modelled:
:func:`sync_cost` and :func:`bucketing_table` put the alpha-beta model of
:mod:`parlab.comm.cost` on thousands of GPUs, against the compute time of
:func:`parlab.models.compute_seconds`.
"""

from __future__ import annotations

from dataclasses import dataclass

from parlab.hardware import NIC_GBPS
from parlab.comm import (
    ALGORITHMS, allreduce_bytes_per_rank, allreduce_steps, allreduce_time, gpu_name, nic,
    run_with_traffic
)
from parlab.data_parallel.sync import bucket_bytes, make_buckets
from parlab.models import compute_seconds
from parlab.data_parallel.training import (
    TrainSpec, make_model, reference, train_rank
)
from parlab.models import max_difference

__all__ = ["replica_names", "gradient_bytes", "measure_traffic", "traffic_table",
           "layer_traffic", "sync_cost", "bucketing_table", "TOKENS_PER_GPU", "SCALES",
           "SyncScaling", "sync_scaling"]


def replica_names(world_size: int) -> list[str]:
    """Figure 8-2's names: one GPU per server on one rail, so A1, A2, A3, ... (see topology)."""
    return [gpu_name(r, gpus_per_server=1) for r in range(world_size)]


def gradient_bytes(spec: TrainSpec) -> int:
    """Bytes of one full set of gradients of the spec's model (= bytes of its weights)."""
    return sum(p.numel() * p.element_size() for p in make_model(spec).parameters())


def measure_traffic(spec: TrainSpec, world_size: int, algorithm: str):
    """Train ``spec`` on the toy backend; return (runs, bytes each rank sent per step).

    Only the gradient all-reduces count: the broadcast of rank 0's weights at the start
    happens once per run, not once per step.
    """

    runs, log = run_with_traffic(train_rank, world_size, spec, algorithm=algorithm)
    sent = log.filter(op="all_reduce").per_rank()["sent"]
    return runs, [int(sent.get(r, 0)) // spec.steps for r in range(world_size)]


def traffic_table(spec: TrainSpec, world_sizes=(2, 4), algorithms=("ring", "naive")):
    """Measured bytes per rank per step against the closed form, for each N and algorithm."""
    import pandas as pd


    size, ref = gradient_bytes(spec), reference(spec)
    rows = []
    for n in world_sizes:
        for algorithm in algorithms:
            runs, sent = measure_traffic(spec, n, algorithm)
            formula = allreduce_bytes_per_rank(size, n, algorithm)
            error = max(max_difference(r.state, ref.state) for r in runs)
            for rank, name in enumerate(replica_names(n)):
                rows.append({"ranks": n, "algorithm": algorithm, "GPU": name,
                             "sent per step (B)": sent[rank],
                             "closed form (B)": round(formula[rank], 1),
                             "weights = one process": error < 1e-6})
    return pd.DataFrame(rows)


def layer_traffic(spec: TrainSpec, batches=(8, 64)):
    """Per parameter tensor, bytes each of 2 ranks sends per step, for several batch sizes.

    With one all-reduce per tensor and a ring of 2, a rank sends exactly its tensor's bytes:
    C_out x C_in x 4 for a weight matrix, whatever the batch.
    """
    import pandas as pd


    params = list(make_model(spec).named_parameters())
    order = [i for bucket in make_buckets([p for _, p in params]) for i in bucket]
    sent = {}
    for batch in batches:
        one = spec.replace(samples=batch, micro_batches=2, steps=1, bucket_cap_bytes=None)
        _, log = run_with_traffic(train_rank, 2, one, algorithm="ring")
        calls = log.filter(op="all_reduce", src=0)
        by_call = {}
        for rec in calls.records:
            by_call[rec.call] = by_call.get(rec.call, 0) + rec.nbytes
        sent[batch] = dict(zip(order, [by_call[c] for c in sorted(by_call)]))
    rows = []
    for i, (name, p) in enumerate(params):
        c_out, c_in = (tuple(p.shape) + (1,))[:2]
        row = {"tensor": name, "C_in": c_in if p.ndim == 2 else "-", "C_out": c_out,
               "C_in x C_out x 4 B": c_in * c_out * 4 if p.ndim == 2 else "-"}
        row.update({f"sent, batch {b} (B)": sent[b][i] for b in batches})
        rows.append(row)
    return pd.DataFrame(rows)


#: The step of the scaling figure: 8 sequences of 2048 tokens per GPU (compute time from
#: :func:`parlab.models.compute_seconds`; the network side is :mod:`parlab.comm.cost`'s
#: alpha-beta model).
TOKENS_PER_GPU = 8 * 2048


SCALES = [2 ** k for k in range(1, 15)]  # 2 ... 16384 GPUs


def sync_cost(params: float, gpus: int, gbps: float, algorithm: str, dtype_bytes: int = 2):
    """(bytes through the busiest NIC, seconds) of one gradient all-reduce per step."""

    size = params * dtype_bytes
    busiest = max(allreduce_bytes_per_rank(size, gpus, algorithm))
    return busiest, allreduce_time(size, gpus, algorithm, nic(gbps))


@dataclass(frozen=True)
class SyncScaling:
    """:func:`sync_cost` of every all-reduce algorithm at every cluster size of ``scales``,
    the compute time of one step, and the chosen algorithm at ``gpus``."""

    params: float
    gpus: int
    gbps: float
    algorithm: str
    dtype_bytes: int
    scales: list             # GPUs: 2 ... 16384 (:data:`SCALES`)
    curves: dict             # {algorithm: [(bytes through the busiest NIC, seconds) per scale]}
    compute_seconds: float   # forward + backward of TOKENS_PER_GPU tokens
    busiest: float           # bytes through the busiest NIC at ``gpus`` with ``algorithm``
    seconds: float           # and the seconds they take


def sync_scaling(params: float, gpus: int, gbps: float, algorithm: str,
                 dtype_bytes: int = 2) -> SyncScaling:
    """The gradient all-reduce of ``params`` parameters from 2 to 16384 GPUs, each algorithm
    (:func:`sync_cost`), against :func:`parlab.models.compute_seconds` of one step."""
    curves = {alg: [sync_cost(params, n, gbps, alg, dtype_bytes) for n in SCALES]
              for alg in ALGORITHMS}
    busiest, seconds = sync_cost(params, gpus, gbps, algorithm, dtype_bytes)
    return SyncScaling(params, gpus, gbps, algorithm, dtype_bytes, list(SCALES), curves,
                       compute_seconds(params, TOKENS_PER_GPU), busiest, seconds)


def bucketing_table(params, gpus: int = 64, gbps: float = NIC_GBPS,
                    caps=(None, 2**20, 25 * 2**20, 2**40)):
    """All-reduce calls and modelled seconds per step for bucket caps (ring, NIC links).

    ``params`` are the model's parameter tensors (meta tensors are fine: only sizes count).
    """
    import pandas as pd


    link, rows = nic(gbps), []
    for cap in caps:
        sizes = bucket_bytes(params, cap)
        seconds = sum(allreduce_time(s, gpus, "ring", link) for s in sizes)
        latency = len(sizes) * allreduce_steps(gpus, "ring") * link.alpha
        rows.append({"bucket cap": "one per tensor" if cap is None else
                     ("everything" if cap >= sum(sizes) else f"{cap / 2**20:.3g} MiB"),
                     "all-reduce calls": len(sizes), "modelled ms": round(seconds * 1e3, 3),
                     "of which latency ms": round(latency * 1e3, 3)})
    return pd.DataFrame(rows)
