"""How far apart two runs' tensors are: the one comparison every strategy checks itself with.

A parallel run is right when its parameters or gradients equal a single process's; every
strategy (data parallel's state dicts, the pipeline's {layer: (dW, db)}, tensor parallel's
gradients by name) asks the same question of two dicts with the same keys.
"""

from __future__ import annotations

__all__ = ["max_difference"]


def max_difference(a: dict, b: dict) -> float:
    """Largest absolute difference between two dicts of tensors with the same keys.

    A value may also be a tuple (or list) of tensors, compared element by element, as the
    pipeline's {layer: (dW, db)} gradients are. A ValueError names the keys that differ.
    """
    if a.keys() != b.keys():
        raise ValueError(f"the dicts differ in keys: {sorted(a)} vs {sorted(b)}")

    def pairs(x, y):
        if isinstance(x, (tuple, list)):
            if not isinstance(y, (tuple, list)) or len(x) != len(y):
                raise ValueError(f"{len(x)} tensors vs {y!r}")
            return list(zip(x, y))
        return [(x, y)]

    return max(float((x - y).abs().max()) for k in a for x, y in pairs(a[k], b[k]))
