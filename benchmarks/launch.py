"""How long a launch takes: the first (starts the forkserver, imports torch) and later ones.

    python benchmarks/launch.py [--ranks 4] [--repeat 20]
    python benchmarks/launch.py --quick        # 2 ranks, one later launch: a smoke run

Prints the first launch's time and the median / min / max of the later ones, for gloo.
Timings depend on the machine; this is a measurement, never a test assertion.
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist

from parlab.launch import run


def _tiny_all_reduce():
    t = torch.ones(4)
    dist.all_reduce(t)
    return t.sum().item()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run in seconds: 2 ranks, one later launch "
                             "(tests/test_benchmarks.py); its numbers mean nothing")
    args = parser.parse_args(argv)
    if args.quick:
        args.ranks, args.repeat = 2, 1
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
