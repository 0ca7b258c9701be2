"""The folder a local launch works in (the file store, each rank's output), and its cleanup.

Each launch makes ``<tmp>/parlab-XXXX`` and removes it when it ends. A caller killed in the
middle (SIGKILL, a kernel restart) cannot remove it, so the folder records who made it,
and the next launch on the machine removes every such folder whose maker is gone. Only
folders that are surely ours are touched: the ``parlab-`` name, a real directory (not a
link), owned by this user, with our owner file whose process no longer runs.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile

__all__ = ["make_workdir", "remove_workdir", "clean_stale_workdirs", "read_outputs", "OWNER_FILE"]

PREFIX = "parlab-"
#: Inside each work folder: "<pid> <process start time>" of the process that made it.
OWNER_FILE = "parlab-owner"


def make_workdir() -> str:
    clean_stale_workdirs()
    path = tempfile.mkdtemp(prefix=PREFIX)
    with open(os.path.join(path, OWNER_FILE), "w") as f:
        f.write(f"{os.getpid()} {_start_time(os.getpid())}")
    return path


def remove_workdir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def clean_stale_workdirs(root: str | None = None) -> list[str]:
    """Remove the work folders under ``root`` (the temp dir) whose maker is dead; return them."""
    root = root or tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(root) if n.startswith(PREFIX)]
    except OSError:
        return []
    removed = []
    for name in names:
        path = os.path.join(root, name)
        if _stale(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _stale(path: str) -> bool:
    try:
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            return False
        owner = os.path.join(path, OWNER_FILE)
        if os.lstat(owner).st_uid != os.getuid():
            return False
        with open(owner) as f:
            pid_text, _, started = f.read().strip().partition(" ")
        pid = int(pid_text)
    except (OSError, ValueError):
        return False  # not ours, or being made right now (no owner file yet)
    if pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # another user's process has that pid: it is alive, and not ours
    return started != "" and _start_time(pid) not in ("", started)  # the pid was reused


def _start_time(pid: int) -> str:
    """When process ``pid`` started (clock ticks since boot; Linux), or "" where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return ""


def read_outputs(workdir: str, world_size: int) -> list[str]:
    outputs = []
    for rank in range(world_size):
        try:
            with open(os.path.join(workdir, f"rank{rank}.out"), errors="replace") as f:
                outputs.append(f.read())
        except OSError:
            outputs.append("")
    return outputs
