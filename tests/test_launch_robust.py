"""The launcher where readers actually call it: heredocs, stale shells, torchrun, killed kernels.

(issue 18: stdin/-c/unguarded scripts, stale torchrun variables, run_with_traffic and a
changed backend under a real torchrun, processes a rank leaves behind, work folders of a
killed caller, and launch arguments checked before any rank starts.)
"""
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import warnings

import pytest
import torch.distributed as dist

from procs import clean_env, free_port, read_pids, wait_for_pids, wait_gone
from parlab import launch
from parlab.launch import RankError, run

PY = sys.executable


def _python(args, timeout=120, **kwargs):
    kwargs.setdefault("env", clean_env())
    return subprocess.run([PY, *args], capture_output=True, text=True, timeout=timeout, **kwargs)


# --- 1. heredocs, python -c, scripts without the __main__ guard ----------------------------

_BODY = """\
import torch.distributed as dist
from parlab.launch import run
print("top level runs once")
SCALE = 3
def scaled(x):
    return (x + dist.get_rank()) * SCALE
print("result", run(scaled, 2, 1, timeout=60))
"""


@pytest.mark.parametrize("how", ["stdin", "-c", "unguarded script", "unguarded -m module"])
def test_main_module_that_cannot_be_imported_again(how, tmp_path):
    if how == "stdin":
        out = _python(["-"], input=_BODY, cwd=tmp_path)
    elif how == "-c":
        out = _python(["-c", _BODY], cwd=tmp_path)
    elif how == "unguarded script":
        script = tmp_path / "unguarded.py"
        script.write_text(_BODY)
        out = _python([str(script)], cwd=tmp_path)
    else:
        (tmp_path / "unguarded_module.py").write_text(_BODY)
        out = _python(["-m", "unguarded_module"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines.count("top level runs once") == 1  # the ranks did not run the script again
    assert lines[-1] == "result [3, 6]"


# --- a rank that dies before it says anything -----------------------------------------------

def _killed_on_rank_1():
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


def test_rank_killed_silently_reports_the_signal_name():
    with pytest.raises(RankError) as info:
        run(_killed_on_rank_1, 2, timeout=30)
    message = str(info.value)
    assert info.value.rank == 1
    assert "killed by signal 9 (SIGKILL)" in message and "printed nothing" in message
    assert "(nothing)" not in message


def _exit_with_stderr_on_rank_0():
    if dist.get_rank() == 0:
        sys.stderr.write("disk full, giving up\n")
        sys.stderr.flush()
        os._exit(7)
    dist.barrier()


def test_rank_exiting_reports_code_and_stderr():
    with pytest.raises(RankError) as info:
        run(_exit_with_stderr_on_rank_0, 2, timeout=30)
    assert info.value.rank == 0
    assert "exited with code 7" in str(info.value) and "disk full, giving up" in str(info.value)


# --- 2. stale torchrun variables --------------------------------------------------------------

def _environment_seen():
    return dist.get_world_size(), os.environ.get("MASTER_ADDR"), os.environ.get("TORCHELASTIC_RUN_ID")


def test_stale_torchrun_variables_launch_locally_and_warn(monkeypatch):
    for name, value in dict(RANK="0", WORLD_SIZE="1", MASTER_ADDR="10.255.255.1",
                            MASTER_PORT=str(free_port())).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(launch.torchrun, "_warned", set())
    start = time.monotonic()
    with pytest.warns(RuntimeWarning, match="RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set") as seen:
        results = run(_environment_seen, 4, timeout=5)
    assert time.monotonic() - start < 15  # not minutes of waiting for a job that never comes
    # four local ranks; each sees its launch's own address (as a torchrun worker sees its
    # job's), not the stale one
    assert results == [(4, "127.0.0.1", None)] * 4
    assert "unset RANK WORLD_SIZE MASTER_ADDR MASTER_PORT" in str(seen[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once is enough
        assert len(run(_environment_seen, 2, timeout=5)) == 2


def test_rank_and_world_size_without_master_addr(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setattr(launch.torchrun, "_warned", set())
    with pytest.warns(RuntimeWarning, match="not started by torchrun"):
        assert [r[0] for r in run(_environment_seen, 2, timeout=10)] == [2, 2]


_SHOW = """\
import torch.distributed as dist
from parlab.launch import run, environment
print("result", run(lambda: dist.get_world_size(), {n}, timeout=30), environment()["under_torchrun"])
"""


def _torchrun_env(rank, world_size, port, **extra):
    return clean_env(RANK=rank, WORLD_SIZE=world_size, LOCAL_RANK=rank, LOCAL_WORLD_SIZE=world_size,
                     GROUP_RANK=0, ROLE_RANK=rank, TORCHELASTIC_RUN_ID="stale-job",
                     MASTER_ADDR="127.0.0.1", MASTER_PORT=port, **extra)


def test_inherited_torchrun_environment_is_not_a_job(tmp_path):
    """A program started from a torchrun worker (a notebook server) has all of torchrun's
    variables, inherited from its parent: it launches locally, with any world size."""
    script = tmp_path / "child.py"
    script.write_text(_SHOW.format(n=4))
    parent = f"import subprocess, sys; sys.exit(subprocess.run([sys.executable, {str(script)!r}]).returncode)"
    start = time.monotonic()
    out = subprocess.run([PY, "-c", parent], capture_output=True, text=True, timeout=120,
                         env=_torchrun_env(0, 1, free_port()))
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines()[-1] == "result [4, 4, 4, 4] False"
    assert "inherited from the parent process" in out.stderr and "TORCHELASTIC_RUN_ID" in out.stderr
    assert time.monotonic() - start < 60


def test_torchrun_worker_waits_no_longer_than_the_timeout(tmp_path):
    """A worker whose job never comes (nothing listens on MASTER_PORT) fails at the timeout."""
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent("""
        import time
        from parlab.launch import run
        start = time.monotonic()
        try:
            run(lambda: 0, 2, timeout=3)
        except Exception as exc:
            print(type(exc).__name__, "after", round(time.monotonic() - start))
    """))
    out = _python([str(script)], env=_torchrun_env(1, 2, free_port()))
    assert out.returncode == 0, out.stderr[-3000:]
    kind, _, seconds = out.stdout.split()[-3:]
    assert kind != "ValueError" and int(seconds) <= 10, out.stdout


# --- 3. a real torchrun job: run_with_traffic, another backend, clear errors ---------------

_JOB = """\
import json, os, sys
import torch, torch.distributed as dist
from parlab.comm import run_with_traffic
from parlab import launch
from parlab.launch import RankError, run

def total():
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return t.item()

def where():
    return dist.get_backend(), dist.get_world_size()

def fail_on_1():
    if dist.get_rank() == 1:
        raise ValueError("rank one says no")
    return 0

if __name__ == "__main__":
    out = {}
    results, log = run_with_traffic(total, 2)
    out["traffic"] = [results, len(log) > 0, log.ranks()]
    out["run"] = [results.world_size, results.backend, len(results.spans), results.traffic is log]
    out["backends"] = [run(where, 2, backend="toy"), run(where, 2, backend="gloo"), run(where, 2)]
    # one process serves every run: each run's traffic is its own, none on gloo
    again = [run(total, 2, backend="toy").traffic.filter(op="all_reduce") for _ in range(2)]
    out["own traffic"] = [[len(log), log.total_bytes()] for log in again]
    out["gloo traffic"] = run(total, 2, backend="gloo").traffic is None
    out["default"] = launch.default_backend(2)
    for bad in (3, 1):
        try:
            run(total, bad)
        except ValueError as exc:
            out[f"world_size {bad}"] = str(exc)
    try:
        run(fail_on_1, 2)
    except RankError as exc:
        out["error"] = [exc.rank, exc.exc_type, "rank one says no" in str(exc)]
    with open(os.path.join(sys.argv[1], "out." + os.environ["RANK"]), "w") as f:
        json.dump(out, f)
"""


def test_real_torchrun_traffic_backends_and_errors(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(_JOB)
    torchrun = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                str(script), str(tmp_path)]
    out = subprocess.run(torchrun, capture_output=True, text=True, timeout=240,
                         env=clean_env(OMP_NUM_THREADS=1))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "not started by torchrun" not in out.stderr
    for rank in (0, 1):
        got = json.loads((tmp_path / f"out.{rank}").read_text())
        assert got["traffic"] == [[3.0, 3.0], True, [0, 1]]
        assert got["run"] == [2, "toy", 2, True]
        first, second = got["own traffic"]
        assert first == second and first[0] > 0  # the second run does not see the first's
        assert got["gloo traffic"] is True
        assert got["backends"] == [[["toy", 2]] * 2, [["gloo", 2]] * 2, [[got["default"], 2]] * 2]
        for bad in (3, 1):
            assert f"run(fn, {bad}) under torchrun" in got[f"world_size {bad}"]
            assert "WORLD_SIZE=2" in got[f"world_size {bad}"]
        assert got["error"] == [1, "ValueError", True]


# --- 4. nothing a rank started outlives the launch ------------------------------------------

def _start_sleep():
    return subprocess.Popen(["sleep", "300"]).pid


def test_processes_started_by_ranks_do_not_outlive_the_launch():
    pids = []
    for _ in range(5):
        pids += run(_start_sleep, 4)
    assert len(set(pids)) == 20
    assert wait_gone(pids) == []


def _start_sleep_and_die(directory):
    pid = subprocess.Popen(["sleep", "300"]).pid
    with open(os.path.join(directory, f"pid.{dist.get_rank()}"), "w") as f:
        f.write(str(pid))
    if dist.get_rank() == 1:
        os._exit(3)
    time.sleep(300)


def test_processes_of_a_rank_that_died_do_not_outlive_the_launch(pid_dir):
    with pytest.raises(RankError, match="exited with code 3"):
        run(_start_sleep_and_die, 3, pid_dir, timeout=60)
    pids = read_pids(pid_dir)
    assert len(pids) == 3 and wait_gone(pids) == []


# --- 5. the work folder of a caller that was killed -----------------------------------------

def _folder(root, name, owner=None):
    path = os.path.join(root, name)
    os.mkdir(path)
    if owner is not None:
        with open(os.path.join(path, launch.workdir.OWNER_FILE), "w") as f:
            f.write(owner)
    return path


def test_stale_work_folders_are_removed_safely(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen(["true"])
    gone.wait()
    alive = subprocess.Popen(["sleep", "60"])
    try:
        stale = _folder(tmp_path, "parlab-stale", f"{gone.pid} 1")
        live = _folder(tmp_path, "parlab-live", f"{alive.pid} ")
        mine = _folder(tmp_path, "parlab-mine", f"{os.getpid()} ")
        unmarked = _folder(tmp_path, "parlab-unmarked")  # being made, or not ours
        other = _folder(tmp_path, "other-stale", f"{gone.pid} 1")
        link = tmp_path / "parlab-link"
        link.symlink_to(stale)
        assert run(lambda: 1, 1) == [1]
        assert not os.path.exists(stale)
        for kept in (live, mine, unmarked, other):
            assert os.path.isdir(kept)
        assert os.path.islink(link)  # a link is never followed nor removed
        # (a pymp-* folder is multiprocessing's own, made where it first needs one)
        assert sorted(n for n in os.listdir(tmp_path) if not n.startswith("pymp-")) == sorted(
            ["parlab-live", "parlab-mine", "parlab-unmarked", "other-stale", "parlab-link"])
    finally:
        alive.kill()
        alive.wait()


def test_work_folder_of_a_killed_caller_goes_at_the_next_launch(tmp_path, monkeypatch):
    script = tmp_path / "victim.py"
    script.write_text(textwrap.dedent(f"""
        import os, time
        import torch.distributed as dist
        from parlab.launch import run
        def wait(directory):
            with open(os.path.join(directory, f"pid.{{dist.get_rank()}}"), "w") as f:
                f.write(str(os.getpid()))
            time.sleep(300)
        run(wait, 2, {str(tmp_path)!r}, timeout=300)
    """))
    victim = subprocess.Popen([PY, str(script)], env=clean_env(TMPDIR=str(tmp_path)),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_pids(str(tmp_path), 2, 120, victim)
        folders = [n for n in os.listdir(tmp_path) if n.startswith("parlab-")]
        assert len(folders) == 1
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()
    assert wait_gone(read_pids(str(tmp_path)), seconds=10) == []  # the ranks went with it
    assert os.path.isdir(tmp_path / folders[0])
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert run(lambda: 2, 1) == [2]
    assert [n for n in os.listdir(tmp_path) if n.startswith("parlab-")] == []


# --- 6. launch arguments, all checked before any rank starts -------------------------------

class _NoRank:
    def __init__(self, *args, **kwargs):
        raise AssertionError("a rank was started before the arguments were checked")


@pytest.mark.parametrize("timeout", [math.nan, math.inf, -math.inf, 1e12, -1, 0, True, "5", None])
def test_bad_timeout_names_the_valid_range(timeout, monkeypatch):
    monkeypatch.setattr(launch.local, "RankProcess", _NoRank)
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"timeout must be .* at most 604800 .*got"):
        run(lambda: 0, 2, timeout=timeout)
    assert time.monotonic() - start < 2


@pytest.mark.parametrize("threads", [0, -1, 2.0, True, 10**6])
def test_bad_threads_is_a_clear_error(threads, monkeypatch):
    monkeypatch.setattr(launch.local, "RankProcess", _NoRank)
    with pytest.raises(ValueError, match="threads must be None .* from 1 to 1024"):
        run(lambda: 0, 2, threads=threads)


def test_arguments_that_cannot_travel_are_refused_before_any_rank_starts(monkeypatch):
    monkeypatch.setattr(launch.local, "RankProcess", _NoRank)
    with pytest.raises(ValueError, match="cannot be pickled.*lock"):
        run(lambda lock: 0, 2, threading.Lock())


def test_large_valid_timeout_still_runs():
    assert run(lambda: 5, 2, timeout=launch.backends.MAX_TIMEOUT) == [5, 5]
