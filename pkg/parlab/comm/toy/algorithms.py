"""The toy backend's collective algorithms, written as point-to-point transfers a reader can follow.

Each function below moves data for one collective on one rank, using only the sends and
receives of a :class:`Wire`. The wire numbers every logical transfer with the step of the
algorithm it belongs to and logs it (once on the sender, once on the receiver), so what
the algorithm *does* and what the traffic log *says* cannot drift apart: at the end of a
call the wire checks that the bytes it really moved equal the bytes it logged.

Algorithms (the textbook ones; ``n`` ranks, a tensor of ``b`` bytes):

- ``ring``: reduce-scatter then all-gather around the ring ``r -> r+1``; ``2(n-1)`` steps,
  each rank sends ``2(n-1)/n * b``. Chunks are cut into pieces and each piece is forwarded
  as soon as it is reduced, so the steps overlap in time (as in NCCL and gloo), although
  the log still numbers them as the textbook does.
- ``naive``: every rank sends its whole tensor to the root, which reduces and sends the
  result back; 2 steps, the root sends and receives ``(n-1) * b``.
- ``tree``: binomial tree: reduce towards the root in ``ceil(log2 n)`` steps, then
  broadcast back down in as many; every message is the whole tensor.

Rooted and personalised collectives (gather, scatter, all-to-all) have no ring form worth
teaching, so under ``ring`` they run the direct (``naive``) algorithm, and the log says so.
"""

from __future__ import annotations

import math

import torch

from parlab.comm.toy.wire import RING_BUFFERS, Wire, chunk_sizes, piece_ranges, wait

__all__ = [
    "ring_reduce_scatter", "ring_all_gather", "ring_all_gather_receives", "ring_broadcast",
    "naive_reduce", "naive_broadcast", "naive_gather", "naive_scatter",
    "tree_depth", "tree_reduce", "tree_broadcast", "tree_gather", "tree_scatter",
    "pairwise_all_to_all", "dissemination_barrier",
]



def ring_reduce_scatter(wire: Wire, inputs, out, combine, buffers, step0: int = 0) -> None:
    """Ring reduce-scatter: rank r ends with ``out = inputs[r]`` reduced over all ranks.

    ``inputs`` are this rank's ``n`` 1-D chunks (chunk i is destined to rank i); ``out``
    may be ``inputs[r]`` itself (in-place all-reduce). At step s rank r sends the partial
    sum of chunk ``r-s-1`` to ``r+1`` and receives chunk ``r-s-2`` from ``r-1``, adds its
    own share and forwards it at step s+1.

    Partial sums live in rotating scratch ``buffers`` (kept by the caller between calls:
    fresh large buffers cost page faults every time), so the inputs are never written.
    Receives are posted as early as a free buffer allows: a buffer is free once the send
    that read it has completed.
    """
    n, r = wire.size, wire.rank
    right, left = (r + 1) % n, (r - 1) % n
    if n == 1:
        if out.data_ptr() != inputs[0].data_ptr():
            out.copy_(inputs[0])
        return
    itemsize, depth = out.element_size(), len(buffers)
    chunk_sent_at = lambda s: (r - s - 1) % n  # noqa: E731
    recvs, sends = {}, {}

    def post_recvs_until(last):
        for s in range(len(recvs), min(last, n - 2) + 1):
            if s >= depth:  # buffer reused: the send that read it must be done
                wait(sends.pop(s - depth + 1, []))
            chunk = chunk_sent_at(s + 1)
            numel = inputs[chunk].numel()
            buf = buffers[s % depth][:numel]
            wire.record(step0 + s, left, r, numel * itemsize)
            recvs[s] = [wire.irecv(buf[a:b], left, step0 + s, k)
                        for k, (a, b) in enumerate(piece_ranges(numel, itemsize))]

    post_recvs_until(depth - 1)
    first = inputs[chunk_sent_at(0)]
    wire.record(step0, r, right, first.numel() * itemsize)
    sends[0] = [wire.isend(first[a:b], right, step0, k)
                for k, (a, b) in enumerate(piece_ranges(first.numel(), itemsize))]
    for s in range(n - 1):
        post_recvs_until(s + depth - 2)
        last = s == n - 2
        chunk = chunk_sent_at(s + 1)
        mine, buf = inputs[chunk], buffers[s % depth]
        if not last:
            wire.record(step0 + s + 1, r, right, mine.numel() * itemsize)
            sends[s + 1] = []
        for k, (a, b) in enumerate(piece_ranges(mine.numel(), itemsize)):
            recvs[s][k].wait()
            if last:
                combine(mine[a:b], buf[a:b], out[a:b])
            else:
                combine(mine[a:b], buf[a:b], buf[a:b])
                sends[s + 1].append(wire.isend(buf[a:b], right, step0 + s + 1, k))
    for works in sends.values():
        wait(works)


def ring_all_gather(wire: Wire, chunks, step0: int = 0, posted=None) -> None:
    """Ring all-gather: ``chunks[r]`` holds this rank's piece; afterwards every chunk is filled.

    At step s rank r forwards chunk ``r-s`` to ``r+1`` and receives chunk ``r-s-1`` from
    ``r-1``, straight into its final place: every receive can be posted at once, and each
    piece is passed on the moment it arrives. ``posted``: the receives, if the caller
    posted them earlier (:func:`ring_all_gather_receives`).
    """
    n, r = wire.size, wire.rank
    right, left = (r + 1) % n, (r - 1) % n
    if n == 1:
        return
    itemsize = chunks[r].element_size()
    recvs = posted or ring_all_gather_receives(wire, chunks, step0)
    for s in range(n - 1):
        wire.record(step0 + s, left, r, chunks[(r - s - 1) % n].numel() * itemsize)
    mine = chunks[r]
    wire.record(step0, r, right, mine.numel() * itemsize)
    for k, (a, b) in enumerate(piece_ranges(mine.numel(), itemsize)):
        wire.isend(mine[a:b], right, step0, k)
    for s in range(n - 2):
        chunk = chunks[(r - s - 1) % n]
        wire.record(step0 + s + 1, r, right, chunk.numel() * itemsize)
        for k, (a, b) in enumerate(piece_ranges(chunk.numel(), itemsize)):
            recvs[s][k].wait()
            wire.isend(chunk[a:b], right, step0 + s + 1, k)
    wait(recvs[-1])


def ring_all_gather_receives(wire: Wire, chunks, step0: int = 0) -> list:
    """Post a ring all-gather's receives (per step, per piece), to be logged by the gather.

    An all-reduce posts them before its reduce-scatter starts: gloo sends a message only
    once its receiver has asked for it, and a receive posted early saves that round trip.
    Safe, although they land in the chunks the reduce-scatter still reads: the final value
    of a chunk reaches this rank only after this rank has sent its own partial sum of it.
    """
    n, r = wire.size, wire.rank
    itemsize, left = chunks[r].element_size(), (r - 1) % n
    return [[wire.irecv(chunk[a:b], left, step0 + s, k)
             for k, (a, b) in enumerate(piece_ranges(chunk.numel(), itemsize))]
            for s in range(n - 1) for chunk in [chunks[(r - s - 1) % n]]]


def ring_broadcast(wire: Wire, flat, root: int) -> None:
    """Chain broadcast root -> root+1 -> ... ; hop h is step h, pieces are forwarded on arrival."""
    n, r = wire.size, wire.rank
    hop = (r - root) % n  # how far down the chain this rank is
    itemsize = flat.element_size()
    pieces = piece_ranges(flat.numel(), itemsize)
    if hop > 0:
        wire.record(hop - 1, (r - 1) % n, r, flat.numel() * itemsize)
        recvs = [wire.irecv(flat[a:b], (r - 1) % n, hop - 1, k) for k, (a, b) in enumerate(pieces)]
    if hop < n - 1:
        wire.record(hop, r, (r + 1) % n, flat.numel() * itemsize)
    for k, (a, b) in enumerate(pieces):
        if hop > 0:
            recvs[k].wait()
        if hop < n - 1:
            wire.isend(flat[a:b], (r + 1) % n, hop, k)


# --------------------------------------------------------------------------- naive (direct)


def naive_reduce(wire: Wire, mine, combine, root: int, step: int = 0, acc=None) -> None:
    """Everyone sends ``mine`` to ``root``; the root reduces in rank order into ``acc``."""
    n, r = wire.size, wire.rank
    if r != root:
        wire.send([mine], root, step)
        return
    others = [p for p in range(n) if p != root]
    received = {p: torch.empty_like(mine) for p in others}
    works = {p: wire.recv([received[p]], p, step) for p in others}
    if acc.data_ptr() != mine.data_ptr():
        acc.copy_(mine)
    for p in others:
        wait(works[p])
        combine(acc, received[p], acc)


def naive_broadcast(wire: Wire, tensors, root: int, step: int = 0) -> None:
    """The root sends ``tensors`` (one logical transfer) to every other rank directly."""
    n, r = wire.size, wire.rank
    if r == root:
        for p in range(n):
            if p != root:
                wire.send(tensors, p, step)
    else:
        wait(wire.recv(tensors, root, step))


def naive_gather(wire: Wire, blocks, root: int, step: int = 0) -> None:
    """Every rank sends ``blocks[r]`` to the root, which receives each into ``blocks[p]``."""
    n, r = wire.size, wire.rank
    if r == root:
        wait([m for p in range(n) if p != root for m in wire.recv([blocks[p]], p, step)])
    else:
        wire.send([blocks[r]], root, step)


def naive_scatter(wire: Wire, blocks, root: int, step: int = 0) -> None:
    """The root sends ``blocks[p]`` to each rank p, which receives it into ``blocks[p]``."""
    n, r = wire.size, wire.rank
    if r == root:
        for p in range(n):
            if p != root:
                wire.send([blocks[p]], p, step)
    else:
        wait(wire.recv([blocks[r]], root, step))


# --------------------------------------------------------------------------- binomial tree


def tree_depth(n: int) -> int:
    """Steps of a binomial tree over n ranks: ceil(log2 n)."""
    return math.ceil(math.log2(n)) if n > 1 else 0


def tree_reduce(wire: Wire, acc, combine, root: int, step0: int = 0) -> None:
    """Binomial reduce into ``acc`` (which starts as this rank's contribution).

    With v = rank - root: at step k a rank whose bit k is set sends its partial result to
    v - 2^k and is done; a rank that has v + 2^k below n receives and combines. The root
    ends with the full reduction after ceil(log2 n) steps.
    """
    n, r = wire.size, wire.rank
    v = (r - root) % n
    scratch = None
    for k in range(tree_depth(n)):
        mask = 1 << k
        if v & mask:
            wait(wire.send([acc], (v - mask + root) % n, step0 + k))
            return
        if v + mask < n:
            scratch = torch.empty_like(acc) if scratch is None else scratch
            wait(wire.recv([scratch], (v + mask + root) % n, step0 + k))
            combine(acc, scratch, acc)


def tree_broadcast(wire: Wire, tensors, root: int, step0: int = 0) -> None:
    """Binomial broadcast of ``tensors``: the set of ranks holding the data doubles every step."""
    n, r = wire.size, wire.rank
    v = (r - root) % n
    depth = tree_depth(n)
    for k in range(depth):
        mask = 1 << (depth - 1 - k)
        if v % (2 * mask) == 0 and v + mask < n:
            wire.send(tensors, (v + mask + root) % n, step0 + k)
        elif v % (2 * mask) == mask:
            wait(wire.recv(tensors, (v - mask + root) % n, step0 + k))


def tree_gather(wire: Wire, blocks, root: int, step0: int = 0) -> None:
    """Binomial gather: each subtree's blocks travel up as one message per step.

    ``blocks`` has one tensor per rank (in rank order); a rank forwards the blocks of the
    ranks v .. v+2^k-1 (relative to the root) that it collected so far.
    """
    n, r = wire.size, wire.rank
    v = (r - root) % n
    real = lambda u: (u + root) % n  # noqa: E731
    for k in range(tree_depth(n)):
        mask = 1 << k
        if v & mask:
            span = [blocks[real(u)] for u in range(v, min(v + mask, n))]
            wait(wire.send(span, real(v - mask), step0 + k))
            return
        if v + mask < n:
            span = [blocks[real(u)] for u in range(v + mask, min(v + 2 * mask, n))]
            wait(wire.recv(span, real(v + mask), step0 + k))


def tree_scatter(wire: Wire, blocks, root: int, step0: int = 0) -> None:
    """Binomial scatter, the gather run backwards: each step halves the blocks a holder keeps."""
    n, r = wire.size, wire.rank
    v = (r - root) % n
    real = lambda u: (u + root) % n  # noqa: E731
    depth = tree_depth(n)
    for k in range(depth):
        mask = 1 << (depth - 1 - k)
        if v % (2 * mask) == 0 and v + mask < n:
            span = [blocks[real(u)] for u in range(v + mask, min(v + 2 * mask, n))]
            wire.send(span, real(v + mask), step0 + k)
        elif v % (2 * mask) == mask:
            span = [blocks[real(u)] for u in range(v, min(v + mask, n))]
            wait(wire.recv(span, real(v - mask), step0 + k))


# --------------------------------------------------------------------------- others


def pairwise_all_to_all(wire: Wire, outputs, inputs) -> None:
    """All-to-all in n-1 steps: at step s-1, rank r sends ``inputs[r+s]`` and receives from r-s."""
    n, r = wire.size, wire.rank
    if outputs[r].data_ptr() != inputs[r].data_ptr():
        outputs[r].copy_(inputs[r])
    recvs = []
    for s in range(1, n):
        recvs += wire.recv([outputs[(r - s) % n]], (r - s) % n, s - 1)
        wire.send([inputs[(r + s) % n]], (r + s) % n, s - 1)
    wait(recvs)


def dissemination_barrier(wire: Wire) -> None:
    """Barrier in ceil(log2 n) rounds: in round k rank r signals r+2^k and waits for r-2^k.

    The messages are empty: a barrier moves no data, and the log shows 0 bytes.
    """
    n, r = wire.size, wire.rank
    token = torch.empty(0, dtype=torch.uint8)
    for k in range(tree_depth(n)):
        dist_k = 1 << k
        wire.record(k, r, (r + dist_k) % n, 0, keep_empty=True)
        wire.record(k, (r - dist_k) % n, r, 0, keep_empty=True)
        send = wire.isend(token, (r + dist_k) % n, k, 0)
        wire.irecv(torch.empty(0, dtype=torch.uint8), (r - dist_k) % n, k, 0).wait()
        send.wait()
