"""A rank is a worker: what a training script does under torchrun, fn may do under run(fn, n).

One script, run both ways: ``torchrun --standalone --nproc-per-node 2 script.py torchrun``
(its workers call ``main``) and ``python script.py run`` (which calls ``run(main, 2)``). ``main``
begins as a torchrun script does (``dist.init_process_group("gloo")``), tries the habits of
training scripts, writes what it saw to ``out.<rank>.json`` in its working directory, and rank 1
ends with ``sys.exit(0)``. The two ways must write the same answers (process ids aside, which
must differ per rank). The script imports only the standard library at the top, so a child
that a worker *spawns* (which imports the script again as ``__mp_main__``) starts fast.

Then the launcher's own side of the differences (each a fast local launch): a rank that exits
non-zero or raises is named, ``init_process_group`` with another backend says what to do, and
a two-node torchrun job (two agents on this machine, c10d rendezvous) runs ``run(fn, 4)``.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch.distributed as dist

from procs import clean_env, free_port, wait_gone
from parlab.launch import RankError, run

PY = sys.executable

_SCRIPT = '''
import atexit, json, multiprocessing as mp, os, random, signal, subprocess, sys, threading, time

def square(x):
    return x * x

def write(path, text):
    with open(path, "w") as f:
        f.write(text)

def main(folder, again_from_env=True):
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")  # what a torchrun script does first
    rank = dist.get_rank()
    out = {"rank": rank, "world": dist.get_world_size(), "backend": dist.get_backend()}
    out["env"] = {k: os.environ.get(k) for k in
                  ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")}
    out["master"] = [os.environ.get("MASTER_ADDR", "") != "",
                     os.environ.get("MASTER_PORT", "").isdigit()]
    out["pid"] = os.getpid()
    out["daemon"] = mp.current_process().daemon
    out["start method"] = mp.get_start_method() == mp.get_all_start_methods()[0]

    def attempt(name, how):
        try:
            out[name] = how()
        except Exception as exc:  # the answer is then the error, compared both ways
            out[name] = f"{type(exc).__name__}: {exc}"[:300]

    # processes of its own
    attempt("subprocess", lambda: subprocess.run([sys.executable, "-c", "print(6 * 7)"],
                                                 capture_output=True, text=True).stdout.strip())
    def pool():
        with mp.Pool(2) as p:  # the default start method; square is this script's (__main__)
            return p.map(square, [1, 2, 3])
    attempt("pool", pool)
    def spawned():
        path = os.path.join(folder, f"spawned.{rank}")
        child = mp.get_context("spawn").Process(target=write, args=(path, "spawned"))
        child.start()
        child.join(60)
        return [child.exitcode, open(path).read()]
    attempt("spawn process", spawned)
    def loader():
        class Squares(torch.utils.data.Dataset):
            def __len__(self):
                return 4
            def __getitem__(self, i):
                return torch.tensor([float(i * i)])
        batches = torch.utils.data.DataLoader(Squares(), batch_size=2, num_workers=2)
        return [b.flatten().tolist() for b in batches]
    attempt("dataloader", loader)

    # process groups of its own
    def group():
        g = dist.new_group([0, 1])
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t, group=g)
        dist.destroy_process_group(g)
        return t.item()
    attempt("new_group", group)
    def again():
        dist.destroy_process_group()
        dist.init_process_group("gloo")  # from the environment: MASTER_ADDR, MASTER_PORT
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        return [dist.get_rank(), dist.get_world_size(), t.item()]
    if again_from_env:
        attempt("destroy and init again", again)
    attempt("init when one is up", lambda: dist.init_process_group("gloo"))

    # seeds, signals, threads, files
    torch.manual_seed(1234 + rank)
    random.seed(rank)
    out["seeded"] = [round(x, 6) for x in torch.rand(2).tolist()] + [random.random()]
    got = []
    signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(signum))
    before = signal.signal(signal.SIGTERM, lambda signum, frame: None)  # a preemption hook
    os.kill(os.getpid(), signal.SIGUSR1)
    out["signal"] = got == [signal.SIGUSR1]
    signal.signal(signal.SIGTERM, before)
    box = []
    worker = threading.Thread(target=lambda: box.append(rank * 10))
    worker.start()
    worker.join()
    out["thread"] = box
    write(f"cwd.{rank}", "relative")  # a relative path: the working directory
    out["cwd"] = os.path.exists(os.path.join(folder, f"cwd.{rank}"))
    # left for the exit: a non-daemon thread still running, and an atexit handler
    threading.Thread(target=lambda: (time.sleep(0.3), write(os.path.join(folder, f"thread.{rank}"), "x"))).start()
    atexit.register(write, os.path.join(folder, f"atexit.{rank}"), "x")
    dist.destroy_process_group()
    write(os.path.join(folder, f"out.{rank}.json"), json.dumps(out))
    if rank == 1:
        sys.exit(0)  # a worker that exits 0 succeeded
    return rank

if __name__ == "__main__":
    folder = os.getcwd()
    if sys.argv[1] == "torchrun":
        main(folder, again_from_env=False)  # see test_destroy_and_init_again_from_the_environment
    else:
        from parlab.launch import run
        print("results", json.dumps(run(main, 2, folder, timeout=120)))
'''


def _both_ways(tmp_path):
    """Run the script under torchrun and under run(); return {way: (process, [out0, out1])}."""
    script = tmp_path / "habits.py"
    script.write_text(_SCRIPT)
    env = clean_env(OMP_NUM_THREADS=1)
    commands = {
        "torchrun": [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                     str(script), "torchrun"],
        "run": [PY, str(script), "run"],
    }
    done = {}
    for way, command in commands.items():
        folder = tmp_path / way
        folder.mkdir()
        proc = _run_session(command, cwd=folder, env=env)
        outs = [json.loads((folder / f"out.{r}.json").read_text())
                if (folder / f"out.{r}.json").exists() else None for r in (0, 1)]
        done[way] = (proc, outs, folder)
    return done


def _run_session(command, timeout=240, **kwargs):
    """subprocess.run in a session of its own, killed whole (workers too) if it overstays."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\n(killed after {timeout} s)"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # nothing of it outlives the test
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


@pytest.fixture(scope="module")
def both_ways(tmp_path_factory):
    return _both_ways(tmp_path_factory.mktemp("habits"))


def test_habits_give_the_same_answers_both_ways(both_ways):
    (tr, tr_outs, _), (rn, rn_outs, _) = both_ways["torchrun"], both_ways["run"]
    assert tr.returncode == 0, tr.stderr[-3000:]
    assert rn.returncode == 0, rn.stderr[-3000:]
    assert None not in tr_outs and None not in rn_outs
    for rank in (0, 1):
        a, b = dict(tr_outs[rank]), dict(rn_outs[rank])
        a.pop("pid"), b.pop("pid"), b.pop("destroy and init again")
        assert b == a, {k: (a.get(k), b.get(k)) for k in set(a) | set(b) if a.get(k) != b.get(k)}


def test_habits_answers_are_the_expected_ones(both_ways):
    """The answers themselves, by hand (so that 'the same both ways' is not 'broken both ways')."""
    for way, (_, outs, folder) in both_ways.items():
        for rank, got in enumerate(outs):
            assert got["env"] == {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                                  "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0"}, way
            assert got["master"] == [True, True] and got["daemon"] is False, way
            assert got["start method"] is True, way
            assert got["subprocess"] == "42" and got["pool"] == [1, 4, 9], (way, got)
            assert got["spawn process"] == [0, "spawned"], (way, got)
            assert got["dataloader"] == [[0.0, 1.0], [4.0, 9.0]], (way, got)
            assert got["new_group"] == 3.0, (way, got)
            assert "twice" in got["init when one is up"], (way, got)  # PyTorch's own error
            assert got["signal"] is True and got["thread"] == [rank * 10] and got["cwd"] is True
            for left in ("atexit", "thread"):  # ran when the worker ended
                assert (folder / f"{left}.{rank}").exists(), (way, left, rank)
        assert outs[0]["pid"] != outs[1]["pid"]
        assert outs[0]["seeded"] != outs[1]["seeded"]  # seeded per rank


def test_destroy_and_init_again_from_the_environment(both_ways):
    """fn destroys the launch's group and makes one from MASTER_ADDR/MASTER_PORT, as a script
    may. (Left out under torchrun: in PyTorch 2.13 a group made again through the agent's
    store can read the previous group's addresses, left in that store, and fail or hang.)"""
    _, outs, _ = both_ways["run"]
    assert [out["destroy and init again"] for out in outs] == [[0, 2, 3.0], [1, 2, 3.0]]


def test_sys_exit_zero_is_success_with_no_result(both_ways):
    proc, _, _ = both_ways["run"]
    assert proc.stdout.splitlines()[-1] == "results [0, null]"


# --- the launcher's side: failures name the rank, a wrong init says what to do ---------------

def _exit_on_1(code):
    if dist.get_rank() == 1:
        sys.exit(code)
    return dist.get_rank()


def test_sys_exit_nonzero_names_the_rank():
    with pytest.raises(RankError) as info:
        run(_exit_on_1, 2, 3, timeout=30)
    assert info.value.rank == 1 and info.value.exc_type == "SystemExit"
    assert "sys.exit(3)" in str(info.value)
    assert run(_exit_on_1, 2, None, timeout=30) == [0, None]  # sys.exit() is sys.exit(0)


def _launch_from_a_child():
    code = "from parlab.launch import run; print(run(lambda: 7, 1, timeout=60))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120).stdout.strip().splitlines()[-1:]


def test_a_child_of_a_rank_may_launch_ranks_of_its_own():
    """Only fn itself may not call run (it would wait for itself); a process it starts may,
    as a process that a torchrun worker starts may (it inherits RANK, ... and launches locally)."""
    assert run(_launch_from_a_child, 1, timeout=120) == [["[7]"]]


def _init_other_backend():
    dist.init_process_group("nccl" if dist.get_backend() == "gloo" else "gloo")


def _init_wrong_rank():
    dist.init_process_group(dist.get_backend(), rank=5, world_size=2)


def test_init_with_another_backend_says_what_to_do():
    with pytest.raises(RankError) as info:
        run(_init_other_backend, 2, backend="gloo", timeout=30)
    assert "run(fn, 2, backend='nccl')" in str(info.value)
    with pytest.raises(RankError, match=r"init_process_group\(rank=5\) inside parlab.launch.run"):
        run(_init_wrong_rank, 2, timeout=30)


def _pool_then_hang(directory):
    import multiprocessing as mp
    pool = mp.Pool(2)  # left running, its workers alive
    pids = [p.pid for p in pool._pool]
    with open(os.path.join(directory, f"pid.{dist.get_rank()}"), "w") as f:
        f.write("\n".join(map(str, pids + [os.getpid()])))
    if dist.get_rank() == 1:
        raise ValueError("rank one gives up")
    time.sleep(300)


def test_a_rank_that_left_a_pool_running_leaves_nothing(tmp_path):
    with pytest.raises(RankError) as info:
        run(_pool_then_hang, 2, str(tmp_path), timeout=60)
    assert info.value.rank == 1 and "rank one gives up" in info.value.rank_traceback
    pids = [int(p) for f in tmp_path.iterdir() for p in f.read_text().split()]
    assert len(pids) == 6 and wait_gone(pids) == []


# --- two torchrun agents on one machine: the multi-machine path -----------------------------

_TWO_NODES = '''
import json, os, sys
import torch, torch.distributed as dist
from parlab.launch import run

def total():
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return [dist.get_rank(), int(os.environ["GROUP_RANK"]), int(os.environ["LOCAL_RANK"]), t.item()]

if __name__ == "__main__":
    result = run(total, 4, backend="toy", timeout=60)
    log = result.traffic
    out = {"results": list(result), "ranks": log.ranks(), "ops": sorted({r.op for r in log.records}),
           "world": result.world_size}
    with open(os.path.join(sys.argv[1], "out." + os.environ["RANK"]), "w") as f:
        json.dump(out, f)
'''


def test_two_torchrun_agents_on_one_machine(tmp_path):
    """torchrun --nnodes 2: two agents (two local "nodes") meet through the c10d rendezvous."""
    script = tmp_path / "two_nodes.py"
    script.write_text(_TWO_NODES)
    port = free_port()
    agents = []
    try:
        for node in (0, 1):
            command = [PY, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
                       "--node-rank", str(node), "--rdzv-backend", "c10d",
                       "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"parlab-{port}",
                       "--max-restarts", "0", str(script), str(tmp_path)]
            agents.append(subprocess.Popen(command, env=clean_env(OMP_NUM_THREADS=1),
                                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                           text=True, start_new_session=True))
        outputs = [agent.communicate(timeout=120)[0] for agent in agents]
    finally:
        for agent in agents:  # a failure kills both agents and every worker they started
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()
    for agent, output in zip(agents, outputs):
        assert agent.returncode == 0, output[-3000:]
    # every rank's all_reduce of rank + 1 over 4 ranks is 1 + 2 + 3 + 4
    expected = [[rank, rank // 2, rank % 2, 10.0] for rank in range(4)]
    for rank in range(4):
        got = json.loads((tmp_path / f"out.{rank}").read_text())
        assert got["results"] == expected and got["world"] == 4
        assert got["ranks"] == [0, 1, 2, 3] and "all_reduce" in got["ops"], got
