"""Shared memory between the ranks of one machine: the road the toy's messages take there.

A toy group's CPU messages (its collectives' and a user's ``send``/``recv``) still go from one
process to another as bytes; only the road changes.
Gloo's point-to-point calls, driven from Python, cost a blocked thread and a wake-up per
message, and on a busy laptop each wake-up waits for a core (a round trip beside two busy
processes: 4 ms, where gloo's whole 1 MiB all-reduce takes 1 ms). :func:`connect` sets up a
file in shared memory that every rank of a group maps, and hands back the
:class:`~parlab.comm.toy.shm_wire.SharedMemoryWire` that moves messages through it.

Used when every rank of the group can open the file rank 0 made (one machine), on Linux
x86-64: its stores reach other cores in program order, which is what publishing a counter
after the bytes relies on (weaker memory models need fences Python cannot issue).
Elsewhere, or with ``PARLAB_TOY_SHM=0``, the toy backend keeps gloo's point-to-point calls.
"""

from __future__ import annotations

import mmap
import os
import platform
import sys
import tempfile

import torch
from torch._C._distributed_c10d import AllreduceOptions, BroadcastOptions, ReduceOp

from parlab.comm.toy.shm_wire import SharedMemoryWire, file_bytes

__all__ = ["connect", "ring_bytes", "ENABLED", "BUDGET_BYTES"]

#: off with PARLAB_TOY_SHM=0 (or by setting this before a group's first collective)
ENABLED = os.environ.get("PARLAB_TOY_SHM", "1") != "0"
#: shared memory per group, split among its n(n-1) rings (each a power of two, 4 KiB to 4 MiB)
BUDGET_BYTES = 8 << 20
_INFO = 1024    # the broadcast that tells every rank where the file is


def ring_bytes(size: int) -> int:
    """Each ring's bytes for a group of ``size`` ranks (0: too many ranks to share memory)."""
    share = BUDGET_BYTES // max(1, size * (size - 1))
    if share < 4096:
        return 0
    return min(4 << 20, 1 << (share.bit_length() - 1))


def connect(gloo, rank: int, size: int, timeout: float):
    """Every rank of the group calls this once, together (the toy group does when it is made):
    a :class:`SharedMemoryWire` when all of them can share memory, else ``gloo`` itself (the
    same ``send``/``recv``/``recv_anysource`` calls)."""
    ring = ring_bytes(size)
    usable = (ENABLED and size > 1 and ring and sys.platform == "linux"
              and platform.machine() in ("x86_64", "AMD64"))
    info = torch.zeros(_INFO, dtype=torch.uint8)
    path = None
    if rank == 0 and usable:
        path = _make_file(file_bytes(size, ring), size, info)
    opts = BroadcastOptions()
    opts.rootRank = 0
    gloo.broadcast([info], opts).wait()
    opened = _open(info, size) if usable else None
    pids = torch.zeros(size, dtype=torch.int64)
    pids[rank] = os.getpid() if opened else 0
    gloo.allreduce([pids], _options(ReduceOp.SUM)).wait()  # also: every rank has opened it
    if path:
        for name in [path] + _bells(path, size):
            os.unlink(name)
    if opened and all(pids.tolist()):
        return SharedMemoryWire(*opened, rank, size, ring, timeout, pids.tolist())
    if opened:
        opened[0].close()
        for fd in opened[1]:
            os.close(fd)
    return gloo


def _bells(path: str, size: int) -> list[str]:
    """The named pipes beside the file: a byte in rank r's wakes it from a blocking wait."""
    return [f"{path}.{r}" for r in range(size)]


def _options(op):
    opts = AllreduceOptions()
    opts.reduceOp = op
    return opts


def _make_file(nbytes: int, size: int, info: torch.Tensor):
    """Rank 0: a file in shared memory, its space reserved (a full /dev/shm fails here, not
    later as a SIGBUS), with a random token the others check, and every rank's doorbell;
    ``info`` = token + path."""
    folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    try:
        fd, path = tempfile.mkstemp(prefix="parlab-toy-", dir=folder)
    except OSError:
        return None
    try:
        os.posix_fallocate(fd, 0, nbytes)
        token = os.urandom(16)
        os.pwrite(fd, token, 0)
        for bell in _bells(path, size):
            os.mkfifo(bell, 0o600)
    except OSError:
        for name in [path] + _bells(path, size):
            if os.path.exists(name):
                os.unlink(name)
        return None
    finally:
        os.close(fd)
    encoded = token + path.encode()
    info[:len(encoded)] = torch.frombuffer(bytearray(encoded), dtype=torch.uint8)
    return path


def _open(info: torch.Tensor, size: int):
    """(the mapped file, every rank's doorbell) if the file exists here and carries rank 0's
    token (the same machine), else None."""
    raw = bytes(info.tolist())
    token, path = raw[:16], raw[16:].rstrip(b"\0").decode()
    if not path:
        return None
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        if os.pread(fd, 16, 0) != token:
            return None
        mm = mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    # read and write ends at once (Linux): opening never waits for the other side
    bells: list[int] = []
    try:
        for bell in _bells(path, size):
            bells.append(os.open(bell, os.O_RDWR | os.O_NONBLOCK))
    except OSError:  # then this rank cannot share memory: every rank takes gloo's road
        mm.close()
        for fd in bells:
            os.close(fd)
        return None
    return mm, bells
