"""Which backend and device a launch uses, and the checks that turn bad arguments into clear errors.

``default_backend`` picks NCCL only when every rank can have a GPU of its own (NCCL refuses
two ranks on one GPU), else gloo on the CPU. ``check_arguments`` runs before any process
starts, so a typo costs a ValueError that names the bad value, never a hang.
"""

from __future__ import annotations

import math
import numbers
import os
import sys

import torch
import torch.distributed as dist

from parlab.launch.torchrun import under_torchrun

__all__ = ["MAX_WORLD_SIZE", "DEFAULT_TIMEOUT", "MAX_TIMEOUT", "MAX_THREADS", "default_backend",
           "rank_device", "environment", "check_arguments", "backend_usable", "uses_nccl"]

#: More local ranks than this is not a lesson any more but a stress test of the machine.
MAX_WORLD_SIZE = 64
#: Seconds a launch may take, and the process-group timeout of every collective in it.
DEFAULT_TIMEOUT = 60.0
#: The longest timeout (one week): more is surely a typo, and overflows the waits below.
MAX_TIMEOUT = 7 * 24 * 3600.0
#: The most torch threads a rank may ask for.
MAX_THREADS = 1024


def default_backend(world_size: int) -> str:
    """``"nccl"`` when CUDA shows at least ``world_size`` GPUs (one per rank), else ``"gloo"``."""
    if torch.cuda.is_available() and dist.is_nccl_available():
        if torch.cuda.device_count() >= world_size:
            return "nccl"
    return "gloo"


def uses_nccl(group=None) -> bool:
    """Whether ``group`` (default: the world) carries CUDA tensors over NCCL."""
    return "nccl" in str(dist.get_backend(group)).lower()


def rank_device() -> torch.device:
    """The device this rank should put its tensors on: its own GPU under NCCL, else the CPU."""
    if dist.is_initialized() and uses_nccl():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def environment() -> dict:
    """What this machine offers a reader: torch version, GPUs, and the usable backends."""
    backends = [b for b in ("gloo", "nccl", "mpi", "toy") if backend_usable(b)]
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "gpus": gpus,
        "gpu_names": [torch.cuda.get_device_name(i) for i in range(gpus)],
        "backends": backends,
        "default_backend_4_ranks": default_backend(4),
        "under_torchrun": under_torchrun(),
    }


def backend_usable(name: str) -> bool:
    if name == "gloo":
        return dist.is_gloo_available()
    if name == "nccl":
        return dist.is_nccl_available() and torch.cuda.is_available()
    if name == "mpi":
        return dist.is_mpi_available()
    return name.upper() in dist.Backend.backend_list or name in dist.Backend.backend_list


def check_arguments(fn, world_size, backend, timeout, threads=None, check_local_gpus=True) -> str:
    """Raise ValueError, naming the argument and what is valid, for anything that cannot work.

    Returns the backend to use (lower case; the default one when ``backend`` is None).
    """
    if not callable(fn):
        raise ValueError(f"fn must be a callable (a function run on every rank), got {fn!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise ValueError(f"world_size must be an int from 1 to {MAX_WORLD_SIZE}, got {world_size!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1 (one process per rank), got {world_size}")
    if world_size > MAX_WORLD_SIZE:
        raise ValueError(
            f"world_size={world_size} is more local processes than this companion runs on one "
            f"machine (1 to {MAX_WORLD_SIZE}); for more ranks start the script with torchrun "
            f"across machines (see README)"
        )
    if (isinstance(timeout, bool) or not isinstance(timeout, numbers.Real)
            or not math.isfinite(timeout) or not 0 < timeout <= MAX_TIMEOUT):
        raise ValueError(f"timeout must be a positive number of seconds, more than 0 and at most "
                         f"{MAX_TIMEOUT:.0f} (one week), got {timeout!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or not 1 <= threads <= MAX_THREADS):
        raise ValueError(f"threads must be None (share the CPU cores among the ranks) or an int "
                         f"from 1 to {MAX_THREADS} (torch threads per rank), got {threads!r}")
    backend = backend or default_backend(world_size)
    if not isinstance(backend, str):
        raise ValueError(f"backend must be a name such as 'gloo', 'nccl' or 'toy', got {backend!r}")
    backend = backend.lower()
    if not backend_usable(backend):
        usable = [b for b in ("gloo", "nccl", "mpi", "toy") if backend_usable(b)]
        raise ValueError(f"backend {backend!r} is not usable here; usable backends: {usable}")
    if backend == "nccl" and check_local_gpus:
        gpus = torch.cuda.device_count()
        if gpus < world_size:
            raise ValueError(
                f"backend 'nccl' needs one GPU per rank: world_size={world_size} but this machine "
                f"has {gpus} GPU(s); use world_size <= {gpus}, or backend='gloo'"
            )
    return backend

