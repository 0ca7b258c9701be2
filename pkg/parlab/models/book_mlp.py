"""The MLP that keeps the book's names: every tensor Figure 8-1 lists, as a real tensor.

:class:`BookMLP` is a small fully connected network whose training step is written
out by hand, so that everything Figure 8-1 says a GPU holds is a real tensor you can look at:
weight matrices W and biases b, weighted sums z, activations y, errors E (dLoss/dz), local
gradients, gradients received from peer GPUs, the learning rate, and the weight adjustments
Δw. Autograd would compute the same gradients (the tests check that), but it hides them; here
each one is kept in a :class:`LayerRecord`, which is what makes the memory table of chapter 01
possible.

The step is split where data parallelism needs a seam: ``forward`` -> ``backward`` (local
gradients) -> *exchange with peers* -> ``apply`` (update). On one rank nothing is exchanged and
the "remote gradients" are absent; chapter 02 passes the gradients its peers sent.

The tensor-parallel layers (column- and row-parallel linear, parallel embeddings) are in
:mod:`parlab.tensor_parallel.layers`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable, Sequence

import torch
from torch import nn

__all__ = ["BookMLP", "LayerRecord", "MemoryRow", "ACTIVATIONS", "BOOK_NAMES", "SCALES_WITH",
           "book_table", "bytes_by_scaling", "held_bytes", "tensor_bytes"]

#: Activation functions f and their derivative written with z and y = f(z).
ACTIVATIONS: dict[str, tuple[Callable, Callable]] = {
    "relu": (torch.relu, lambda z, y: (z > 0).to(z.dtype)),
    "sigmoid": (torch.sigmoid, lambda z, y: y * (1 - y)),
    "tanh": (torch.tanh, lambda z, y: 1 - y * y),
    "identity": (lambda z: z, lambda z, y: torch.ones_like(z)),
}
_MODULES = {"relu": nn.ReLU, "sigmoid": nn.Sigmoid, "tanh": nn.Tanh, "identity": nn.Identity}

#: Figure 8-1's list, item by item: the letter the book gives it and a short name.
BOOK_NAMES = {
    "W": "a) weights W", "b": "a) biases b", "z": "b) weighted sums z", "y": "c) activations y",
    "E": "d) errors E", "local_grad_W": "e) local gradient dW", "local_grad_b": "e) local gradient db",
    "remote_grad_W": "f) remote gradient dW", "remote_grad_b": "f) remote gradient db",
    "lr": "g) learning rate", "delta_W": "h) weight adjustment ΔW", "delta_b": "h) bias adjustment Δb",
}

#: What each item's size grows with: the samples of the batch (the data, and z, y, E, one row
#: per sample), the parameters (W, b and every gradient or adjustment of them: one number per
#: weight), or nothing (the learning rate, one number per layer). Only W and b are the
#: model's *parameters*; the book's list calls all of them that.
SCALES_WITH = {"x": "batch", "target": "batch", "z": "batch", "y": "batch", "E": "batch",
               "W": "parameters", "b": "parameters", "local_grad_W": "parameters",
               "local_grad_b": "parameters", "remote_grad_W": "parameters",
               "remote_grad_b": "parameters", "delta_W": "parameters",
               "delta_b": "parameters", "lr": "constant"}


@dataclass(frozen=True)
class MemoryRow:
    """One line of the Figure 8-1 table. ``nbytes`` is 0 when ``note`` says the memory is shared."""

    layer: str
    item: str
    shape: tuple | None
    dtype: str
    nbytes: int
    note: str = ""
    key: str = ""    # the field it comes from: "x", "target", or a LayerRecord field ("W", ...)


@dataclass
class LayerRecord:
    """What one layer keeps during a training step, named as in Figure 8-1.

    Shapes for a layer with ``n_in`` inputs, ``n_out`` neurons and a batch of ``B`` samples:
    ``W`` (n_out, n_in), ``b`` (n_out,), ``z``/``y``/``E`` (B, n_out), gradients and Δ like
    ``W`` and ``b``; ``lr`` is a 0-dim tensor. Items not computed yet are ``None``.
    """

    W: torch.Tensor
    b: torch.Tensor
    lr: torch.Tensor
    z: torch.Tensor | None = None
    y: torch.Tensor | None = None
    E: torch.Tensor | None = None
    local_grad_W: torch.Tensor | None = None
    local_grad_b: torch.Tensor | None = None
    remote_grad_W: torch.Tensor | None = None
    remote_grad_b: torch.Tensor | None = None
    delta_W: torch.Tensor | None = None
    delta_b: torch.Tensor | None = None

    def items(self):
        """(field name, tensor or None) pairs, in the order of the book's list."""
        order = ("W", "b", "z", "y", "E", "local_grad_W", "local_grad_b", "remote_grad_W",
                 "remote_grad_b", "lr", "delta_W", "delta_b")
        return [(name, getattr(self, name)) for name in order]


class BookMLP:
    """A fully connected network trained by a hand-written step that keeps every tensor.

    ``sizes`` are the widths of the layers, input first: ``(4, 6, 6, 2)`` is 4 inputs, two
    hidden layers of 6 neurons and 2 outputs. Hidden layers use ``activation``; the output
    layer is linear and the loss is the mean squared error over batch and outputs.
    """

    def __init__(self, sizes: Sequence[int], activation: str = "relu", lr: float = 0.1,
                 seed: int = 0, dtype: torch.dtype = torch.float32):
        sizes = tuple(sizes)
        if len(sizes) < 2:
            raise ValueError(f"sizes needs an input and at least one layer, got {sizes}")
        for n in sizes:
            if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
                raise ValueError(f"layer sizes must be positive integers, got {sizes}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose one of {list(ACTIVATIONS)}")
        self.sizes, self.activation, self.dtype = sizes, activation, dtype
        generator = torch.Generator().manual_seed(seed)
        self.layers: list[LayerRecord] = []
        for n_in, n_out in zip(sizes, sizes[1:]):
            bound = n_in ** -0.5  # the same uniform range nn.Linear uses
            W = (torch.rand(n_out, n_in, generator=generator, dtype=dtype) * 2 - 1) * bound
            b = (torch.rand(n_out, generator=generator, dtype=dtype) * 2 - 1) * bound
            self.layers.append(LayerRecord(W=W, b=b, lr=torch.tensor(lr, dtype=dtype)))
        self.x: torch.Tensor | None = None
        self.target: torch.Tensor | None = None
        self.loss: float | None = None

    def _activation(self, index: int) -> str:
        return "identity" if index == len(self.layers) - 1 else self.activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """z = y_prev W^T + b and y = f(z), layer by layer; keeps x, z and y."""
        if x.ndim != 2 or x.shape[1] != self.sizes[0]:
            raise ValueError(f"input must have shape (batch, {self.sizes[0]}), got {tuple(x.shape)}")
        self.x = x
        y = x
        for i, layer in enumerate(self.layers):
            layer.z = y @ layer.W.T + layer.b
            layer.y = ACTIVATIONS[self._activation(i)][0](layer.z)
            y = layer.y
        return y

    def backward(self, target: torch.Tensor) -> float:
        """Errors E = dLoss/dz from the output back, and each layer's local gradients."""
        out = self.layers[-1]
        if out.y is None:
            raise RuntimeError("call forward(x) before backward(target)")
        if target.shape != out.y.shape:
            raise ValueError(f"target shape {tuple(target.shape)} != output {tuple(out.y.shape)}")
        self.target = target
        self.loss = float(((out.y - target) ** 2).mean())
        E = 2 * (out.y - target) / target.numel()  # dLoss/dy of the output; f is linear there
        for i in range(len(self.layers) - 1, -1, -1):
            layer = self.layers[i]
            layer.E = E
            y_prev = self.x if i == 0 else self.layers[i - 1].y
            layer.local_grad_W = E.T @ y_prev
            layer.local_grad_b = E.sum(0)
            if i > 0:
                prev = self.layers[i - 1]
                E = (E @ layer.W) * ACTIVATIONS[self._activation(i - 1)][1](prev.z, prev.y)
        return self.loss

    def local_grads(self) -> list[torch.Tensor]:
        """[∇W1, ∇b1, ∇W2, ...]: what this rank would send to its peers."""
        return [g for layer in self.layers for g in (layer.local_grad_W, layer.local_grad_b)]

    def apply(self, remote: Sequence[torch.Tensor] | None = None, world_size: int = 1) -> None:
        """Update the weights: Δw = -lr · G, with G = (local + remote) / world_size.

        ``remote`` is the sum of the gradients received from the peers, in the order of
        :meth:`local_grads`; leave it out on a single rank.
        """
        if any(layer.local_grad_W is None for layer in self.layers):
            raise RuntimeError("call backward(target) before apply()")
        if remote is not None and len(remote) != 2 * len(self.layers):
            raise ValueError(f"remote needs {2 * len(self.layers)} tensors (∇W, ∇b per layer), "
                             f"got {len(remote)}")
        if world_size < 1 or (remote is None and world_size != 1):
            raise ValueError(f"world_size={world_size} needs remote gradients from "
                             f"{world_size - 1} peer(s)")
        for i, layer in enumerate(self.layers):
            grad_W, grad_b = layer.local_grad_W, layer.local_grad_b
            if remote is not None:
                layer.remote_grad_W, layer.remote_grad_b = remote[2 * i], remote[2 * i + 1]
                grad_W = (grad_W + layer.remote_grad_W) / world_size
                grad_b = (grad_b + layer.remote_grad_b) / world_size
            layer.delta_W = -layer.lr * grad_W
            layer.delta_b = -layer.lr * grad_b
            layer.W += layer.delta_W
            layer.b += layer.delta_b

    def step(self, x: torch.Tensor, target: torch.Tensor,
             exchange: Callable[[list[torch.Tensor]], list[torch.Tensor]] | None = None,
             world_size: int = 1) -> float:
        """One training step; ``exchange(local_grads) -> remote_grads`` plugs in a peer sync.

        Returns the loss before the update.
        """
        self.forward(x)
        loss = self.backward(target)
        self.apply(exchange(self.local_grads()) if exchange else None, world_size)
        return loss

    def memory_rows(self) -> list[MemoryRow]:
        """Every tensor the step keeps, as Figure 8-1 names it, with its shape, dtype and bytes.

        Each row counts the tensor's own elements (:func:`tensor_bytes`), so a view such as
        ``x[:4]`` costs what its 4 rows cost, not its whole storage. A tensor that two items
        share (the linear output layer's y *is* its z) is counted on its first row only.
        """
        entries = [("input", "training data x", "x", self.x),
                   ("input", "targets", "target", self.target)]
        for i, layer in enumerate(self.layers, start=1):
            entries += [(f"layer {i}", BOOK_NAMES[name], name, t) for name, t in layer.items()]
        rows, owner = [], {}
        for where, item, key, t in entries:
            if t is None:
                note = "absent (no peers)" if item.startswith("f)") else "not computed yet"
                rows.append(MemoryRow(where, item, None, "-", 0, note, key))
                continue
            same = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
                    t.stride())
            first = owner.setdefault(same, f"{where} {item}")
            shared = first != f"{where} {item}"
            rows.append(MemoryRow(where, item, tuple(t.shape), str(t.dtype).replace("torch.", ""),
                                  0 if shared else tensor_bytes(t),
                                  f"same memory as {first}" if shared else "", key))
        return rows

    def to_torch(self, dtype: torch.dtype | None = None) -> nn.Sequential:
        """The same network as ``nn.Linear`` + activation modules, with copies of W and b."""
        dtype = dtype or self.dtype
        modules: list[nn.Module] = []
        for i, layer in enumerate(self.layers):
            linear = nn.Linear(layer.W.shape[1], layer.W.shape[0], dtype=dtype)
            with torch.no_grad():
                linear.weight.copy_(layer.W)
                linear.bias.copy_(layer.b)
            modules += [linear, _MODULES[self._activation(i)]()]
        return nn.Sequential(*modules[:-1])  # the output layer is linear

    def __repr__(self) -> str:
        return f"BookMLP(sizes={self.sizes}, activation={self.activation!r})"


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of ``t``'s own elements: numel x element size.

    A view counts only what it shows: ``x[:4]`` of an (8, 4) float32 ``x`` is 64 bytes, not the
    128 of the storage it shares with ``x`` (:func:`held_bytes` counts storages).
    """
    return t.numel() * t.element_size()


def held_bytes(obj) -> int:
    """Bytes of every distinct tensor storage reachable from ``obj`` (attributes, lists, dicts).

    This walks the object, not a table about it, so it is an independent count of what the
    code actually keeps in memory; storages shared by several tensors count once, and a view
    keeps its whole storage alive, so it counts the whole storage.
    """
    storages: dict[int, int] = {}
    seen: set[int] = set()

    def walk(o):
        if id(o) in seen:
            return
        seen.add(id(o))
        if isinstance(o, torch.Tensor):
            storages[o.untyped_storage().data_ptr()] = o.untyped_storage().nbytes()
        elif isinstance(o, dict):
            for v in o.values():
                walk(v)
        elif isinstance(o, (list, tuple, set)):
            for v in o:
                walk(v)
        elif hasattr(o, "__dataclass_fields__"):
            for f in fields(o):
                walk(getattr(o, f.name))
        elif hasattr(o, "__dict__"):
            for v in vars(o).values():
                walk(v)

    walk(obj)
    return sum(storages.values())


def book_table(mlp: BookMLP) -> str:
    """Figure 8-1 as a table: every tensor a :class:`BookMLP` step keeps, and the total."""
    rows = mlp.memory_rows()
    cells = [(r.layer, r.item, "-" if r.shape is None else str(tuple(r.shape)), r.dtype,
              str(r.nbytes), r.note) for r in rows]
    head = ("where", "item (Figure 8-1)", "shape", "dtype", "bytes", "")
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    line = lambda c: "  ".join(x.rjust(w) if i == 4 else x.ljust(w)
                               for i, (x, w) in enumerate(zip(c, widths))).rstrip()
    total = sum(r.nbytes for r in rows)
    return "\n".join([line(head)] + [line(c) for c in cells]
                     + [line(("total", "", "", "", str(total), ""))])


def bytes_by_scaling(mlp: BookMLP) -> dict[str, int]:
    """The table's bytes grouped by what they grow with (:data:`SCALES_WITH`): ``{"batch": ...,
    "parameters": ..., "constant": ...}``. Halving the batch halves the first; a peer's remote
    gradients add to the second."""
    out = dict.fromkeys(("batch", "parameters", "constant"), 0)
    for row in mlp.memory_rows():
        out[SCALES_WITH[row.key]] += row.nbytes
    return out
