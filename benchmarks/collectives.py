"""Toy ring all-reduce against gloo's all_reduce: medians and their ratio, in one run.

    python benchmarks/collectives.py                  # 2 and 4 ranks; 1, 16, 64 MiB float32
    python benchmarks/collectives.py --ranks 2 --mib 16 --repeats 21
    python benchmarks/collectives.py --busy 2 --ranks 2 --mib 1   # beside 2 busy processes
    python benchmarks/collectives.py --quick          # 2 ranks, 1/16 MiB, one repeat: a smoke run

Both backends run inside the same ranks: the world is a toy group and a gloo group over
the same ranks is created beside it, and the two are timed alternately, so a busy machine
slows both alike. One sample is the slowest rank's time for one call (a collective is done
when its last rank is done); the table shows the median of the samples. Bus bandwidth
follows nccl-tests: algbw = bytes / time, busbw = algbw x 2(n-1)/n for all-reduce.

``--busy N`` starts N processes that spin on the CPU for the whole measurement: a laptop that
runs something else beside the notebook. With more runnable processes than cores, each
message waits for its receiver to be scheduled, so an algorithm that needs many short
hand-offs falls behind one that needs few.

The ``bare/gloo`` column times the toy's own ring (the same functions, the same messages)
on plain gloo sends, without what a toy call adds around it: the header exchange and
checks, the traffic log and the process group's entry. It answers where the toy's time
goes when the machine is busy. Measured on 2 cores, 2 ranks, 1 MiB: quiet, toy 2.0x gloo
and bare 1.35x; beside two busy processes, toy 2.6-3.6x and bare 1.9-3.0x. So most of the
gap is the ring itself driven from Python: every piece is a send, a wait and an add on the
rank's main thread, and each wait hands the core to a spinner, which must give it back
before the next step (strace shows the main thread blocked on gloo's pair lock while
gloo's own thread reads). Gloo runs its whole ring in C++ on its own threads and waits
once. The header exchange adds one more round trip per call.

The floor under that, measured on 2 cores beside two busy processes (2026-11-27): one
round trip of gloo's own point-to-point ``dist.send``/``dist.recv`` between two ranks,
called from Python, takes 3.96 ms for 4 bytes (0.10 ms quiet), while gloo's whole
``all_reduce`` of 1 MiB takes 0.99 ms (3.0 ms quiet) and of 4 bytes 0.17 ms. Each blocking
point-to-point wait gives up the core for about a scheduler slice; gloo's collectives do
not pay that. So any algorithm driven from Python over gloo's point-to-point calls, with at
least one exchange that waits on another, stays several times gloo's time on a busy
machine, however few its messages; and gloo's send and receive works cannot be polled
instead (``is_completed()`` stays False until ``wait()``: a loop on it never ends).
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
from parlab.comm.toy import (
    algorithms as toy_algorithms, backend as toy_backend, wire as toy_wire, work as toy_work
)
from parlab.launch import run


def _bare_ring(tensor, group, call):
    """The toy's ring all-reduce on plain gloo sends: its algorithm without the call's header
    exchange, checks, traffic log and process-group entry (what those cost, by difference)."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    wire = toy_wire.Wire(group, r, n, call, lambda *record: None)
    chunks = list(tensor.tensor_split(n))
    buffers = [torch.empty_like(chunks[0]) for _ in range(min(toy_wire.RING_BUFFERS, n - 1))]
    early = toy_algorithms.ring_all_gather_receives(wire, chunks, step0=n - 1)
    toy_algorithms.ring_reduce_scatter(wire, chunks, chunks[r], toy_work.combiner("SUM"),
                                       buffers)
    toy_algorithms.ring_all_gather(wire, chunks, step0=n - 1, posted=early)
    wire.finish()


def _time_both(sizes_mib, repeats, warmup, piece_kib):
    """On every rank: per size, per way, a list of this rank's seconds per call."""
    if piece_kib:
        toy_wire.PIECE_BYTES = piece_kib * 1024
    gloo = dist.new_group(backend="gloo")
    plain = dist.new_group(backend="gloo")  # the bare ring's own sends
    toy_backend.set_algorithm("ring")
    times = {}
    for mib in sizes_mib:
        tensor = torch.zeros(int(mib * 2**20) // 4)  # zeros: repeated sums never overflow
        samples = {"toy": [], "gloo": [], "bare": []}
        for i in range(warmup + repeats):
            for name, group in (("toy", None), ("gloo", gloo), ("bare", plain)):
                dist.barrier(group=gloo)
                start = time.perf_counter()
                if name == "bare":
                    _bare_ring(tensor, plain, i)
                else:
                    dist.all_reduce(tensor, group=group)
                if i >= warmup:
                    samples[name].append(time.perf_counter() - start)
        toy_backend.clear_transfers()
        times[mib] = samples
    return times


def measure(ranks, sizes_mib, repeats, warmup=2, piece_kib=None):
    """Rows of (ranks, MiB, gloo, toy, bare ring median s); one sample = the slowest rank's time."""
    per_rank = run(_time_both, ranks, sizes_mib, repeats, warmup, piece_kib, backend="toy",
                   timeout=600)
    rows = []
    for mib in sizes_mib:
        medians = {}
        for name in ("gloo", "toy", "bare"):
            slowest = [max(rank[mib][name][i] for rank in per_rank) for i in range(repeats)]
            medians[name] = statistics.median(slowest)
        rows.append((ranks, mib, medians["gloo"], medians["toy"], medians["bare"]))
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
            f"{'bare/gloo':>10} {'toy busbw GB/s':>15}")
    lines = [head, "-" * len(head)]
    for ranks, mib, gloo_s, toy_s, bare_s in rows:
        busbw = bus_bandwidth("all_reduce", mib * 2**20, toy_s, ranks) / 1e9
        lines.append(f"{ranks:>5} {mib:>6g} {gloo_s * 1e3:>9.2f} {toy_s * 1e3:>9.2f} "
                     f"{toy_s / gloo_s:>9.2f} {bare_s / gloo_s:>10.2f} {busbw:>15.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--mib", type=float, nargs="+", default=[1, 16, 64],
                        help="tensor sizes in MiB (fractions allowed, e.g. 0.0625)")
    parser.add_argument("--repeats", type=int, default=15)
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
            rows += measure(ranks, args.mib, args.repeats, piece_kib=args.piece_kib)
    if args.busy:
        print(f"beside {args.busy} busy process(es)")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
