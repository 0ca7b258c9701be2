"""Under ``torchrun``: join the job it started instead of forking ranks, and gather the results.

torchrun sets ``RANK`` and ``WORLD_SIZE`` and rendezvous through ``env://``; ``run`` then
calls ``fn`` once in this process and all-gathers every rank's result, so the same notebook
code runs on many machines.
"""

from __future__ import annotations

import atexit
import os
import warnings
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["run_under_torchrun"]


def _destroy_group() -> None:
    if dist.is_initialized():
        try:
            dist.barrier()  # nobody leaves while a peer still talks to it
        finally:
            dist.destroy_process_group()


def run_under_torchrun(fn, world_size, backend, args, kwargs):
    """torchrun started the processes: join its job, run fn here, gather every rank's result."""
    env_world = int(os.environ["WORLD_SIZE"])
    if not dist.is_initialized():
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend)  # env:// rendezvous that torchrun prepared
        # we made the group, so we tear it down: gloo's threads still running at exit
        # can abort the interpreter ("terminate called without an active exception")
        atexit.register(_destroy_group)
    if env_world != world_size and dist.get_rank() == 0:
        warnings.warn(f"run(..., world_size={world_size}) under torchrun: using torchrun's "
                      f"WORLD_SIZE={env_world}", stacklevel=3)
    result = fn(*args, **kwargs)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, result)
    return gathered
