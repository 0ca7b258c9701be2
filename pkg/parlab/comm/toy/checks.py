"""The toy backend's guard rails: what it supports, and a cross-rank check before every collective.

Why a check at all: when ranks disagree about a collective (one passes 7 elements, another
8; one calls all_reduce, another broadcast) a real backend usually hangs until its timeout
or fails with a message about sockets. Before moving any data, the toy backend gathers a
small header from every rank (a control message, never counted as traffic) and every rank
applies the same rules to the same table, so every rank raises the same readable error
and none is left waiting.
"""

from __future__ import annotations

import torch

from parlab.comm.cost import ALGORITHMS

__all__ = ["SUPPORTED_DTYPES", "REDUCE_OPS", "EFFECTIVE", "ToyMismatchError", "check_reduce_op",
           "Header", "dtype_code", "parse", "verdict"]

#: The element types the toy collectives accept: exactly those gloo's collectives accept.
SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
                    torch.uint8, torch.int32, torch.int64, torch.bool)
_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
#: Reduction operations, and the dtypes each one accepts.
REDUCE_OPS = {
    "SUM": SUPPORTED_DTYPES, "PRODUCT": SUPPORTED_DTYPES, "MIN": SUPPORTED_DTYPES,
    "MAX": SUPPORTED_DTYPES, "AVG": _FLOATS,
    "BAND": tuple(d for d in SUPPORTED_DTYPES if d not in _FLOATS),
    "BOR": tuple(d for d in SUPPORTED_DTYPES if d not in _FLOATS),
    "BXOR": tuple(d for d in SUPPORTED_DTYPES if d not in _FLOATS),
}
OPS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "reduce", "gather", "scatter",
       "all_to_all", "barrier")

#: What each algorithm name means for collectives that have no such variant.
EFFECTIVE = {
    "gather": {"ring": "naive"}, "scatter": {"ring": "naive"},
    "all_to_all": dict.fromkeys(ALGORITHMS, "pairwise"),
    "barrier": dict.fromkeys(ALGORITHMS, "dissemination"),
}

#: Every dtype torch knows, so a header can name any rank's dtype, supported or not.
_ALL_DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)
_NONE, _MIXED = -1, -2
_SINGLE = -1  # list_len of the one-tensor forms (all_gather_single, reduce_scatter_single)


class ToyMismatchError(RuntimeError):
    """Ranks called a collective with arguments that do not fit together."""


def _names(dtypes) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


def check_reduce_op(op_name: str, dtype: torch.dtype) -> None:
    """Raise ValueError naming what is supported when ``op_name`` cannot reduce ``dtype``."""
    if op_name not in REDUCE_OPS:
        raise ValueError(f"the toy backend does not support ReduceOp.{op_name}; supported: "
                         f"{', '.join(REDUCE_OPS)}")
    if dtype not in REDUCE_OPS[op_name]:
        raise ValueError(f"ReduceOp.{op_name} does not work on {_names([dtype])} tensors in the "
                         f"toy backend; it works on: {_names(REDUCE_OPS[op_name])}")


def dtype_code(tensors) -> int:
    """A number for the tensors' common dtype (negative: none passed, or mixed dtypes)."""
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        return _MIXED
    return _ALL_DTYPES.index(dtypes.pop()) if dtypes else _NONE


class Header:
    """What one rank says about its part of a collective, as a fixed-length list of ints.

    ``sizes``/``sizes2`` are per-peer element counts: the list entries of list-shaped
    arguments (all_gather outputs, reduce_scatter inputs, gather/scatter lists at the root)
    and, for all_to_all, what this rank sends to (``sizes``) and receives from (``sizes2``)
    each peer. ``single`` marks the one-tensor forms (``all_gather_into_tensor``, ...).
    """

    FIELDS = ("op", "algorithm", "dtype", "reduce_op", "root", "call", "numel_in", "numel_out",
              "list_len")

    def __init__(self, world: int, op: str, algorithm: str, dtype: int, reduce_op: str = "",
                 root: int = 0, call: int = 0, numel_in: int = 0, numel_out: int = 0,
                 sizes=(), sizes2=(), single: bool = False):
        self.values = [OPS.index(op), ALGORITHMS.index(algorithm), dtype,
                       list(REDUCE_OPS).index(reduce_op) if reduce_op in REDUCE_OPS else -1,
                       root, call, numel_in, numel_out, _SINGLE if single else len(sizes)]
        self.values += _pad(sizes, world) + _pad(sizes2, world)

    def tensor(self) -> torch.Tensor:
        return torch.tensor(self.values, dtype=torch.int64)


def _pad(values, world):
    values = [int(v) for v in values][:world]
    return values + [0] * (world - len(values))


def parse(table: list[list[int]], world: int) -> list[dict]:
    """The gathered headers (one list of ints per rank) as one dict per rank."""
    width = len(Header.FIELDS)
    return [dict(zip(Header.FIELDS, row)) | {"sizes": row[width:width + world],
                                             "sizes2": row[width + world:width + 2 * world]}
            for row in table]


def verdict(op: str, rows: list[dict], world: int) -> str | None:
    """The error every rank raises for these headers (from :func:`parse`), or None."""
    for field, what in (("op", "collective"), ("call", "call number")):
        values = [row[field] for row in rows]
        if len(set(values)) > 1:
            shown = [OPS[v] for v in values] if field == "op" else values
            return (f"{op}: the ranks are not in the same {what} (per rank: {shown}); every "
                    f"rank must make the same collective calls in the same order")
    problem = (_agree(op, rows, "algorithm", lambda v: ALGORITHMS[v])
               or _dtypes(op, rows)
               or _agree(op, rows, "reduce_op", lambda v: list(REDUCE_OPS)[v] if v >= 0 else "?")
               or _agree(op, rows, "root", str))
    return problem or _SHAPE_RULES.get(op, lambda op, rows, world: None)(op, rows, world)


def _agree(op, rows, field, show):
    values = [row[field] for row in rows]
    if len(set(values)) > 1:
        what = field.replace("_", " ")
        return f"{op}: ranks disagree on the {what}: " + _per_rank(map(show, values))
    return None


def _dtypes(op, rows):
    codes = [row["dtype"] for row in rows]
    for rank, code in enumerate(codes):
        if code == _MIXED:
            return f"{op}: rank {rank} passes tensors of different dtypes; use one dtype"
        if code >= 0 and _ALL_DTYPES[code] not in SUPPORTED_DTYPES:
            return (f"{op}: rank {rank} passes {_names([_ALL_DTYPES[code]])} tensors, which the "
                    f"toy backend does not support; supported: {_names(SUPPORTED_DTYPES)}")
    present = [code for code in codes if code != _NONE]
    if len(set(present)) > 1:
        return f"{op}: ranks pass different dtypes: " + _per_rank(
            _names([_ALL_DTYPES[c]]) if c != _NONE else "-" for c in codes)
    return None


def _per_rank(values) -> str:
    return ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))


def _same_numel(field, label):
    def rule(op, rows, world):
        values = [row[field] for row in rows]
        if len(set(values)) > 1:
            return (f"{op}: tensor sizes differ across ranks ({label} elements per rank: "
                    f"{_per_rank(values)}); every rank must pass the same number of elements")
        return None
    return rule


def _list_shape(op, rows, world, who, expected, label):
    """Rank ``who``'s list must have ``world`` entries of ``expected[p]`` elements."""
    row = rows[who]
    if row["list_len"] != world:
        return (f"{op}: rank {who} passes a list of {row['list_len']} tensors; it needs one "
                f"per rank ({world})")
    if row["sizes"] != expected:
        return (f"{op}: rank {who}'s list holds {row['sizes']} elements per entry, but the "
                f"ranks' {label} have {expected} elements")
    return None


def _all_gather(op, rows, world):
    if rows[0]["list_len"] == _SINGLE:
        return _single_ratio("numel_out", "numel_in", "output", "input")(op, rows, world)
    problem = _same_numel("numel_in", "input")(op, rows, world)
    inputs = [row["numel_in"] for row in rows]
    for rank in range(world):
        problem = problem or _list_shape(op, rows, world, rank, inputs, "inputs")
    return problem


def _single_ratio(field_big, field_small, big, small):
    """One-tensor forms: the ``big`` tensor holds ``world`` x the ``small`` one, on every rank."""
    def rule(op, rows, world):
        for rank, row in enumerate(rows):
            if row[field_big] != world * row[field_small]:
                return (f"{op}: rank {rank}'s {big} has {row[field_big]} elements but needs "
                        f"{world} x {row[field_small]} = {world * row[field_small]} "
                        f"({world} ranks x the {row[field_small]} of its {small})")
        return _same_numel(field_small, small)(op, rows, world)
    return rule


def _reduce_scatter(op, rows, world):
    if rows[0]["list_len"] == _SINGLE:
        return _single_ratio("numel_in", "numel_out", "input", "output")(op, rows, world)
    outputs = [row["numel_out"] for row in rows]
    for rank in range(world):
        problem = _list_shape(op, rows, world, rank, outputs, "outputs")
        if problem:
            return problem
    return None


def _rooted(field, label):
    def rule(op, rows, world):
        root = rows[0]["root"]
        return _list_shape(op, rows, world, root, [row[field] for row in rows], label)
    return rule


def _all_to_all(op, rows, world):
    for src, row in enumerate(rows):
        for field, what in (("sizes", "input"), ("sizes2", "output")):
            if min(row[field]) < 0:
                return (f"{op}: rank {src}'s {what} does not split evenly over {world} ranks; "
                        f"pass split sizes")
        for dst in range(world):
            sent, expected = row["sizes"][dst], rows[dst]["sizes2"][src]
            if sent != expected:
                return (f"{op}: rank {src} sends {sent} elements to rank {dst}, which expects "
                        f"{expected} from it")
    return None


_SHAPE_RULES = {
    "all_reduce": _same_numel("numel_in", "tensor"),
    "broadcast": _same_numel("numel_in", "tensor"),
    "reduce": _same_numel("numel_in", "tensor"),
    "all_gather": _all_gather,
    "reduce_scatter": _reduce_scatter,
    "gather": _rooted("numel_in", "inputs"),
    "scatter": _rooted("numel_out", "outputs"),
    "all_to_all": _all_to_all,
}
