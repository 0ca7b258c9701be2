"""Split a tensor into the pieces that ranks own, and put the pieces back together.

Why this module exists: tensor parallelism is bookkeeping before it is communication. Which
rows of W_Q live on GPU A1? Which token ids does rank 2 own in a vocabulary-parallel
embedding? Which neurons of hidden layer 2 sit on B2 in Figure 8-19? Every parallel layer
of the chapter answers these questions through one function here, :func:`plan`, and its
answer is a list of :class:`ShardSpec` objects that a reader can print. The same specs cut
the tensors (:func:`split`), glue them back (:func:`merge`) and label the figures, so the
picture, the code and the test can never disagree about who owns what.

Kinds of split (``t`` has shape ``shape``; ``p`` ranks):

- ``"rows"`` / ``"columns"``: equal slices along dim 0 / the last dim; ``p`` must divide it.
- ``"neurons"``: rows of an ``nn.Linear`` weight (one row per output neuron), as in
  Figure 8-19; the error for ``p`` larger than the layer says "more ranks than neurons".
- ``"heads"``: whole attention heads per rank along ``dim`` (dim 0 of a W_Q/W_K/W_V weight,
  the last dim of Q, K, V activations); ``p`` must divide the number of heads.
- ``"vocab"``: rows of an embedding table (one row per token id). Vocabularies rarely
  divide evenly (GPT's 50257 is odd), so the ranges are balanced: the first ranks get one
  extra id.

A note on names. Megatron's ``ColumnParallelLinear`` splits the *columns* of A in
Y = X A. PyTorch stores ``nn.Linear.weight`` as W = A^T, shape (out, in), so those columns
are the *rows* of ``weight`` (the output neurons). The specs say which one they mean.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, replace
from typing import Sequence

import torch

from parlab.checks import check_count

__all__ = ["ShardSpec", "KINDS", "shard_spec", "split", "merge", "describe", "even_ranges",
           "balanced_ranges", "check_degree", "divisors", "merge_grads"]

#: The kinds of split :func:`plan` knows, with the unit each one counts.
KINDS = {"rows": "rows", "columns": "columns", "neurons": "neurons", "heads": "heads",
         "vocab": "token ids"}


@dataclass(frozen=True)
class ShardSpec:
    """Which slice of a tensor one rank owns.

    ``name`` of the full tensor, its full ``shape``; the slice ``start:stop`` along ``dim``;
    ``rank`` of ``parts``; ``kind`` of split; ``unit`` elements per counted unit (a head is
    ``d_head`` columns wide, everything else 1); ``owner`` a GPU name when one is known.
    """

    name: str
    kind: str
    shape: tuple
    dim: int
    rank: int
    parts: int
    start: int
    stop: int
    unit: int = 1
    owner: str = ""

    @property
    def local_shape(self) -> tuple:
        """Shape of this rank's piece."""
        shape = list(self.shape)
        shape[self.dim] = self.stop - self.start
        return tuple(shape)

    @property
    def units(self) -> tuple[int, int]:
        """First and one-past-last unit (head, neuron, token id ...) that this rank owns."""
        return self.start // self.unit, self.stop // self.unit

    @property
    def index(self) -> tuple:
        """An index that cuts this rank's piece out of the full tensor: ``t[spec.index]``."""
        return (slice(None),) * self.dim + (slice(self.start, self.stop),)

    def take(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's piece of the full tensor ``t`` (a contiguous copy)."""
        if tuple(t.shape) != tuple(self.shape):
            raise ValueError(f"{self.name}: spec is for shape {self.shape}, got {tuple(t.shape)}")
        return t[self.index].contiguous()

    def bias(self, name: str | None = None) -> "ShardSpec":
        """The spec of the bias that goes with a weight split along dim 0 (one entry per row).

        Rows, neurons and heads of an ``nn.Linear`` weight are its output features, and each
        has one bias entry, so the bias is cut at the same places.
        """
        if self.dim != 0:
            raise ValueError(f"{self.name} is split along dim {self.dim}: its bias is not split "
                             f"(it stays whole on every rank)")
        return replace(self, name=name or f"{self.name} bias", shape=(self.shape[0],))

    def __str__(self) -> str:
        who = f"rank {self.rank}" + (f" ({self.owner})" if self.owner else "")
        first, last = self.units
        what = KINDS[self.kind]
        owned = f"{what} {first}-{last - 1}" if last - first > 1 else f"{what[:-1]} {first}"
        return (f"{self.name} {who}: {owned} of {self.shape[self.dim] // self.unit} "
                f"[dim {self.dim}, {self.start}:{self.stop}] -> local {self.local_shape}")


def divisors(n: int) -> list[int]:
    """Every positive divisor of ``n``: the tensor-parallel degrees that split ``n`` evenly."""
    check_count("n", n)
    return [d for d in range(1, n + 1) if n % d == 0]


def check_degree(parts, n: int, what: str, name: str = "the number of ranks") -> None:
    """Raise ValueError unless ``parts`` ranks can split ``n`` ``what`` evenly.

    ``name`` is how the error calls ``parts`` (the caller's argument, e.g. "world_size").
    """
    check_count(name, parts)
    check_count(f"the number of {what}", n)
    if parts > n:
        raise ValueError(f"{parts} ranks for {n} {what}: more ranks than {what} leaves some "
                         f"ranks with nothing; use at most {n} rank{'s' if n > 1 else ''}")
    if n % parts:
        raise ValueError(f"tensor-parallel degree {parts} does not divide the {n} {what}; "
                         f"valid degrees: {divisors(n)}")


def even_ranges(n: int, parts: int, what: str = "rows") -> list[tuple[int, int]]:
    """``parts`` equal, contiguous ranges covering ``range(n)``; ValueError if impossible."""
    check_degree(parts, n, what)
    size = n // parts
    return [(r * size, (r + 1) * size) for r in range(parts)]


def balanced_ranges(n: int, parts: int, what: str = "token ids") -> list[tuple[int, int]]:
    """``parts`` contiguous ranges whose sizes differ by at most one (the first are longer)."""
    check_count("the number of ranks", parts)
    check_count(f"the number of {what}", n)
    if parts > n:
        raise ValueError(f"{parts} ranks for {n} {what}: more ranks than {what}; "
                         f"use at most {n} ranks")
    base, extra = divmod(n, parts)
    bounds = [0]
    for r in range(parts):
        bounds.append(bounds[-1] + base + (r < extra))
    return list(zip(bounds, bounds[1:]))


def shard_spec(name: str, shape: Sequence[int], kind: str, parts: int, *, dim: int | None = None,
         n_heads: int | None = None, owners: Sequence[str] | None = None) -> list[ShardSpec]:
    """The :class:`ShardSpec` of every rank for splitting a tensor of ``shape`` ``parts`` ways.

    ``dim`` overrides the default dimension (0, or the last one for ``"columns"``);
    ``n_heads`` is required for ``"heads"``; ``owners`` names the GPUs, one per rank.
    """
    shape = tuple(shape)
    if not shape or any(isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 1
                        for s in shape):
        raise ValueError(f"shape must be one or more positive integers, got {shape!r}")
    shape = tuple(int(s) for s in shape)
    if kind not in KINDS:
        raise ValueError(f"unknown kind of split {kind!r}; choose one of {list(KINDS)}")
    check_count("parts", parts)
    if dim is None:
        dim = len(shape) - 1 if kind == "columns" else 0
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"dim must be an integer, got {dim!r}")
    if not -len(shape) <= dim < len(shape):
        raise ValueError(f"dim {dim} is out of range for a tensor of shape {shape}")
    dim %= len(shape)
    n, unit = shape[dim], 1
    if kind == "heads":
        if n_heads is None:
            raise ValueError("a split by heads needs n_heads")
        check_count("n_heads", n_heads)
        if n % n_heads:
            raise ValueError(f"{n_heads} heads do not divide the {n} elements of dim {dim}")
        unit = n // n_heads
        ranges = [(a * unit, b * unit) for a, b in even_ranges(n_heads, parts, "heads")]
    elif kind == "vocab":
        ranges = balanced_ranges(n, parts)
    else:
        ranges = even_ranges(n, parts, KINDS[kind])
    if owners is not None and len(owners) != parts:
        raise ValueError(f"owners names {len(owners)} GPUs for {parts} ranks")
    return [ShardSpec(name, kind, shape, dim, r, parts, a, b, unit,
                      owners[r] if owners is not None else "")
            for r, (a, b) in enumerate(ranges)]


def split(t: torch.Tensor, specs: Sequence[ShardSpec]) -> list[torch.Tensor]:
    """Cut ``t`` into the pieces ``specs`` describe (one per rank, in rank order)."""
    return [spec.take(t) for spec in specs]


def merge(pieces: Sequence[torch.Tensor], specs: Sequence[ShardSpec]) -> torch.Tensor:
    """Glue the ranks' pieces back into the full tensor, checking each piece's shape first."""
    if len(pieces) != len(specs):
        raise ValueError(f"{len(pieces)} pieces for {len(specs)} specs")
    if not specs:
        raise ValueError("pieces and specs are empty: merge needs one piece and its ShardSpec "
                         "per rank")
    for piece, spec in zip(pieces, specs):
        if tuple(piece.shape) != spec.local_shape:
            raise ValueError(f"{spec.name} rank {spec.rank}: piece has shape "
                             f"{tuple(piece.shape)}, the spec says {spec.local_shape}")
    ordered = sorted(zip(specs, pieces), key=lambda sp: sp[0].start)
    covered = [(s.start, s.stop) for s, _ in ordered]
    if covered[0][0] != 0 or covered[-1][1] != specs[0].shape[specs[0].dim] or any(
            a[1] != b[0] for a, b in zip(covered, covered[1:])):
        raise ValueError(f"the pieces {covered} do not tile dim {specs[0].dim} of {specs[0].shape}")
    return torch.cat([p for _, p in ordered], dim=specs[0].dim)


def describe(specs: Sequence[ShardSpec]) -> str:
    """One line per rank, as printed in the notebook."""
    return "\n".join(str(s) for s in specs)


def merge_grads(per_rank: list[dict]) -> dict:
    """``{name: full gradient}`` from each rank's ``{name: (piece, ShardSpec or None)}``.

    A piece without a spec is a replicated gradient: every rank must hold the same one.
    """
    merged = {}
    for name, (first, spec) in per_rank[0].items():
        pieces = [grads[name][0] for grads in per_rank]
        if spec is None:
            for rank, piece in enumerate(pieces[1:], start=1):
                if not torch.allclose(piece, first, atol=1e-6):
                    raise AssertionError(f"{name}: the replicated gradient differs on rank {rank}")
            merged[name] = first
        else:
            merged[name] = merge(pieces, [grads[name][1] for grads in per_rank])
    return merged
