"""Which modules exist and which parlab modules a process has imported: what the forkserver
is asked to preload (:mod:`parlab.launch.server`)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys

__all__ = ["module_exists", "imported_parlab"]


def module_exists(name: str) -> bool:
    """Whether ``name`` can be imported, found without importing it or its parent packages
    (``importlib.util.find_spec("a.b.c")`` runs ``a.b``: for ``torch.distributed.tensor.parallel``
    that is ``torch.distributed.tensor``, 1 s in a kernel that may never use it)."""
    if name in sys.modules:
        return True
    parts, path = name.split("."), None
    for depth in range(len(parts)):
        full = ".".join(parts[:depth + 1])
        module = sys.modules.get(full)
        if module is not None:
            path = getattr(module, "__path__", None)
        else:
            spec = (importlib.util.find_spec(full) if depth == 0
                    else importlib.machinery.PathFinder.find_spec(full, path))
            if spec is None:
                return False
            path = spec.submodule_search_locations
        if path is None and depth < len(parts) - 1:  # a module, not a package: none below
            return False
    return True


def imported_parlab() -> list[str]:
    """The parlab modules this process has imported (the maintainers' tools aside).

    A rank runs functions of the caller's modules (a chapter's experiments, a strategy's
    layers); importing them in every rank of every launch costs seconds (the experiments
    alone 0.3 s, with torch's modules under them), so the server imports what the caller
    already uses, once.
    """
    return sorted(m for m in sys.modules
                  if m.startswith("parlab.") and not m.startswith("parlab.tools"))
