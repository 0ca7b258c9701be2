"""Chapter 04's experiments: attention and Figure 8-19's network on real ranks, beside their
single-device twins.

Why this module exists: a notebook cell should say "run the book's attention on 2 ranks"
and get back everything it needs to show: the output, the gradients of every weight and
of the input (merged from the ranks' pieces), the same from the single-device layer, and,
on the toy backend, every transfer split into forward and backward. The layers live in
:mod:`parlab.tensor_parallel.layers`, :mod:`parlab.tensor_parallel.attention` and :mod:`parlab.tensor_parallel.ffn`; this module
only runs them and packages what happened. For PyTorch's DTensor layer,
:class:`parlab.tensor_parallel.debug.CommBytes` (PyTorch's own ``CommDebugMode``, plus each
collective's bytes) says which collectives it issued, from which module, in which pass.

Each experiment has a ``*_rank`` function (what one rank does; picklable, so
:func:`parlab.launch.run` can ship it) and a ``run_*`` function for the notebook.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from parlab.comm import TrafficLog
from parlab.comm.toy import transfers
from parlab.launch import run
from parlab.tensor_parallel import (
    BookAttention, check_degree, check_ffn_run, check_grad_sync, check_heads,
    dtensor_attention, dtensor_local_grads, FIGURE_8_19_SIZES, ffn_rank, layout,
    merge, merge_grads, MegatronAttention, reference_ffn, SelfAttention
)
from parlab.checks import check_count
from parlab.models import max_difference

__all__ = ["ATTENTION_VARIANTS", "Comparison", "run_attention", "attention_rank",
           "reference_attention", "run_ffn", "ffn_experiment_rank", "phase_split"]

#: The three ways chapter 04 splits self-attention across ranks.
ATTENTION_VARIANTS = {
    "book": "the chapter's way: X broadcast from A1, Q and K all-gathered, V local",
    "megatron": "Megatron-LM: whole heads per rank, one all-reduce each way",
    "pytorch": "torch.distributed.tensor.parallel: ColwiseParallel q/k/v, RowwiseParallel out",
}


# --------------------------------------------------------------------------- traffic phases

class _Phases:
    """Marks in this rank's toy traffic log, so a run can say which transfers were forward.

    Call :meth:`mark` at the start, between the phases and at the end; off the toy backend
    the marks cost nothing and :meth:`result` is None.
    """

    def __init__(self):
        self.toy = dist.get_backend() == "toy"
        self.marks: list[int] = []

    def mark(self) -> None:
        if self.toy:
            self.marks.append(len(transfers()))

    def result(self, names=("forward", "backward")) -> dict | None:
        """``{phase: [transfers this rank sent]}``, or None when the backend logs nothing."""
        if not self.toy:
            return None
        log, me = transfers(), dist.get_rank()
        return {name: [t for t in log[a:b] if t.src == me]
                for name, a, b in zip(names, self.marks, self.marks[1:])}


def phase_split(results: list[dict]) -> dict | None:
    """Every rank's transfers per phase, joined: ``{phase: TrafficLog}`` (None off toy)."""
    if results[0].get("traffic") is None:
        return None
    phases: dict = {}
    for r in results:
        for name, records in r["traffic"].items():
            phases.setdefault(name, []).extend(records)
    return {name: TrafficLog(records) for name, records in phases.items()}


# --------------------------------------------------------------------------- comparison

@dataclass
class Comparison:
    """A parallel run next to its single-device reference.

    ``parallel`` and ``reference`` map names ("output", "x.grad", "q_proj.weight.grad" ...)
    to full tensors; ``traffic`` maps a phase to the transfers it made (None off toy);
    ``info`` holds whatever else the experiment reports (shard specs, GPU names ...).
    """

    name: str
    parallel: dict
    reference: dict
    traffic: dict | None = None
    info: dict = field(default_factory=dict)

    @property
    def max_error(self) -> float:
        """Largest absolute difference over every compared tensor."""
        return max_difference(self.parallel, self.reference)

    def matches(self, atol: float = 1e-5) -> bool:
        return self.max_error <= atol

    def bytes_by_op(self) -> dict:
        """``{phase: {op: bytes}}`` summed over every transfer (all ranks)."""
        if self.traffic is None:
            raise ValueError("no traffic was logged: run with backend='toy'")
        return {phase: _sum_by(log.records, lambda t: t.op) for phase, log in self.traffic.items()}

    def total_bytes(self) -> dict:
        """``{phase: bytes}`` over every transfer."""
        return {phase: log.total_bytes() for phase, log in (self.traffic or {}).items()}

    def summary(self, atol: float = 1e-5) -> str:
        """One line: does every compared tensor equal the single-device one?"""
        grads = sum(1 for k in self.parallel if k.endswith(".grad"))
        verdict = ("equal" if self.matches(atol)
                   else f"DIFFER (largest difference {self.max_error:.2e})")
        return (f"{self.name}: output and {grads} gradients {verdict} to the single-device "
                f"ones (tolerance {atol:g})")

    def traffic_table(self) -> str:
        """Bytes per phase and collective, as logged by the toy backend."""
        lines = [f"{'phase':<9} {'collective':<15} {'bytes':>9}"]
        for phase, ops in self.bytes_by_op().items():
            for op, n in ops.items():
                lines.append(f"{phase:<9} {op:<15} {n:>9,}")
            lines.append(f"{phase:<9} {'(total)':<15} {sum(ops.values()):>9,}")
        return "\n".join(lines)


def _sum_by(records, key) -> dict:
    out: dict = {}
    for t in records:
        out[key(t)] = out.get(key(t), 0) + t.nbytes
    return out


# --------------------------------------------------------------------------- attention

def _attention_inputs(d_model, batch, seq, seed):
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch, seq, d_model, generator=g)
    weight = torch.randn(batch, seq, d_model, generator=g)  # loss = sum(output * weight)
    return x, weight


def reference_attention(d_model=8, n_heads=2, batch=2, seq=4, causal=True, seed=0) -> dict:
    """The single-device layer's output and gradients for the experiment's input and loss."""
    ref = SelfAttention(d_model, n_heads, causal, seed=seed)
    x, weight = _attention_inputs(d_model, batch, seq, seed)
    x.requires_grad_()
    out = ref(x)
    (out * weight).sum().backward()
    result = {"output": out.detach(), "x.grad": x.grad}
    result.update({f"{n}.grad": p.grad for n, p in ref.named_parameters()})
    return result


def attention_rank(variant, d_model=8, n_heads=2, batch=2, seq=4, causal=True, seed=0,
                   grad_sync="all_reduce", prepare_input=True) -> dict:
    """One rank's part of :func:`run_attention`: build the variant, forward, backward."""
    from parlab.tensor_parallel.debug import CommBytes  # (a second and a half to import)

    ref = SelfAttention(d_model, n_heads, causal, seed=seed)
    x, weight = _attention_inputs(d_model, batch, seq, seed)
    if variant == "book":
        layer = BookAttention(ref, grad_sync=grad_sync)
        x = x if dist.get_rank() == 0 else torch.zeros_like(x)  # only A1 has the embeddings
    elif variant == "megatron":
        layer = MegatronAttention(ref)
    elif variant == "pytorch":
        layer = dtensor_attention(ref, prepare_input=prepare_input)
    else:
        raise ValueError(f"unknown variant {variant!r}; choose one of {list(ATTENTION_VARIANTS)}")
    x.requires_grad_()
    phases = _Phases()
    # PyTorch's view of DTensor's calls
    comm = CommBytes() if variant == "pytorch" else None
    with comm if comm is not None else contextlib.nullcontext():
        phases.mark()
        out = layer(x)
        phases.mark()
        (out * weight).sum().backward()
        phases.mark()
    grads = layer.local_grads() if variant != "pytorch" else dtensor_local_grads(layer)
    seen = comm.report() if comm is not None else dict.fromkeys(CommBytes.REPORT)
    return {"output": out.detach().clone(), "x.grad": x.grad, "grads": grads,
            "specs": {name: spec for name, (_, spec) in grads.items()},
            "traffic": phases.result(), "comm": seen}


def run_attention(variant: str, d_model: int = 8, n_heads: int = 2, batch: int = 2, seq: int = 4,
                  world_size: int = 2, backend: str = "gloo", causal: bool = True, seed: int = 0,
                  grad_sync: str = "all_reduce", prepare_input: bool = True) -> Comparison:
    """Run one attention variant on ``world_size`` ranks; compare with the single-device layer.

    The input's gradient is the one on rank 0 (A1), which for the book's variant is the only
    rank that holds the embeddings. ``grad_sync`` applies to the book's variant (see
    :class:`parlab.tensor_parallel.BookAttention`), ``prepare_input`` to PyTorch's (see
    :func:`parlab.tensor_parallel.dtensor_attention`). For PyTorch's variant,
    ``info`` holds what :class:`parlab.tensor_parallel.debug.CommBytes` saw on rank 0: ``collectives`` (``{phase: [(op,
    payload bytes)]}``), ``comm_counts`` (CommDebugMode's ``{phase: {op: count}}``) and
    ``comm_table`` (its table at noise level 0, plain text); for the others they are None.
    """
    if variant not in ATTENTION_VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose one of {list(ATTENTION_VARIANTS)}")
    check_heads(d_model, n_heads)  # every check here runs before any rank starts
    check_count("batch", batch)
    check_count("seq", seq)
    check_grad_sync(grad_sync)
    if variant == "book":  # the same messages as the layers' own checks on the ranks
        check_degree(world_size, d_model, "features of the hidden size (d_model)", "world_size")
    else:
        check_degree(world_size, n_heads, "attention heads", "world_size")
    results = run(attention_rank, world_size, variant, d_model, n_heads, batch, seq, causal,
                  seed, grad_sync, prepare_input, backend=backend)
    for rank, r in enumerate(results[1:], start=1):
        if not torch.allclose(r["output"], results[0]["output"], atol=1e-6):
            raise AssertionError(f"{variant}: rank {rank}'s output differs from rank 0's")
    parallel = {"output": results[0]["output"], "x.grad": results[0]["x.grad"]}
    parallel.update({f"{n}.grad": g for n, g in merge_grads([r["grads"] for r in results]).items()})
    reference = reference_attention(d_model, n_heads, batch, seq, causal, seed)
    return Comparison(variant, parallel, reference, phase_split(results),
                      {"specs": [r["specs"] for r in results], "world_size": world_size,
                       **results[0]["comm"]})


# --------------------------------------------------------------------------- Figure 8-19

def ffn_experiment_rank(sizes, tensor, batch, micro_batches, activation, seed) -> dict:
    """One rank of :func:`run_ffn`: :func:`parlab.tensor_parallel.ffn_rank` with the log split in phases."""
    phases = _Phases()  # ffn_rank marks after making its groups, and after the forward pass
    result = ffn_rank(sizes, tensor, batch, micro_batches, activation, seed, marks=phases.mark)
    phases.mark()
    result["traffic"] = phases.result()
    return result


def run_ffn(sizes=None, tensor: int = 2, batch: int = 4, micro_batches: int = 2,
            activation: str = "relu", seed: int = 0, backend: str = "gloo") -> Comparison:
    """Figure 8-19's network on ``(len(sizes) - 1) x tensor`` ranks, next to the single-device one.

    ``info["placements"]`` lists each rank's GPU, stage and neurons.
    """
    sizes = tuple(FIGURE_8_19_SIZES if sizes is None else sizes)
    places = layout(sizes, tensor)  # raises before any rank starts if the split is impossible
    check_ffn_run(batch, micro_batches, activation)
    results = run(ffn_experiment_rank, len(places), sizes, tensor, batch, micro_batches,
                  activation, seed, backend=backend)
    last = [r for r in results if r["output"] is not None]
    firsts = [r for r in results if r["x.grad"] is not None]
    parallel = {"output": last[0]["output"], "x.grad": firsts[0]["x.grad"]}
    for stage in range(len(sizes) - 1):
        mine = [r for r in results if r["placement"].stage == stage]
        specs = [r["placement"].spec for r in mine]
        parallel[f"layer{stage + 1}.W.grad"] = merge([r["grad_W"] for r in mine], specs)
        parallel[f"layer{stage + 1}.b.grad"] = merge([r["grad_b"] for r in mine],
                                                     [s.bias() for s in specs])
    for group in (last, firsts):
        for r in group[1:]:
            key = "output" if group is last else "x.grad"
            if not torch.allclose(r[key], group[0][key], atol=1e-6):
                raise AssertionError(f"{key} differs between the ranks of one stage")
    reference = reference_ffn(sizes, batch, activation, seed)
    return Comparison("figure 8-19", parallel, reference, phase_split(results),
                      {"placements": places, "tensor": tensor, "micro_batches": micro_batches})

