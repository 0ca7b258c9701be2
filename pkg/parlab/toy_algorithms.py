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
from typing import Callable

import torch

__all__ = [
    "Wire", "Message", "chunk_sizes", "ring_reduce_scatter", "ring_all_gather", "ring_broadcast",
    "naive_reduce", "naive_broadcast", "naive_gather", "naive_scatter",
    "tree_reduce", "tree_broadcast", "tree_gather", "tree_scatter",
    "pairwise_all_to_all", "dissemination_barrier", "PIECE_BYTES", "MAX_PIECES", "RING_BUFFERS",
]

#: Pipelining: a chunk travels in pieces, so that one piece can be reduced and forwarded
#: while the next is still on the wire; a piece is at least PIECE_BYTES and a chunk is
#: cut into at most MAX_PIECES (every message costs a little, so fewer, larger ones win
#: once there is enough to overlap; gloo's own ring uses two segments per chunk).
PIECE_BYTES = 1 << 20
MAX_PIECES = 4
#: Scratch buffers of a ring reduce-scatter: more let receives be posted earlier.
RING_BUFFERS = 3
#: Tags at or above this value are the backend's own; a user's send/recv tag must be below.
TAG_BASE = 1 << 30
#: The tag of the headers ranks exchange before each collective (see toy_checks); data
#: messages use the tags between TAG_BASE and this one.
CONTROL_TAG = TAG_BASE + (1 << 29)


class Wire:
    """The point-to-point traffic of one collective call on one rank.

    Contract of the algorithm functions below: they return once this rank's received
    data is in place; their sends may still be in flight until :meth:`finish`.

    ``transport`` is the inner process group that really moves bytes (gloo for CPU
    tensors); ``rank``/``size`` are this rank's place in the group; ``call`` numbers the
    group's collectives (for the tags); ``log(step, src, dst, nbytes)`` is called once per
    logical transfer, on the sender and on the receiver.
    """

    def __init__(self, transport, rank: int, size: int, call: int, log: Callable):
        self.transport, self.rank, self.size = transport, rank, size
        self.call = call
        self._log = log
        self._pending = []
        self._moved = {"sent": 0, "received": 0}
        self._logged = {"sent": 0, "received": 0}

    # -- logical transfers: logged once per message, then moved (possibly in pieces)
    def record(self, step: int, src: int, dst: int, nbytes: int, keep_empty: bool = False) -> None:
        """Log one logical transfer (this rank is its sender or its receiver).

        Empty transfers (an empty chunk when a tensor has fewer elements than ranks) are
        not messages at all and are left out, unless ``keep_empty`` (a barrier's signals).
        """
        if nbytes == 0 and not keep_empty:
            return
        self._logged["sent" if src == self.rank else "received"] += nbytes
        self._log(step, src, dst, nbytes)

    def send(self, tensors, peer: int, step: int) -> list:
        """Send a list of tensors to ``peer`` as one logical transfer of ``step``."""
        self.record(step, self.rank, peer, _nbytes(tensors))
        return [self.isend(t, peer, step, i) for i, t in enumerate(tensors) if t.numel()]

    def recv(self, tensors, peer: int, step: int) -> list:
        """Receive into a list of tensors from ``peer``: the counterpart of :meth:`send`."""
        self.record(step, peer, self.rank, _nbytes(tensors))
        return [self.irecv(t, peer, step, i) for i, t in enumerate(tensors) if t.numel()]

    # -- raw messages: not logged (their logical transfer was), only counted
    def isend(self, tensor: torch.Tensor, peer: int, step: int, index: int) -> Message:
        self._moved["sent"] += tensor.numel() * tensor.element_size()
        return self._track(self.transport.send([tensor], peer, self._tag(step, index)))

    def irecv(self, tensor: torch.Tensor, peer: int, step: int, index: int) -> Message:
        self._moved["received"] += tensor.numel() * tensor.element_size()
        return self._track(self.transport.recv([tensor], peer, self._tag(step, index)))

    def _track(self, work) -> Message:
        message = Message(work)
        self._pending.append(message)
        return message

    def _tag(self, step: int, index: int) -> int:
        # Sender and receiver derive the same tag from (call, step, index), so a message
        # can only land in the buffer meant for it, even with many in flight.
        return TAG_BASE + ((self.call & 0x7F) << 22) + ((step & 0x7FF) << 11) + (index & 0x7FF)

    def finish(self) -> None:
        """Wait for every message of this call, then check that moved bytes equal logged bytes."""
        wait(self._pending)
        self._pending = []
        if self._moved != self._logged:
            raise AssertionError(f"toy backend bug: moved {self._moved} but logged {self._logged}")


class Message:
    """One message in flight. Waiting twice is safe (a gloo work must be waited on only once:
    a second wait would wait for a message that never comes)."""

    __slots__ = ("_work",)

    def __init__(self, work):
        self._work = work

    def wait(self) -> None:
        if self._work is not None:
            self._work.wait()
            self._work = None


def wait(messages) -> None:
    for message in messages:
        message.wait()


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def chunk_sizes(numel: int, parts: int) -> list[int]:
    """How ``numel`` elements split into ``parts`` chunks, as torch.tensor_split does it."""
    base, extra = divmod(numel, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _pieces(numel: int, itemsize: int) -> list[tuple[int, int]]:
    """Element ranges [a, b) of a chunk's pieces (sender and receiver cut alike)."""
    if numel == 0:
        return []
    count = max(1, min(MAX_PIECES, numel * itemsize // max(1, PIECE_BYTES)))
    step = -(-numel // count)
    return [(a, min(a + step, numel)) for a in range(0, numel, step)]


# --------------------------------------------------------------------------- ring


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
                        for k, (a, b) in enumerate(_pieces(numel, itemsize))]

    post_recvs_until(depth - 1)
    first = inputs[chunk_sent_at(0)]
    wire.record(step0, r, right, first.numel() * itemsize)
    sends[0] = [wire.isend(first[a:b], right, step0, k)
                for k, (a, b) in enumerate(_pieces(first.numel(), itemsize))]
    for s in range(n - 1):
        post_recvs_until(s + depth - 2)
        last = s == n - 2
        chunk = chunk_sent_at(s + 1)
        mine, buf = inputs[chunk], buffers[s % depth]
        if not last:
            wire.record(step0 + s + 1, r, right, mine.numel() * itemsize)
            sends[s + 1] = []
        for k, (a, b) in enumerate(_pieces(mine.numel(), itemsize)):
            recvs[s][k].wait()
            if last:
                combine(mine[a:b], buf[a:b], out[a:b])
            else:
                combine(mine[a:b], buf[a:b], buf[a:b])
                sends[s + 1].append(wire.isend(buf[a:b], right, step0 + s + 1, k))
    for works in sends.values():
        wait(works)


def ring_all_gather(wire: Wire, chunks, step0: int = 0) -> None:
    """Ring all-gather: ``chunks[r]`` holds this rank's piece; afterwards every chunk is filled.

    At step s rank r forwards chunk ``r-s`` to ``r+1`` and receives chunk ``r-s-1`` from
    ``r-1``, straight into its final place: every receive can be posted at once, and each
    piece is passed on the moment it arrives.
    """
    n, r = wire.size, wire.rank
    right, left = (r + 1) % n, (r - 1) % n
    if n == 1:
        return
    itemsize = chunks[r].element_size()
    recvs = []
    for s in range(n - 1):
        chunk = chunks[(r - s - 1) % n]
        wire.record(step0 + s, left, r, chunk.numel() * itemsize)
        recvs.append([wire.irecv(chunk[a:b], left, step0 + s, k)
                      for k, (a, b) in enumerate(_pieces(chunk.numel(), itemsize))])
    mine = chunks[r]
    wire.record(step0, r, right, mine.numel() * itemsize)
    for k, (a, b) in enumerate(_pieces(mine.numel(), itemsize)):
        wire.isend(mine[a:b], right, step0, k)
    for s in range(n - 2):
        chunk = chunks[(r - s - 1) % n]
        wire.record(step0 + s + 1, r, right, chunk.numel() * itemsize)
        for k, (a, b) in enumerate(_pieces(chunk.numel(), itemsize)):
            recvs[s][k].wait()
            wire.isend(chunk[a:b], right, step0 + s + 1, k)
    wait(recvs[-1])


def ring_broadcast(wire: Wire, flat, root: int) -> None:
    """Chain broadcast root -> root+1 -> ... ; hop h is step h, pieces are forwarded on arrival."""
    n, r = wire.size, wire.rank
    hop = (r - root) % n  # how far down the chain this rank is
    itemsize = flat.element_size()
    pieces = _pieces(flat.numel(), itemsize)
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
