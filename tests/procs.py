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
    """The pids that ranks wrote as pid.<rank> files into ``directory`` (a file made but not
    yet written is left out)."""
    pids = []
    for name in os.listdir(directory):
        if name.startswith("pid."):
            with open(os.path.join(directory, name)) as f:
                text = f.read()
            if text:
                pids.append(int(text))
    return pids


def wait_for_pids(directory, count, seconds, proc=None):
    """The pids in ``directory``'s pid.<rank> files once ``count`` ranks have written theirs,
    or whatever is there when ``seconds`` have passed or ``proc`` (the launching script) has
    exited."""
    deadline = time.monotonic() + seconds
    while True:
        pids = read_pids(directory)
        if (len(pids) >= count or time.monotonic() > deadline
                or (proc is not None and proc.poll() is not None)):
            return pids
        time.sleep(0.05)


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on (at the time of the call)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: The variables of a launcher (torchrun) that a test must control itself.
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                      "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                      "PARLAB_RANK")


def clean_env(**extra):
    """This process's environment without any launcher variable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCHER_VARIABLES and not k.startswith("TORCHELASTIC_")}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def env_with_parlab():
    """This process's environment for a child Python: the tests' parlab first on PYTHONPATH,
    then what PYTHONPATH already held (a machine may keep packages there, e.g. Jupyter's)."""
    import parlab
    from pathlib import Path
    pkg = str(Path(parlab.__file__).resolve().parents[1])
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([pkg] + kept)}
