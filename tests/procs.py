"""Process helpers for the launcher's no-leftover guarantee (imported by tests)."""
import os
import time


def wait_gone(pids, seconds=3.0):
    """Return the pids still alive after waiting up to ``seconds`` for them to vanish."""
    deadline = time.monotonic() + seconds
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        if alive:
            time.sleep(0.05)
    return alive


def _alive(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            state = next(line for line in f if line.startswith("State:"))
        return "Z" not in state.split()[1]
    except (FileNotFoundError, StopIteration, ProcessLookupError):
        return False


def read_pids(directory):
    """The pids that ranks wrote as pid.<rank> files into ``directory``."""
    return [int(open(os.path.join(directory, f)).read()) for f in os.listdir(directory)
            if f.startswith("pid.")]
