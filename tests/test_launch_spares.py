"""Ranks forked ahead of time (parlab.launch.spares): a launch hands its jobs to idle ranks.

Each test runs a fresh interpreter that turns spares on (as a notebook kernel does) and
checks what a launch that uses them must keep: the results, the caller's working directory
at launch time, errors with their rank, a spare that died while idle, and no process left
once the caller is gone.
"""
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import parlab
from procs import wait_gone

PKG = str(Path(parlab.__file__).resolve().parents[1])

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
"""


def _python(code: str, timeout=120) -> dict:
    env = {**os.environ, "PYTHONPATH": PKG}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
        env.pop(name, None)
    script = textwrap.dedent(PRELUDE) + textwrap.dedent(code)
    out = subprocess.run([sys.executable, "-c", script], env=env, text=True,
                         capture_output=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_launch_runs_on_the_spares_the_last_one_left(tmp_path):
    out = _python(f"""
        run(me, 3)
        ready = pool(3)
        os.chdir({str(tmp_path)!r})
        ranks = run(me, 3)
        print(json.dumps({{"ready": ready, "ranks": list(ranks), "after": pool(3)}}))
    """)
    pids = [pid for pid, _, _ in out["ranks"]]
    assert sorted(pids) == sorted(out["ready"])  # every rank was a spare
    assert [rank for _, rank, _ in out["ranks"]] == [0, 1, 2]
    assert {cwd for _, _, cwd in out["ranks"]} == {str(tmp_path)}  # the caller's, at launch
    assert len(out["after"]) == 3 and not set(out["after"]) & set(pids)  # refilled, anew
    assert wait_gone(out["ready"] + out["after"]) == []  # the caller exited: all gone


def test_a_spare_that_died_while_idle_is_replaced():
    out = _python("""
        run(me, 2)
        ready = pool(2)
        os.kill(ready[0], signal.SIGKILL)
        time.sleep(0.2)
        ranks = run(me, 2)
        print(json.dumps({"ready": ready, "ranks": list(ranks)}))
    """)
    pids = [pid for pid, _, _ in out["ranks"]]
    assert out["ready"][0] not in pids and out["ready"][1] in pids, out
    assert [rank for _, rank, _ in out["ranks"]] == [0, 1]


def test_a_spare_reports_its_error_with_its_rank_and_a_larger_launch_forks_the_rest():
    out = _python("""
        def fail():
            if dist.get_rank() == 1:
                raise ValueError("rank one says no")
            return dist.get_rank()

        run(me, 2)
        pool(2)
        try:
            run(fail, 2)
            error = None
        except RankError as exc:
            error = [exc.rank, str(exc).splitlines()[0]]
        pool(2)
        ranks = run(me, 4)  # two spares, two new ranks
        print(json.dumps({"error": error, "ranks": [r for _, r, _ in ranks]}))
    """)
    assert out["error"] == [1, "rank 1 raised ValueError: rank one says no"]
    assert out["ranks"] == [0, 1, 2, 3]


def test_spares_only_where_enabled():
    env = {**os.environ, "PYTHONPATH": PKG}
    code = ("from parlab.launch import run, spares; import time\n"
            "run(lambda: 0, 2); time.sleep(0.5); print(spares.enabled(), len(spares._pool))")
    out = subprocess.run([sys.executable, "-c", code], env=env, text=True,
                         capture_output=True, timeout=120)
    assert out.stdout.split() == ["False", "0"], out.stderr[-2000:]
