"""The shared-memory wire itself: one ring buffer per ordered pair of ranks, in one mapped file.

Each pair (src, dst) owns a ring in the file :mod:`parlab.comm.toy.shm` sets up: the sender
copies a message in, the receiver copies it out, and each side publishes how far it got in a
counter the other reads. Stream format per ring: a 16-byte header (tag, payload bytes), then
the payload padded to 16 bytes; ``written`` and ``read`` count bytes since the start (free =
size - (written - read)). A message longer than the ring streams through it. Receives match
messages by (source, tag) in order; a message that arrives before its receive is posted is
kept aside.

Waiting (measured beside two busy processes on 2 cores, see benchmarks/collectives.py):
a rank polls for SPIN_SECONDS, unless its peer last ran on this rank's own core (then
polling only keeps the peer off it); then it naps 50 us between polls until NAP_SECONDS
(a nap gives the core away and wakes on its own core; ``sched_yield`` instead hands the core
to a busy process for a whole time slice: 4.8x gloo); then it sleeps until a peer rings its
doorbell, a named pipe (a wake-up from a peer tends to pull the sleeper onto the peer's
core, where the two then take turns).

The counters are published after the bytes with plain stores: on x86-64 other cores see
stores in program order (:mod:`parlab.comm.toy.shm` uses this wire there only).
"""

from __future__ import annotations

import collections
import ctypes
import os
import select
import threading
import time

import torch

from parlab.comm.toy.work import flat_view

__all__ = ["SharedMemoryWire", "file_bytes", "SPIN_SECONDS", "NAP_SECONDS"]

SPIN_SECONDS = 100e-6
NAP_SECONDS = 2e-3
_CONTROL = 128  # a ring's counters: written at byte 0, read at byte 64 (separate cache lines)
_HEADER = 16
_LINE = 64      # the file: rank 0's token (16 bytes), one line per rank (asleep flag, core),
                # then the rings


def _head(size: int) -> int:
    return _LINE * (1 + size)


def file_bytes(size: int, ring: int) -> int:
    """The shared file's size for ``size`` ranks with rings of ``ring`` bytes."""
    return _head(size) + size * (size - 1) * (_CONTROL + ring)


class _Message:
    """A send or a receive in progress; ``wait()`` drives this rank's rings until it is done."""

    __slots__ = ("wire", "peer", "tag", "data", "nbytes", "moved", "done", "header",
                 "write_back", "claimed")

    def __init__(self, wire, peer: int, tag: int, data: torch.Tensor, write_back=None):
        self.wire, self.peer, self.tag, self.data = wire, peer, tag, data
        self.write_back = write_back  # a receive into a non-contiguous tensor: copy it there
        self.nbytes, self.moved, self.done, self.header = data.numel(), 0, False, False
        self.claimed = None  # a message read aside: the receive posted while it arrived

    def wait(self, timeout=None) -> bool:
        self.wire.wait_for(self)
        return True

    def is_completed(self) -> bool:
        self.wire.progress()
        return self.done

    def finish(self) -> None:
        self.done = True
        if self.write_back is not None:
            self.write_back()


class SharedMemoryWire:
    """``send``/``recv`` like a gloo group's, over one ring buffer per ordered pair of ranks."""

    def __init__(self, mm, bells, rank: int, size: int, ring: int, timeout, pids):
        self._mm, self.rank, self.size, self._ring = mm, rank, size, ring
        self._bells, self._bell = bells, bells[rank]
        self._doorbell = select.poll()  # (poll, not select: any fd number, however many groups)
        self._doorbell.register(self._bell, select.POLLIN)
        self._fence = threading.Lock()
        # per rank, the counter index of its line: [0] asleep flag, [1] the core it last ran on
        self._line = [_LINE * (1 + p) // 8 for p in range(size)]
        self._timeout = getattr(timeout, "total_seconds", lambda: timeout)()
        self._pids = pids
        self._mem = torch.frombuffer(mm, dtype=torch.uint8)
        self._counters = memoryview(mm).cast("q")
        peers = [p for p in range(size) if p != rank]
        self._out = {p: self._region(rank, p) for p in peers}
        self._in = {p: self._region(p, rank) for p in peers}
        self._sending = {p: collections.deque() for p in peers}
        self._arriving = dict.fromkeys(peers)  # the message being read from each peer
        self._posted = collections.defaultdict(collections.deque)  # (src, tag): receives
        self._early = collections.defaultdict(collections.deque)   # (src, tag): arrived first

    def _region(self, src: int, dst: int) -> tuple[int, int]:
        """(counter index of ``written``, byte offset of the data) of the ring src -> dst."""
        pair = src * (self.size - 1) + (dst if dst < src else dst - 1)
        base = _head(self.size) + pair * (_CONTROL + self._ring)
        return base // 8, base + _CONTROL

    # -- what the toy's Wire calls
    def send(self, tensors, dst: int, tag: int) -> _Message:
        message = _Message(self, dst, tag, flat_view(tensors[0])[0].view(torch.uint8))
        self._sending[dst].append(message)
        self._push(dst)
        return message

    def recv(self, tensors, src: int, tag: int) -> _Message:
        flat, write_back = flat_view(tensors[0])
        message = _Message(self, src, tag, flat.view(torch.uint8), write_back)
        for peer in self._in if src is None else [src]:  # None: from any rank (first found)
            arriving = self._arriving[peer]
            if self._early[peer, tag]:
                message.peer = peer
                _check_size(message, self._early[peer, tag][0].numel())
                message.data.copy_(self._early[peer, tag].popleft())
                message.finish()
                return message
            if arriving and arriving.wire is None and arriving.tag == tag and not arriving.claimed:
                message.peer = peer
                _check_size(message, arriving.nbytes)
                arriving.claimed = message  # being read aside: handed over when complete
                return message
        self._posted[src, tag].append(message)
        return message

    def recv_anysource(self, tensors, tag: int) -> _Message:
        """Receive from whichever rank's message with ``tag`` comes first (``.peer`` says)."""
        return self.recv(tensors, None, tag)

    # -- moving bytes
    def progress(self) -> None:
        for peer, queue in self._sending.items():
            if queue:
                self._push(peer)
        for peer in self._in:
            self._pull(peer)

    def wait_for(self, message: _Message) -> None:
        """Poll, nap, then sleep until a peer rings this rank's doorbell (module docstring).

        A rank rings a peer's doorbell after it publishes bytes or frees room, if that peer
        has said it is asleep. Both sides store, fence, then load (the sleeper: its flag, then
        the rings; the other: a counter, then the flag), so at least one of them sees the
        other's store: no wake-up is lost."""
        polls, start, counters = 0, time.perf_counter(), self._counters
        here = counters[self._line[self.rank] + 1] = _cpu()
        # a peer last seen on this core cannot run while this rank polls: sleep at once
        peer = message.peer  # (None: a receive from any rank, not yet matched)
        spin = SPIN_SECONDS if peer is None or counters[self._line[peer] + 1] != here else 0.0
        while True:
            self.progress()
            if message.done:
                return
            polls += 1
            if polls % 16 == 0 and time.perf_counter() - start > spin:
                break
        while time.perf_counter() - start < NAP_SECONDS:
            time.sleep(50e-6)
            self.progress()
            if message.done:
                return
        flag = self._line[self.rank]  # asleep
        try:
            while True:
                counters[flag] = 1
                self._full_fence()
                self.progress()
                if message.done:
                    return
                if self._doorbell.poll(100):  # ms
                    _drain(self._bell)
                else:
                    self._check_alive(message, time.perf_counter() - start)
        finally:
            counters[flag] = 0

    def _full_fence(self) -> None:
        """A locked instruction (the lock's compare-and-swap): on x86-64 no load after it is
        done before the stores ahead of it are visible."""
        self._fence.acquire()
        self._fence.release()

    def _wake(self, peer: int) -> None:
        self._full_fence()
        if self._counters[self._line[peer]]:
            try:
                os.write(self._bells[peer], b"\0")
            except BlockingIOError:  # full: the peer has wake-ups pending already
                pass

    def __del__(self):
        for fd in getattr(self, "_bells", ()):
            os.close(fd)

    def _check_alive(self, message: _Message, waited: float) -> None:
        for peer, pid in enumerate(self._pids):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                raise RuntimeError(f"toy backend: rank {peer} of this group has exited") from None
            except PermissionError:
                pass
        if self._timeout and waited > self._timeout:
            peer = message.peer
            what = (f"send to rank {peer}" if peer is not None and message in self._sending[peer]
                    else "receive from " + ("any rank" if peer is None else f"rank {peer}"))
            raise RuntimeError(f"toy backend: rank {self.rank} waited {waited:.0f} s to "
                               f"{what} (tag {message.tag}); timeout {self._timeout:.0f} s")

    def _push(self, dst: int) -> None:
        at, base = self._out[dst]
        c, ring = self._counters, self._ring
        written = first = c[at]
        queue = self._sending[dst]
        while queue:
            free = ring - (written - c[at + 8])
            message = queue[0]
            if not message.header:
                if free < _HEADER:
                    break
                start = base + written % ring
                self._counters[start // 8] = message.tag
                self._counters[start // 8 + 1] = message.nbytes
                written, free, message.header = written + _HEADER, free - _HEADER, True
            padded = -(-message.nbytes // _HEADER) * _HEADER
            step = min(padded - message.moved, free)
            if step <= 0 and padded:
                break
            self._copy(message.data, message.moved, written, base, step, out=True)
            message.moved += step
            written += step
            if message.moved == padded:
                queue.popleft()
                message.done = True
            c[at] = written  # publish after the bytes (x86-64 keeps stores in order)
        if written != first:
            c[at] = written
            self._wake(dst)

    def _pull(self, src: int) -> None:
        at, base = self._in[src]
        c, ring = self._counters, self._ring
        read = first = c[at + 8]
        available = c[at] - read
        while available:
            message = self._arriving[src]
            if message is None:
                start = base + read % ring
                tag, nbytes = self._counters[start // 8], self._counters[start // 8 + 1]
                read, available = read + _HEADER, available - _HEADER
                message = self._match(src, tag, nbytes)
                self._arriving[src] = message
            padded = -(-message.nbytes // _HEADER) * _HEADER
            step = min(padded - message.moved, available)
            self._copy(message.data, message.moved, read, base, step, out=False)
            message.moved += step
            read, available = read + step, available - step
            c[at + 8] = read
            if message.moved == padded:
                self._arriving[src] = None
                self._complete(src, message)
        if read != first:  # room freed: a sender waiting for it may sleep
            c[at + 8] = read
            self._wake(src)

    def _match(self, src: int, tag: int, nbytes: int) -> _Message:
        posted = self._posted.get((src, tag)) or self._posted.get((None, tag))
        if posted:
            message = posted.popleft()
            message.peer = src  # (a receive from any rank learns which)
            _check_size(message, nbytes)
            return message
        return _Message(None, src, tag, torch.empty(nbytes, dtype=torch.uint8))  # read aside

    def _complete(self, src: int, message: _Message) -> None:
        if message.wire is self:
            message.finish()
        elif message.claimed is not None:  # read aside, claimed by a receive meanwhile
            message.claimed.data.copy_(message.data)
            message.claimed.finish()
        else:  # read aside: waits for its receive
            self._early[(src, message.tag)].append(message.data)

    def _copy(self, data, moved: int, position: int, base: int, step: int, out: bool) -> None:
        """Copy ``step`` stream bytes between ``data[moved:]`` and the ring at ``position``
        (padding past the data's end is skipped; the ring wraps around)."""
        real = max(0, min(step, data.numel() - moved))
        ring, mem = self._ring, self._mem
        while real:
            offset = position % ring
            n = min(real, ring - offset)
            ring_part, data_part = mem[base + offset:base + offset + n], data[moved:moved + n]
            (ring_part.copy_(data_part) if out else data_part.copy_(ring_part))
            real, moved, position = real - n, moved + n, position + n


def _check_size(message: _Message, nbytes: int) -> None:
    if nbytes != message.nbytes:
        raise RuntimeError(f"toy backend: rank {message.peer} sent {nbytes} bytes (tag "
                           f"{message.tag}) to a receive of {message.nbytes} bytes")


def _drain(fd: int) -> None:
    try:
        os.read(fd, 4096)
    except BlockingIOError:
        pass


try:
    _cpu = ctypes.CDLL(None).sched_getcpu  # which core this thread runs on (glibc, 0.2 us)
except (OSError, AttributeError):
    def _cpu() -> int:
        return -1
