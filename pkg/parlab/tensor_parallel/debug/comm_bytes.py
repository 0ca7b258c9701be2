"""CommBytes: PyTorch's ``CommDebugMode``, which also keeps each collective's payload bytes.

Its own face (:mod:`parlab.tensor_parallel.debug`) says why it is not in
:mod:`parlab.tensor_parallel`'s.
"""

from __future__ import annotations

import re

import torch
from torch.distributed.tensor.debug import CommDebugMode
from torch.utils._pytree import tree_leaves

from parlab.checks import check_choice

__all__ = ["CommBytes"]

_ANSI = re.compile(r"\x1B\[[0-?]*[ -/]*[@-~]")  # the colour codes in CommDebugMode's table
_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
        "gather", "scatter")  # "allreduce" before "reduce": the first name a call contains wins


class CommBytes(CommDebugMode):
    """PyTorch's ``CommDebugMode``, which also keeps each collective's payload bytes.

    ``with CommBytes() as comm: ...`` counts the collectives run inside it exactly as
    ``torch.distributed.tensor.debug.CommDebugMode`` does (``get_comm_counts()``, per module
    and pass in ``comm_module_counts``, :meth:`table`), and also keeps ``records``:
    ``(op, payload bytes)`` per collective in call order, ``op`` named as
    :func:`parlab.comm.ring_wire_bytes` names it and the payload being the whole tensor (what
    an all-reduce sums, what an all-gather assembles, what a reduce-scatter is handed).
    ``phases[i]`` says whether ``records[i]`` ran in the forward or the backward pass, as
    CommDebugMode's module tracker saw it. DTensor issues its collectives through the
    dispatcher (``_c10d_functional``), where this mode reads them, on any backend.
    """

    #: The keys of :meth:`report`, what a run hands back from the ranks.
    REPORT = ("collectives", "comm_counts", "comm_table")

    def __init__(self):
        super().__init__()
        self.records: list[tuple[str, int]] = []
        self.phases: list[str] = []

    def __enter__(self):
        self.records.clear()  # CommDebugMode clears its counts on entering
        self.phases.clear()
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        counted = self.get_total_counts()
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if self.get_total_counts() > counted:  # CommDebugMode counted it: a collective
            squashed = func._overloadpacket.__name__.replace("_", "")
            op = next((o for o in _OPS if o.replace("_", "") in squashed), squashed)
            sizes = [sum(t.nbytes for t in tree_leaves(x) if isinstance(t, torch.Tensor))
                     for x in (args[0], out)]
            self.records.append((op, max(sizes)))
            self.phases.append("backward" if self.advanced_module_tracker.is_bw else "forward")
        return out

    def by_phase(self) -> dict:
        """``{"forward": [(op, bytes)], "backward": [...]}``, each in call order."""
        return {phase: [r for r, p in zip(self.records, self.phases) if p == phase]
                for phase in ("forward", "backward")}

    def phase_counts(self) -> dict:
        """CommDebugMode's own counts per pass: ``{phase: {op name: count}}`` (all modules)."""
        every = self.comm_module_counts["Global"]
        return {phase: {str(op): n for op, n in every[phase].items()}
                for phase in ("forward", "backward")}

    def report(self) -> dict:
        """Plain data for a run's ``info``: :meth:`by_phase`, :meth:`phase_counts`, :meth:`table`."""
        return dict(zip(self.REPORT, (self.by_phase(), self.phase_counts(), self.table(0))))

    def table(self, noise_level: int = 0) -> str:
        """CommDebugMode's tracing table, module by module, as plain text (no colour codes).

        ``noise_level`` 0 lists the collectives each module ran forward and backward;
        1 adds every DTensor operation with its shapes and placements, 2 and 3 more.
        """
        check_choice("noise_level", noise_level, (0, 1, 2, 3))
        return _ANSI.sub("", self.generate_comm_debug_tracing_table(noise_level)).rstrip()
