"""How long a launch takes: in a fresh process against torch's own import, then warm.

    python benchmarks/launch.py [--ranks 4] [--repeat 20] [--fresh 5]
    python benchmarks/launch.py --quick        # 2 ranks, one of each: a smoke run

First, whole fresh Python processes, alternating: one that only imports
``torch.distributed``, and one that imports parlab and runs ``run(fn, n)`` (one all-reduce);
the medians and their ratio (the project's budget: at most 1.4). Then, inside this process,
the first launch and the median / min / max of the later ones, for gloo. Timings depend on
the machine; this is a measurement, never a test assertion.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from parlab.launch import run


def _tiny_all_reduce():
    t = torch.ones(4)
    dist.all_reduce(t)
    return t.sum().item()


IMPORT_ONLY = "import torch.distributed"
FIRST_LAUNCH = """
import torch, torch.distributed as dist
from parlab.launch import run

def fn():
    t = torch.ones(4)
    dist.all_reduce(t)
    return t.sum().item()

assert run(fn, {ranks}) == [{ranks}.0 * 4] * {ranks}
"""


def fresh_processes(ranks: int, repeat: int) -> tuple[float, float]:
    """Medians of whole-process seconds: (import torch.distributed only, first launch)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1] / "pkg")]
                                        + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    times = {IMPORT_ONLY: [], FIRST_LAUNCH: []}
    for _ in range(repeat):
        for code in times:
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", code.format(ranks=ranks)], env=env, check=True)
            times[code].append(time.perf_counter() - start)
    return statistics.median(times[IMPORT_ONLY]), statistics.median(times[FIRST_LAUNCH])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--fresh", type=int, default=5,
                        help="fresh processes of each kind (alternating)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run in seconds: 2 ranks, one later launch "
                             "(tests/test_benchmarks.py); its numbers mean nothing")
    args = parser.parse_args(argv)
    if args.quick:
        args.ranks, args.repeat, args.fresh = 2, 1, 1
    torch_s, launch_s = fresh_processes(args.ranks, args.fresh)
    print(f"fresh process: import torch.distributed {torch_s:.2f} s; run(fn, {args.ranks}) "
          f"{launch_s:.2f} s; ratio {launch_s / torch_s:.2f} (median of {args.fresh} each)")
    start = time.perf_counter()
    run(_tiny_all_reduce, args.ranks)
    first = time.perf_counter() - start
    later = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        run(_tiny_all_reduce, args.ranks)
        later.append(time.perf_counter() - start)
    print(f"{args.ranks}-rank launch (gloo, one all_reduce): first {first:.3f} s; "
          f"later median {statistics.median(later):.3f} s "
          f"(min {min(later):.3f}, max {max(later):.3f}, n={len(later)})")


if __name__ == "__main__":
    main()
