"""When ranks may be forked from the caller itself rather than from the rank server.

A child forked from a process inherits its state, and three kinds of state make such a child
fail where a rank forked from the server (a fresh process that never computed) would not:

- CUDA initialised in the caller: a forked child cannot use it;
- OpenMP-parallel kernels run in the caller: a child forked after them hangs in its own first
  parallel region (GNU OpenMP is not fork-safe), while a one-thread rank never enters one;
- autograd's device threads started in the caller: PyTorch then marks every forked child, and
  the child's first ``backward()`` raises "Unable to handle autograd's threading in
  combination with fork-based multiprocessing". The engine starts those threads at the
  process's first backward pass when it counts a device besides the CPU: on a GPU machine
  always, and (seen with torch 2.11's CUDA build on a machine without a GPU) when that first
  backward ran under ``FakeTensorMode``, as ``parlab.memory.estimate`` does.

:func:`direct_fork_safe` rules the first two out from the arguments and ``torch.cuda``; for
the third it settles the engine once per process (a one-element CPU backward pass, which
starts no device thread where no GPU is present, so no later backward will) and then asks a
forked child to run a backward pass: one probe, whose answer stays true for the process.
"""

from __future__ import annotations

import os
import sys
import time
import warnings

__all__ = ["direct_fork_safe"]

#: The probe's answer in this process (None: not asked yet).
_autograd_forks: bool | None = None


def direct_fork_safe(backend: str, threads: int) -> bool:
    """Whether ranks may be forked from the caller itself instead of from the server.

    Only on Linux (macOS forbids fork after some system libraries ran); only when the backend
    is not NCCL and the machine shows no GPU (a forked child cannot use CUDA, and on a GPU
    machine autograd's device threads forbid forked children a backward pass); only with one
    thread per rank; and only once a forked child was seen to run a backward pass.
    """
    import torch

    if not (sys.platform.startswith("linux") and backend != "nccl" and threads == 1):
        return False
    if torch.cuda.is_initialized() or torch.cuda.is_available():
        return False
    return _autograd_survives_fork()


def _autograd_survives_fork(wait_s: float = 5.0) -> bool:
    """Settle autograd's engine in this process, then fork a child that runs a backward pass."""
    global _autograd_forks
    if _autograd_forks is None:
        _backward()
        with warnings.catch_warnings():  # Python 3.12+ warns on fork in a threaded process
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: report by exit code, run nothing of the caller's
            code = 1
            try:
                _backward()
                code = 0
            finally:
                os._exit(code)
        deadline = time.monotonic() + wait_s
        done, status = os.waitpid(pid, os.WNOHANG)
        while not done and time.monotonic() < deadline:
            time.sleep(0.002)
            done, status = os.waitpid(pid, os.WNOHANG)
        if not done:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        _autograd_forks = bool(done) and os.waitstatus_to_exitcode(status) == 0
    return _autograd_forks


def _backward() -> None:
    """A one-element backward pass on the CPU, whatever grad mode the caller is in."""
    import torch

    with torch.inference_mode(False), torch.enable_grad():
        x = torch.zeros((), dtype=torch.float32, device="cpu", requires_grad=True)
        (x * 2).backward()
