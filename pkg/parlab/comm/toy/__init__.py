"""The "toy" torch.distributed backend: every collective built from logged point-to-point messages.

``dist.all_reduce`` on a toy group runs a textbook algorithm (ring, naive or tree) that a
reader can follow, and writes every message it sends into this process's traffic log. Modules,
bottom up: ``work`` (torch's work objects, CUDA staging, tensor helpers), ``shm_wire`` and
``shm`` (the road between ranks on one machine: shared memory; elsewhere gloo's
point-to-point calls), ``wire`` (logged sends and receives), ``algorithms`` (the collectives
as transfers), ``checks`` (what every rank must agree on before a call), ``state`` (the
per-process log and choices), ``group`` (the ProcessGroup torch calls), ``backend`` (the
switches a reader uses, and ``run_with_traffic``).
"""

from parlab.comm.toy.backend import (
    algorithm, clear_transfers, get_algorithm, register, run_with_traffic, set_algorithm,
    sent_log, set_label, transfers
)
from parlab.comm.toy.state import ToyOptions
from parlab.comm.toy.group import ToyProcessGroup
from parlab.comm.toy.checks import REDUCE_OPS, SUPPORTED_DTYPES, ToyMismatchError

__all__ = ["set_algorithm", "get_algorithm", "algorithm", "set_label", "transfers",
           "clear_transfers", "sent_log", "register", "run_with_traffic", "ToyOptions", "ToyProcessGroup",
           "SUPPORTED_DTYPES", "REDUCE_OPS", "ToyMismatchError"]
