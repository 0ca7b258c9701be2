"""A rank's traceback, seen from a notebook cell: the reader's cell and line, not the launcher.

fn travels to the ranks by value, and cloudpickle renames its code's file ``<dynamic-code>``;
the launcher ships the real names (and a cell's source, which only IPython's linecache holds)
so that the traceback reads as IPython's own: ``Cell In[2], line 4`` with the source line. The
frames of the launcher itself are hidden from IPython (``__tracebackhide__``).
"""
import re

import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from parlab.launch import RankError, run

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def shell():
    shell = InteractiveShell.instance()
    shell.run_cell("import torch.distributed as dist\nfrom parlab.launch import run")
    return shell


def test_a_ranks_traceback_names_the_cell_line_and_source(shell):
    define = shell.run_cell("def helper(x):\n    return 1 / x\n", store_history=True)  # a cell of its own
    helper_cell = define.execution_count
    with capture_output() as captured:
        result = shell.run_cell(
            "def fn():\n"
            "    rank = dist.get_rank()\n"
            "    # rank 1 divides by zero\n"
            "    return helper(rank - 1) if rank == 1 else rank\n"
            "\n"
            "run(fn, 2, timeout=60)\n", store_history=True)
    shown = _ANSI.sub("", captured.stdout)
    error = result.error_in_exec
    assert isinstance(error, RankError) and error.rank == 1
    cell = result.execution_count
    # the rank's frames: this cell's line 4, then the helper's cell, each with its source line
    assert (f"Cell In[{cell}], line 4, in fn\n    return helper(rank - 1) if rank == 1 else rank"
            in error.rank_traceback)
    assert f"Cell In[{helper_cell}], line 2, in helper\n    return 1 / x" in error.rank_traceback
    assert "<dynamic-code>" not in shown
    assert "parlab/launch/rank.py" not in error.rank_traceback  # the rank's own wrapper is left out
    # what the cell shows: its own line, then at most the one frame of run() that re-raises
    assert f"Cell In[{cell}], line 6" in shown
    assert cell == helper_cell + 1
    for launcher in ("_run_local", "_collect", "_raise_failure"):
        assert f"in {launcher}(" not in shown, shown
