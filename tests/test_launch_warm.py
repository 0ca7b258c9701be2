"""The first launch does not wait for the forkserver: it warms in the background.

Until the server is warm, ranks are forked from the caller itself (when that is safe); they
must start exactly as ranks forked from the server do. The server warms from a notebook's
import of parlab.launch on, and never in a plain import, a tool or under torchrun.
"""
import os
import subprocess
import sys
import textwrap
import time
import types

import pytest
import torch

from parlab.launch import apart, forking, server
from procs import env_with_parlab


#: Where a script's launches may fork from the script itself (launch/forking.py): on Linux
#: without a GPU. On the GPU machine every launch comes from the server instead.
needs_direct_fork = pytest.mark.skipif(
    not sys.platform.startswith("linux") or torch.cuda.is_available(),
    reason="ranks are forked from the caller only on Linux without a GPU (launch/forking.py)")


def _python(code: str, timeout=120) -> str:
    env = env_with_parlab()
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
        env.pop(name, None)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, text=True,
                         capture_output=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_a_plain_import_starts_no_server():
    """Nor does it import matplotlib with parlab.experiments, which every notebook's server
    preloads for its ranks (they never draw): the plot modules import it at their first
    figure (parlab.viz.lazy)."""
    out = _python("""
        import sys, time
        from multiprocessing import forkserver
        import parlab.launch, parlab.experiments
        print("matplotlib" in sys.modules)
        import parlab.tools.book
        time.sleep(0.5)
        print(forkserver._forkserver._forkserver_pid, parlab.launch.server.is_warm())
    """)
    assert out.split() == ["False", "None", "False"]


@needs_direct_fork
def test_a_scripts_launches_fork_from_the_caller_and_start_like_a_server_rank():
    """Outside a notebook every launch forks its ranks from the caller and no server starts;
    from the second launch on the ranks inherit ``torch._dynamo`` from the caller. The caller
    changes what a rank could inherit; ranks forked from it and from the warm server must see
    the same fresh state: float32, grad on, and one random stream shared by the ranks (the
    caller's seeded stream is not it)."""
    out = _python("""
        import os, sys, time, torch
        from multiprocessing import forkserver
        from parlab.launch import run, server

        def fn():
            return (os.getppid(), torch.rand(2).tolist(), str(torch.get_default_dtype()),
                    torch.is_grad_enabled(), "torch._dynamo" in sys.modules)

        torch.manual_seed(5)
        torch.set_default_dtype(torch.float64)
        with torch.no_grad():
            first = run(fn, 2, threads=1)
            later = run(fn, 2, threads=1)
            no_server = forkserver._forkserver._forkserver_pid is None
            server.warm()
            for _ in range(600):
                if server.is_warm():
                    break
                time.sleep(0.1)
            served = run(fn, 2, threads=1)  # a started server forks every launch after
        me = os.getpid()
        torch.manual_seed(5)
        callers = torch.rand(2).tolist()
        runs = (first, later, served)
        print([[r[0] == me for r in run_] for run_ in runs], no_server)
        print([r[1] == run_[0][1] != callers for run_ in runs for r in run_])
        print({r[2:4] for run_ in runs for r in run_})
        print([[r[4] for r in run_] for run_ in runs])
    """)
    parents, shared, state, dynamo = out.strip().splitlines()
    assert parents == "[[True, True], [True, True], [False, False]] True", out
    assert shared == str([True] * 6), out
    assert state == "{('torch.float32', True)}", out
    assert dynamo == "[[False, False], [True, True], [True, True]]", out


@needs_direct_fork
def test_a_launch_that_waits_for_the_server_imports_dynamo_meanwhile():
    """A launch that waits for a cold server imports torch._dynamo in the caller (a reader's
    first optimizer needs it) and has finished that import when it returns; a direct launch
    (forked from the caller) imports nothing in the background, nor does a warm one.

    Also preload() after the server started (a chapter's import cell imports parlab.launch,
    which starts it, then asks for more modules): the server, still importing, is replaced
    by one that preloads them too (its ranks have them without importing them) and the first
    one is gone; once the server forks ranks it is too late, and preload says so."""
    out = _python("""
        import os, sys, threading, time
        import torch.distributed as dist
        from multiprocessing import forkserver
        from parlab.launch import run, server

        def fn():
            return dist.get_rank()

        def preloaded(name):
            return name in sys.modules

        direct = run(fn, 2, threads=1)  # cold, one thread a rank: forked from the caller
        after_direct = "torch._dynamo" in sys.modules
        # the server's warming thread arrives late (as under load, seen in CI): preload
        # kills the server first, and multiprocessing would start another for that thread
        first_call, connect = [], forkserver.connect_to_new_process
        def late(fds):
            if threading.current_thread().name == "parlab-forkserver-warm" and not first_call:
                first_call.append(time.sleep(0.5))
            return connect(fds)
        forkserver.connect_to_new_process = late
        server.warm()  # what a notebook's import of parlab.launch does
        first = forkserver._forkserver._forkserver_pid
        print(server.preload("wsgiref.simple_server"), server.preload("wsgiref.simple_server"))
        # not forked from the caller (two threads a rank): waits for the server
        waited = run(preloaded, 2, "wsgiref.simple_server", threads=2)
        names = [t.name for t in threading.enumerate()]
        print(list(direct), after_direct, list(waited), "torch._dynamo" in sys.modules,
              "parlab-import-while-waiting" in names, server.import_while_waiting())
        try:
            os.kill(first, 0)
            print("the first server still runs")
        except ProcessLookupError:
            print("gone")
        print(server.preload("xmlrpc.server"), list(run(preloaded, 1, "xmlrpc.server")))
        second = forkserver._forkserver._forkserver_pid
        print(second, "os._exit" in open(f"/proc/{second}/cmdline").read())
    """)
    *lines, last = out.splitlines()
    assert lines == ["True True", "[0, 1] False [True, True] True False None", "gone",
                     "False [False]"], out
    # the server leaves by os._exit once its caller is gone (apart.ending_at_once): this
    # Python's command has the shape that is wrapped, and the server still ends
    pid, wrapped = last.split()
    assert wrapped == "True", out
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{pid}") and "Z" not in _state(pid):
        assert time.monotonic() < deadline, f"the server {pid} outlived its caller by 30 s"
        time.sleep(0.05)


def _state(pid) -> str:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_only_the_servers_own_command_is_wrapped():
    other = ["python", "-c", "print(1)"]
    assert apart.ending_at_once(other) == other
    wrapped = apart.ending_at_once(["python", "-c", apart.SERVER_COMMAND + "3, 5, [])"])
    assert wrapped[:2] == ["python", "-c"] and "os._exit(" in wrapped[2]
    compile(wrapped[2], "<server>", "exec")  # still Python


def test_direct_fork_only_when_safe():
    assert not forking.direct_fork_safe("nccl", 1)
    assert not forking.direct_fork_safe("gloo", 2)  # OpenMP in a forked child can hang
    expected = sys.platform.startswith("linux") and not torch.cuda.is_available()
    assert forking.direct_fork_safe("gloo", 1) == expected


def test_no_direct_fork_where_a_forked_child_cannot_run_backward():
    """Where autograd's device threads run in the caller (a GPU machine after any backward;
    torch 2.11's CUDA build after a first backward under FakeTensorMode), a forked child's
    backward raises: the probe sees it and ranks come from the server. Simulated here by a
    child whose backward fails; then a real launch whose ranks run a backward."""
    out = _python("""
        import os, torch
        from parlab.launch import forking, run
        parent = os.getpid()
        real = torch.Tensor.backward
        def fails_in_a_child(self, *args, **kwargs):
            if os.getpid() != parent:
                raise RuntimeError("Unable to handle autograd's threading in combination with "
                                   "fork-based multiprocessing")
            return real(self, *args, **kwargs)
        torch.Tensor.backward = fails_in_a_child
        print(forking.direct_fork_safe("gloo", 1))
        torch.Tensor.backward = real
        print(forking.direct_fork_safe("gloo", 1))  # one probe a process: the answer stays

        def step():
            w = torch.ones(2, requires_grad=True)
            (w * 3).sum().backward()
            return os.getppid() == parent, w.grad.tolist()
        print(run(step, 2, threads=1))
    """)
    # the ranks' parent is the server, not the caller
    assert out.split() == ["False", "False", "[(False,", "[3.0,", "3.0]),", "(False,", "[3.0,",
                           "3.0])]"], out


class _Events:
    def __init__(self):
        self.callbacks = []

    def register(self, event, fn):
        self.callbacks.append((event, fn))

    def unregister(self, event, fn):
        self.callbacks.remove((event, fn))


def _fake_kernel(monkeypatch, kernel=True):
    shell = types.SimpleNamespace(kernel=object() if kernel else None, events=_Events())
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    started = []
    monkeypatch.setattr(server, "warm", lambda: started.append(1))
    return shell, started


def test_a_kernel_warms_while_its_import_cell_runs(monkeypatch):
    monkeypatch.setattr(server, "_preload", list(server._preload))
    monkeypatch.setattr(server, "_forkserver_ready", False)
    shell, started = _fake_kernel(monkeypatch)
    assert server.warm_in_notebook()
    assert started == [1]  # at once, not after the cell: the cell's own work overlaps it
    assert shell.events.callbacks == [] and "parlab.experiments" in server._preload


@pytest.mark.parametrize("where", ["terminal IPython", "torchrun or a rank"])
def test_no_warming_outside_a_notebook_kernel(monkeypatch, where):
    shell, started = _fake_kernel(monkeypatch, kernel=where == "torchrun or a rank")
    assert not server.warm_in_notebook(launches_here=where == "terminal IPython")
    assert shell.events.callbacks == [] and started == []


def test_a_real_kernel_is_warm_before_its_first_launch_and_exits_without_collecting(tmp_path):
    jupyter_client = pytest.importorskip("jupyter_client")
    env = env_with_parlab()
    manager, client = jupyter_client.manager.start_new_kernel(kernel_name="python3", env=env)
    try:
        def execute(code):
            reply = client.execute_interactive(code, timeout=120, output_hook=outputs.append)
            assert reply["content"]["status"] == "ok", outputs
        outputs = []
        # registered before parlab's own exit handler, so run after it (atexit: last in,
        # first out): at exit it finds the heap frozen, and the file left open is written
        exit_log, unclosed = tmp_path / "exit.txt", tmp_path / "unclosed.txt"
        execute(f"import atexit, gc\natexit.register(lambda: open({str(exit_log)!r}, 'w')"
                f".write(str(gc.get_freeze_count() > 0)))\n"
                f"left_open = open({str(unclosed)!r}, 'w')\nleft_open.write('flushed')")
        execute("import parlab.launch")
        # a first launch waits for the server: meanwhile the kernel imports what its optimizers
        # and figures will (torch._dynamo, matplotlib.pyplot), on a thread the launch joins
        names = ["torch._dynamo", "matplotlib.pyplot"]
        execute(f"import sys\nprint([n in sys.modules for n in {names}])\n"
                f"parlab.launch.run(int, 1)\nprint([n in sys.modules for n in {names}])")
        printed = [o["content"].get("text", "") for o in outputs if o["msg_type"] == "stream"]
        assert "".join(printed) == "[False, False]\n[True, True]\n", outputs
        outputs.clear()
        execute("import time\nfor _ in range(1200):\n    if parlab.launch.server.is_warm(): "
                "break\n    time.sleep(0.05)\nprint(parlab.launch.server.is_warm())")
        printed = [o["content"].get("text", "") for o in outputs if o["msg_type"] == "stream"]
        assert printed == ["True\n"], outputs
        # what the kernel signals and waits for when asked to shut down or restart: processes
        # of its own group. The server and multiprocessing's resource tracker are apart (the
        # tracker ignores SIGTERM and the dead server stays an unreaped zombie: the kernel
        # waited 2.5 s for its manager to kill it)
        outputs.clear()
        execute("import os, psutil\nprint(sorted(c.name() for c in psutil.Process()"
                ".children(recursive=True) if os.getpgid(c.pid) == os.getpgrp()))")
        printed = [o["content"].get("text", "") for o in outputs if o["msg_type"] == "stream"]
        assert printed == ["[]\n"], outputs
        kernel = manager.provisioner.process
        # a kernel that waits for parlab's processes never ends by itself; one that exits
        # normally may take over the default 2.5 s on a loaded machine (seen once in CI):
        # the manager waits up to 15 s before its SIGTERM
        manager.shutdown_wait_time = 30
        manager.shutdown_kernel(now=False)  # graceful, as JupyterLab's shutdown and restart
        # it ended by itself (0), not by the manager's SIGTERM (-15)
        assert kernel.wait(10) == 0, kernel.returncode
        # the heap was frozen before the handlers that collect it (kernel.py); the reader's
        # exit handler still ran, and the file the reader never closed was still flushed
        assert exit_log.read_text() == "True" and unclosed.read_text() == "flushed"
    finally:
        client.stop_channels()
        if manager.is_alive():
            manager.shutdown_kernel(now=True)


def test_preload_checks_a_name_without_importing_it_or_its_packages(monkeypatch):
    """A chapter preloads ``torch.distributed.tensor.parallel`` for its ranks; checking that
    the name exists must not import ``torch.distributed.tensor`` into the kernel (1 s)."""
    monkeypatch.setattr(server, "_forkserver_ready", True)  # checked, not added to a server
    monkeypatch.setattr(server, "_warming", [])  # (and no server of this process restarted)
    unused = [name for name in ("wsgiref", "xmlrpc") if name not in sys.modules]
    server.preload("wsgiref.simple_server", "xmlrpc.server", "os.path", "json.decoder")
    assert [name for name in unused if name in sys.modules] == []
    for typo in ("wsgiref.simple_srever", "wsgiref.simple_server.x", "nosuchpackage.x"):
        with pytest.raises(ModuleNotFoundError, match=f"no module named '{typo}'"):
            server.preload(typo)
