"""What one process of the toy backend remembers: its traffic log, algorithm choices, live groups.

One :data:`STATE` per process (each rank is a process), read by every toy group on every
call and changed by the switches in :mod:`parlab.comm.toy.backend`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from parlab.comm.cost import ALGORITHMS

__all__ = ["STATE", "ToyOptions", "valid"]


def valid(name: str) -> str:
    """``name`` if it is an algorithm, else a ValueError listing the valid ones."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {list(ALGORITHMS)}")
    return name


@dataclass
class _State:
    """This process's toy-backend state: its traffic log and the algorithm choices."""

    log: list = field(default_factory=list)
    default: str = "ring"  # set_algorithm(name)
    stack: list = field(default_factory=list)  # `with algorithm(name):` blocks
    groups: weakref.WeakSet = field(default_factory=weakref.WeakSet)  # live toy groups
    run_start: int = 0  # where the current launch begins in ``log``

    def algorithm_for(self, group) -> str:
        """The innermost ``with algorithm``, else the group's choice, else the process default."""
        if self.stack:
            return self.stack[-1]
        return getattr(group, "_algorithm", None) or self.default


STATE = _State()


@dataclass
class ToyOptions:
    """Per-group settings, passed as ``pg_options`` to ``new_group``/``init_process_group``."""

    algorithm: str | None = None  # None: follow the process default
    label: str | None = None      # the ``group`` field of this group's transfer records
    #: read by ``DeviceMesh`` when the options come through ``backend_override`` (None: the
    #: default timeout); not a field, so it is not part of the options' identity
    _timeout = None
