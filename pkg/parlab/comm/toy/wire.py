"""The wire the toy algorithms talk over: logged point-to-point messages, and how tensors are cut.

A :class:`Wire` sends and receives on an inner gloo (or NCCL) group and records every
logical transfer with the step of the algorithm it belongs to, once on the sender and once
on the receiver. At the end of a call it checks that the bytes it really moved equal the
bytes it logged, so the traffic log cannot drift from what happened. The algorithms
themselves are in :mod:`parlab.comm.toy.algorithms`.
"""

from __future__ import annotations

from typing import Callable

import torch

__all__ = ["Wire", "Message", "wait", "nbytes", "chunk_sizes", "piece_ranges", "PIECE_BYTES",
           "MAX_PIECES", "RING_BUFFERS", "TAG_BASE", "CONTROL_TAG"]

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
        self.record(step, self.rank, peer, nbytes(tensors))
        return [self.isend(t, peer, step, i) for i, t in enumerate(tensors) if t.numel()]

    def recv(self, tensors, peer: int, step: int) -> list:
        """Receive into a list of tensors from ``peer``: the counterpart of :meth:`send`."""
        self.record(step, peer, self.rank, nbytes(tensors))
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


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def chunk_sizes(numel: int, parts: int) -> list[int]:
    """How ``numel`` elements split into ``parts`` chunks, as torch.tensor_split does it."""
    base, extra = divmod(numel, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def piece_ranges(numel: int, itemsize: int) -> list[tuple[int, int]]:
    """Element ranges [a, b) of a chunk's pieces (sender and receiver cut alike)."""
    if numel == 0:
        return []
    count = max(1, min(MAX_PIECES, numel * itemsize // max(1, PIECE_BYTES)))
    step = -(-numel // count)
    return [(a, min(a + step, numel)) for a in range(0, numel, step)]


# --------------------------------------------------------------------------- ring
