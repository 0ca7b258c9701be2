"""Toy ring all-reduce against gloo's all_reduce: medians and their ratio, in one run.

    python benchmarks/collectives.py                  # 2 and 4 ranks; 1, 16, 64 MiB float32
    python benchmarks/collectives.py --ranks 2 --mib 16 --repeats 21
    python benchmarks/collectives.py --busy 2 --ranks 2 --mib 1 --rounds 5  # beside 2 busy
    python benchmarks/collectives.py --quick          # 2 ranks, 1/16 MiB, one repeat: a smoke run

Both backends run inside the same ranks: the world is a toy group and a gloo group over
the same ranks is created beside it, and the two are timed alternately, so a busy machine
slows both alike. One sample is the slowest rank's time for one call (a collective is done
when its last rank is done); a launch gives the median of its samples, and ``--rounds N``
the median over N launches. Bus bandwidth follows nccl-tests: algbw = bytes / time, busbw =
algbw x 2(n-1)/n for all-reduce.

``--busy N`` starts N processes that spin on the CPU for the whole measurement: a laptop that
runs something else beside the notebook. With more runnable processes than cores, each
message waits for its receiver to be scheduled, so an algorithm that needs many short
hand-offs falls behind one that needs few. Where the scheduler puts a launch's ranks then
decides much: on 2 cores beside 2 busy processes, 2 ranks that share a core took 2.3-5.7
ms per toy call and on separate cores 0.8-1.6 ms, and single launches gave toy/gloo from
0.4 to 2.7; hence the median over launches.

The ``p2p/gloo`` column is the same toy (the same ring, headers, checks and log) on a
second toy group whose messages go through gloo's point-to-point calls instead of shared
memory (``parlab.comm.toy.shm``: the toy's road between ranks of one machine). Each blocking
point-to-point wait from Python gives the core up for about a scheduler slice: beside two
busy processes one round trip of ``dist.send``/``dist.recv`` took 3.96 ms for 4 bytes (0.10
ms quiet), more than gloo's whole 1 MiB all_reduce (0.99 ms), and the toy on that road
measured about 10x gloo there. Measured on 2 cores (2026-11-27), toy/gloo and p2p/gloo:

    | ranks | MiB | quiet toy | quiet p2p | busy 2, median of 5 launches: toy | p2p |
    |-------|-----|-----------|-----------|-----------------------------------|-----|
    | 2     | 1   | 0.77      | 1.35      | 0.88                              | 2.30 |
    | 2     | 16  | 0.78      | 1.21      | 0.63                              | 1.08 |
    | 2     | 64  | 0.54      | 1.01      |                                   |      |
    | 4     | 1   | 0.76      | 1.26      | 0.78                              | 1.21 |
    | 4     | 16  | 1.06      | 1.27      | 1.03                              | 1.06 |
    | 4     | 64  | 0.84      | 1.00      |                                   |      |
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist

from parlab.comm import bus_bandwidth
from parlab.comm.toy import backend as toy_backend, shm as toy_shm, wire as toy_wire
from parlab.launch import run


def _time_both(sizes_mib, repeats, warmup, piece_kib):
    """On every rank: per size, per way, a list of this rank's seconds per call."""
    if piece_kib:
        toy_wire.PIECE_BYTES = piece_kib * 1024
    gloo = dist.new_group(backend="gloo")
    toy_shm.ENABLED = False  # a second toy group, on gloo's point-to-point calls
    over_p2p = dist.new_group(backend="toy")
    dist.barrier(group=over_p2p)
    toy_shm.ENABLED = True
    toy_backend.set_algorithm("ring")
    times = {}
    for mib in sizes_mib:
        tensor = torch.zeros(int(mib * 2**20) // 4)  # zeros: repeated sums never overflow
        samples = {"toy": [], "gloo": [], "p2p": []}
        for i in range(warmup + repeats):
            for name, group in (("toy", None), ("gloo", gloo), ("p2p", over_p2p)):
                dist.barrier(group=gloo)
                start = time.perf_counter()
                dist.all_reduce(tensor, group=group)
                if i >= warmup:
                    samples[name].append(time.perf_counter() - start)
        toy_backend.clear_transfers()
        times[mib] = samples
    return times


def measure(ranks, sizes_mib, repeats, warmup=2, piece_kib=None, rounds=1):
    """Rows of (ranks, MiB, gloo s, toy s, toy on p2p s, toy/gloo, p2p/gloo).

    One sample = the slowest rank's time for one call; a round = one launch (new ranks, so
    the scheduler places them anew), whose medians give its ratios. A row gives the median
    over rounds of each time and of each ratio."""
    per_round = []
    for _ in range(rounds):
        per_rank = run(_time_both, ranks, sizes_mib, repeats, warmup, piece_kib, backend="toy",
                       timeout=600)
        medians = {}
        for mib in sizes_mib:
            for name in ("gloo", "toy", "p2p"):
                slowest = [max(rank[mib][name][i] for rank in per_rank) for i in range(repeats)]
                medians[mib, name] = statistics.median(slowest)
        per_round.append(medians)
    rows = []
    for mib in sizes_mib:
        times = [statistics.median(m[mib, name] for m in per_round)
                 for name in ("gloo", "toy", "p2p")]
        ratios = [statistics.median(m[mib, name] / m[mib, "gloo"] for m in per_round)
                  for name in ("toy", "p2p")]
        rows.append((ranks, mib, *times, *ratios))
    return rows


@contextlib.contextmanager
def busy(processes: int):
    """``processes`` Python processes spinning on the CPU while the block runs."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(processes)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def table(rows) -> str:
    head = (f"{'ranks':>5} {'MiB':>6} {'gloo ms':>9} {'toy ms':>9} {'toy/gloo':>9} "
            f"{'p2p/gloo':>10} {'toy busbw GB/s':>15}")
    lines = [head, "-" * len(head)]
    for ranks, mib, gloo_s, toy_s, _, toy_ratio, p2p_ratio in rows:
        busbw = bus_bandwidth("all_reduce", mib * 2**20, toy_s, ranks) / 1e9
        lines.append(f"{ranks:>5} {mib:>6g} {gloo_s * 1e3:>9.2f} {toy_s * 1e3:>9.2f} "
                     f"{toy_ratio:>9.2f} {p2p_ratio:>10.2f} {busbw:>15.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--mib", type=float, nargs="+", default=[1, 16, 64],
                        help="tensor sizes in MiB (fractions allowed, e.g. 0.0625)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=1,
                        help="launches per row (medians over them); beside busy processes "
                             "a launch's ratio depends on where its ranks land: use 5 or more")
    parser.add_argument("--piece-kib", type=int, default=None,
                        help="smallest pipelined piece of the toy ring, in KiB "
                             "(default: toy_wire.PIECE_BYTES)")
    parser.add_argument("--busy", type=int, default=0, metavar="N",
                        help="measure beside N processes that keep a core busy each")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run in seconds: 2 ranks, 1/16 MiB, one repeat "
                             "(tests/test_benchmarks.py); its numbers mean nothing")
    args = parser.parse_args(argv)
    if args.quick:
        args.ranks, args.mib, args.repeats = [2], [1 / 16], 1
    rows = []
    with busy(args.busy):
        for ranks in args.ranks:
            rows += measure(ranks, args.mib, args.repeats, piece_kib=args.piece_kib,
                            rounds=args.rounds)
    if args.busy:
        print(f"beside {args.busy} busy process(es), median of {args.rounds} launch(es)")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
