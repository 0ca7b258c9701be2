"""How the rank server's process is started: in a session of its own, and ending at once.

:mod:`parlab.launch.server` decides when; this starts the process multiprocessing would
start, with two differences explained below.
"""

from __future__ import annotations

import os

__all__ = ["start_server_apart", "ending_at_once", "SERVER_COMMAND"]


def start_server_apart(no_main) -> None:
    """Start the forkserver, and multiprocessing's resource tracker that it needs, each in a
    session of its own instead of the caller's process group.

    Why: a Jupyter kernel asked to shut down or restart signals every process of its group
    (psutil's list, zombies included), SIGTERM first, sleeping 0.01, 0.03, 0.1, 0.3, 1, 3 s
    between tries until none is left. The tracker ignores SIGTERM (it must outlive a Ctrl-C)
    and the server, which dies, stays a zombie that no one reaps; so the kernel waited until
    its manager killed it, and every shutdown or restart of a kernel that had imported parlab
    took 2.6 s instead of 0.9 s. Apart, both still end as before: the server when its callers'
    "alive" pipe closes, the tracker when the last copy of its pipe does. Anything unexpected
    leaves multiprocessing's own start in place. ``no_main``: the server's thread-local flag
    that leaves the caller's main module out of what a child prepares (set as for a rank).
    """
    from multiprocessing import forkserver, util

    if os.name != "posix" or getattr(forkserver._forkserver, "_forkserver_pid", 0) is not None:
        return
    standard, spawned = util.spawnv_passfds, []

    def spawn_apart(path, args, passfds):
        import subprocess

        process = subprocess.Popen(ending_at_once(args), executable=path, pass_fds=passfds,
                                   start_new_session=True)
        spawned.append(process)
        return process.pid

    util.spawnv_passfds, no_main.active = spawn_apart, True  # as when a rank starts it
    try:
        forkserver.ensure_running()
    except Exception:  # noqa: BLE001 - multiprocessing starts them its own way at first use
        for process in spawned:
            process.kill()
    finally:
        util.spawnv_passfds, no_main.active = standard, False
        _apart.extend(spawned)  # kept: never collected (and warned about) while they run


_apart: list = []

#: How multiprocessing's server command starts (CPython 3.9 to 3.14).
SERVER_COMMAND = "from multiprocessing.forkserver import main; main("


def ending_at_once(args: list[str]) -> list[str]:
    """The server's command line, its command wrapped so that the server leaves by
    ``os._exit`` when its callers are gone, instead of by a normal interpreter exit.

    Why: a normal exit collects and tears down all of torch, ``torch._dynamo`` and parlab:
    1.1 s of the server's CPU after its caller's exit, after every kernel, while the next one
    (a restart and Run All) starts on the same cores. Nothing of a reader's runs in the server
    (its ranks end by ``os._exit`` too); a command of another shape is left as it is.
    """
    args = list(args)
    if "-c" in args[:-1]:
        at = args.index("-c") + 1
        if args[at].startswith(SERVER_COMMAND):
            args[at] = ("import os, sys\ntry:\n    " + args[at] + "\nexcept SystemExit as end:\n"
                        "    sys.stdout.flush(); sys.stderr.flush()\n"
                        "    os._exit(end.code if isinstance(end.code, int) else 0)\n")
    return args
