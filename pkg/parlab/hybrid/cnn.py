"""The slides' CNN advice, measured and run: data parallel convolutions, tensor parallel FC layers.

Why this module exists: :mod:`parlab.models.cnn` measures where a small CNN keeps its compute and its
parameters, and :mod:`parlab.hybrid.cnn_step` runs the hybrid step. This module adds the two things
the chapter's argument still needs:

- :func:`crossover_batch`: for one layer, the largest batch at which splitting the layer
  (tensor parallel, the cheaper of its two splits) still moves fewer bytes than replicating
  it (data parallel). Data parallelism sends the layer's weights, whatever the batch; tensor
  parallelism sends activations, which grow with the batch. So every layer has such a line:
  far above any real batch for a fully connected layer, below 1 for a wide-image convolution,
  and in between for the last convolutions, whose images are small;
- :func:`assignment_bytes`: the bytes per step of every way to give the convolutions and the
  fully connected layers a strategy each: the slides' choice is the cheapest;
- :func:`hybrid_traffic`: the hybrid step on the "toy" backend, its messages split into the
  tensor-parallel part (features gathered, logits reduced, their gradients scattered back)
  and the data-parallel part (convolution gradients summed), with the parameters compared
  against the one-process step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from parlab.models import LayerProfile, communication_per_layer, share_by_kind

__all__ = ["crossover_batch", "assignment_bytes", "HybridTraffic", "hybrid_traffic",
           "TENSOR_SPLITS", "CnnCommunication", "cnn_communication"]

#: The two ways to split one layer (the slides' "partition output" and "reduce output").
TENSOR_SPLITS = ("tp_partition_output", "tp_reduce_output")


def crossover_batch(profiles: list[LayerProfile], layer: str) -> int:
    """The largest batch at which splitting ``layer`` moves fewer bytes than replicating it.

    0 means data parallelism is cheaper even for one sample. Computed from
    :func:`parlab.models.communication_per_layer` at batch 1 (tensor-parallel bytes grow in
    proportion to the batch; data-parallel bytes do not change).
    """
    rows = {r["layer"]: r for r in communication_per_layer(profiles, batch=1)}
    if layer not in rows:
        raise ValueError(f"no layer {layer!r}; layers: {list(rows)}")
    row = rows[layer]
    per_sample = min(row[k] for k in TENSOR_SPLITS)
    return (row["data_parallel"] - 1) // per_sample  # largest B with B x per_sample < data


@dataclass(frozen=True)
class CnnCommunication:
    """Where a CNN's FLOPs and parameters are, its bytes per layer per strategy at ``batch``,
    and one layer's bytes for one sample with its crossover batch (:func:`cnn_communication`)."""

    batch: int
    layer: str
    shares: dict       # {kind: {"flops": share, "params": share}} (share_by_kind)
    rows: list         # communication_per_layer at ``batch``
    one: dict          # ``layer``'s row of communication_per_layer at batch 1
    crossover: int     # crossover_batch of ``layer``


def cnn_communication(profiles: list[LayerProfile], batch: int = 8,
                      layer: str = "conv5") -> CnnCommunication:
    """The numbers of the chapter's CNN figure, from the profiles of
    :func:`parlab.models.profile`."""
    one = {r["layer"]: r for r in communication_per_layer(profiles, 1)}
    if layer not in one:
        raise ValueError(f"no layer {layer!r}; layers: {list(one)}")
    return CnnCommunication(batch, layer, share_by_kind(profiles),
                            communication_per_layer(profiles, batch), one[layer],
                            crossover_batch(profiles, layer))


def assignment_bytes(profiles: list[LayerProfile], batch: int) -> dict[tuple[str, str], int]:
    """Bytes per step for each way to assign a strategy to each layer kind.

    Keys are (strategy of the convolutions, strategy of the fully connected layers), each
    ``"data"`` (replicate: send the weights' gradients) or ``"tensor"`` (split: send the
    activations, the cheaper of the two splits, layer by layer). Element counts as in
    :func:`parlab.models.communication_per_layer`, before any collective's factor.
    """
    rows = communication_per_layer(profiles, batch)
    cost = {"data": lambda r: r["data_parallel"],
            "tensor": lambda r: min(r[k] for k in TENSOR_SPLITS)}
    return {(conv, fc): sum(cost[conv if r["kind"] == "conv" else fc](r) for r in rows)
            for conv in cost for fc in cost}


@dataclass
class HybridTraffic:
    """The hybrid step on the toy backend: results, reference, and bytes by strategy."""

    world_size: int
    batch: int
    ranks: list
    reference: dict
    log: object  # TrafficLog

    @property
    def max_error(self) -> float:
        """Largest difference from the one-process step (FC slices stitched back together)."""
        full = {"fc1.weight": torch.cat([r["fc1.weight"] for r in self.ranks], dim=0),
                "fc1.bias": torch.cat([r["fc1.bias"] for r in self.ranks]),
                "fc2.weight": torch.cat([r["fc2.weight"] for r in self.ranks], dim=1)}
        worst = 0.0
        for name, value in self.reference.items():
            pieces = [full[name]] if name in full else [r[name] for r in self.ranks]
            worst = max(worst, *(float((p - value).abs().max()) for p in pieces))
        return worst

    def bytes_by_strategy(self) -> dict[str, dict[str, int]]:
        """``{"tensor" | "data": {op: bytes sent}}``, from the group label of each message.

        :func:`parlab.hybrid.hybrid_step` runs the fully connected layers' collectives on
        a group labelled "tensor" and the convolutions' gradient all-reduces on one labelled
        "data" (the same ranks, two groups), so the toy log says which is which.
        """
        out: dict[str, dict[str, int]] = {"tensor": {}, "data": {}}
        for r in self.log.records:
            if r.group not in out:
                raise ValueError(f"a message of group {r.group!r} in the hybrid's log; "
                                 f"expected only 'tensor' and 'data'")
            out[r.group][r.op] = out[r.group].get(r.op, 0) + r.nbytes
        return out

    def table(self) -> str:
        lines = [f"{'strategy':<8} {'collective':<15} {'bytes sent':>11}"]
        for kind, ops in self.bytes_by_strategy().items():
            for op, n in ops.items():
                lines.append(f"{kind:<8} {op:<15} {n:>11,}")
        return "\n".join(lines)


def hybrid_traffic(world_size: int = 2, batch: int = 8, seed: int = 0, width: int = 8,
                   hidden: int = 64) -> HybridTraffic:
    """Run :func:`parlab.hybrid.hybrid_step` on ``world_size`` toy ranks, log its messages."""
    from parlab.hybrid.cnn_step import hybrid_step, reference_step
    from parlab.comm import run_with_traffic

    ranks, log = run_with_traffic(hybrid_step, world_size, batch, seed=seed, width=width,
                                  hidden=hidden)
    reference = reference_step(batch, seed=seed, width=width, hidden=hidden)
    return HybridTraffic(world_size, batch, ranks, reference, log)
