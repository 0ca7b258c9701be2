"""Ranks forked ahead of time (parlab.launch.spares): a launch hands its jobs to idle ranks.

One fresh interpreter turns spares on (as a notebook kernel does) and goes through the cases
in turn; the tests check what a launch that uses spares must keep: the results, the caller's
working directory at launch time, errors with their rank, a spare that died while idle, and
no process left once the caller is gone.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from procs import env_with_parlab, wait_gone


PRELUDE = """
    import json, os, signal, sys, time
    import torch.distributed as dist
    from parlab.launch import run, RankError, spares
    spares.enable()

    def pool(count, seconds=30):
        deadline = time.monotonic() + seconds
        while len(spares._pool) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return [s.proc.pid for s in spares._pool]

    def me():
        return os.getpid(), dist.get_rank(), os.getcwd()

    def gone(pid, seconds=30):  # reaped by the server, which then reports the exit (not
        # procs.wait_gone: a zombie counts as gone there, its exit not yet reported)
        deadline = time.monotonic() + seconds
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.05)
"""


def _python(code: str, timeout=120) -> dict:
    env = env_with_parlab()
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
        env.pop(name, None)
    script = textwrap.dedent(PRELUDE) + textwrap.dedent(code)
    out = subprocess.run([sys.executable, "-c", script], env=env, text=True,
                         capture_output=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def seen(tmp_path_factory) -> dict:
    """One interpreter goes through every case in turn (each interpreter start and server
    warm-up costs seconds): what each launch returned, and the spares it saw."""
    folder = str(tmp_path_factory.mktemp("cwd"))
    return _python(f"""
        def fail():
            if dist.get_rank() == 1:
                raise ValueError("rank one says no")
            return dist.get_rank()

        seen = {{"folder": {folder!r}}}
        run(me, 3)
        seen["ready"] = pool(3)
        os.chdir({folder!r})
        seen["ranks"] = list(run(me, 3))
        seen["after"] = pool(3)
        os.kill(seen["after"][-1], signal.SIGKILL)  # the first one the next launch takes
        gone(seen["after"][-1])  # (a fixed 0.2 s was not always enough on a loaded machine)
        seen["after_kill"] = list(run(me, 2))
        pool(3)
        try:
            run(fail, 2)
        except RankError as exc:
            seen["error"] = [exc.rank, str(exc).splitlines()[0]]
        pool(3)
        seen["larger"] = [r for _, r, _ in run(me, 5)]  # three spares, two new ranks
        seen["left"] = pool(3)
        print(json.dumps(seen))
    """)


def test_a_launch_runs_on_the_spares_the_last_one_left(seen):
    pids = [pid for pid, _, _ in seen["ranks"]]
    assert sorted(pids) == sorted(seen["ready"])  # every rank was a spare
    assert [rank for _, rank, _ in seen["ranks"]] == [0, 1, 2]
    assert {cwd for _, _, cwd in seen["ranks"]} == {seen["folder"]}  # the caller's, at launch
    assert len(seen["after"]) == 3 and not set(seen["after"]) & set(pids)  # refilled, anew


def test_a_spare_that_died_while_idle_is_replaced(seen):
    killed, pids = seen["after"][-1], [pid for pid, _, _ in seen["after_kill"]]
    assert killed not in pids and len(set(pids)) == 2, seen
    assert [rank for _, rank, _ in seen["after_kill"]] == [0, 1]


def test_a_spare_reports_its_error_with_its_rank_and_a_larger_launch_forks_the_rest(seen):
    assert seen["error"] == [1, "rank 1 raised ValueError: rank one says no"]
    assert seen["larger"] == [0, 1, 2, 3, 4]


def test_no_spare_outlives_its_caller(seen):
    spares = seen["ready"] + seen["after"] + seen["left"]
    assert wait_gone(spares) == []


def test_spares_only_where_enabled():
    env = env_with_parlab()
    code = ("from parlab.launch import run, spares; import time\n"
            "run(lambda: 0, 2); time.sleep(0.5); print(spares.enabled(), len(spares._pool))")
    out = subprocess.run([sys.executable, "-c", code], env=env, text=True,
                         capture_output=True, timeout=120)
    assert out.stdout.split() == ["False", "0"], out.stderr[-2000:]
