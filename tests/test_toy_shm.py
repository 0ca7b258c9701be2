"""The toy backend's shared-memory wire (parlab.comm.toy.shm), message by message.

Two ranks connect a wire with 4 KiB rings, so every message below but the smallest streams
through its ring in pieces, and check what gloo's point-to-point calls guarantee: bytes
arrive intact whatever the order the receives are posted in, odd sizes and empty messages
pass, a receive into a non-contiguous tensor lands in place, a size mismatch is an error
naming both sizes, and the shared file is gone from the file system once connected. The
whole-collective checks against gloo (both wires) are in tests/test_toy_backend.py.
"""
import platform
import sys
import time

import pytest
import torch
import torch.distributed as dist

from parlab.comm.toy import backend as toy_backend, shm
from parlab.launch import run

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"),
    reason="the shared-memory wire is used on Linux x86-64 only (elsewhere: gloo's calls)")


def _expected(r, numel=100_000):
    return torch.arange(numel, dtype=torch.float64) * (r + 1)


def _wire_cases():
    r = dist.get_rank()
    peer = 1 - r
    shm.BUDGET_BYTES = 2 * 4096  # two rings of 4 KiB
    wire = shm.connect(dist.new_group(backend="gloo"), r, 2, 60)
    seen = {"wire": type(wire).__name__}
    # both ranks send 800 kB at once: each must keep draining while it waits for its send
    got = torch.empty(100_000, dtype=torch.float64)
    works = [wire.send([_expected(r)], peer, 1), wire.recv([got], peer, 1)]
    for work in works:
        work.wait()
    seen["both ways"] = torch.equal(got, _expected(peer))
    if r == 0:
        time.sleep(0.05)  # rank 1 waits on a receive from any rank before this one sends
        wire.send([torch.tensor([9.0])], 1, 9).wait()
        for work in [wire.send([torch.arange(5000, dtype=torch.int32)], 1, 2),
                     wire.send([torch.tensor([1, 2, 3], dtype=torch.uint8)], 1, 3),
                     wire.send([_expected(0, 10_000)], 1, 4),
                     wire.send([torch.arange(12.0).reshape(4, 3)], 1, 5),
                     wire.send([torch.empty(0)], 1, 6),
                     wire.send([torch.ones(2)], 1, 7)]:
            work.wait()
    else:
        anyone = torch.zeros(1)
        message = wire.recv_anysource([anyone], 9)
        message.wait()
        seen["from any"] = (message.peer, anyone.item())
        small, large = torch.zeros(3, dtype=torch.uint8), torch.zeros(5000, dtype=torch.int32)
        wire.recv([small], 0, 3).wait()  # tag 2 (20 kB) is read aside to reach tag 3
        wire.recv([large], 0, 2).wait()
        seen["out of order"] = (small.tolist(), torch.equal(large, torch.arange(5000,
                                                                                dtype=torch.int32)))
        while wire._arriving[0] is None:  # tag 4 starts arriving before its receive exists
            wire.progress()
        claimed = torch.zeros(10_000, dtype=torch.float64)
        wire.recv([claimed], 0, 4).wait()
        seen["claimed mid-way"] = torch.equal(claimed, _expected(0, 10_000))
        strided = torch.zeros(3, 4).t()  # 4 x 3, not contiguous
        wire.recv([strided], 0, 5).wait()
        seen["strided"] = torch.equal(strided, torch.arange(12.0).reshape(4, 3))
        empty = torch.empty(0)
        wire.recv([empty], 0, 6).wait()
        try:
            wire.recv([torch.zeros(4)], 0, 7).wait()
        except RuntimeError as error:
            seen["mismatch"] = str(error)
        wire._timeout = 0.3  # a receive that nothing answers: an error, not a hang
        try:
            wire.recv_anysource([torch.zeros(1)], 99).wait()
        except RuntimeError as error:
            seen["timeout"] = str(error)
    maps = open("/proc/self/maps").read().splitlines()
    seen["mapped files"] = sorted({line.split(None, 5)[-1] for line in maps
                                   if "parlab-toy-" in line})
    shm.ENABLED = False
    gloo = dist.new_group(backend="gloo")
    seen["disabled"] = shm.connect(gloo, r, 2, 60) is gloo  # the wire is gloo's own calls
    return seen


def test_messages_stream_through_small_rings_in_any_order():
    sender, receiver = run(_wire_cases, 2)
    assert sender["wire"] == receiver["wire"] == "SharedMemoryWire"
    assert sender["both ways"] and receiver["both ways"]
    assert receiver["from any"] == (0, 9.0)
    assert receiver["out of order"] == ([1, 2, 3], True)
    assert receiver["claimed mid-way"] and receiver["strided"]
    assert "rank 0 sent 8 bytes (tag 7) to a receive of 16 bytes" in receiver["mismatch"]
    assert "rank 1 waited 0 s to receive from any rank (tag 99); timeout 0 s" in receiver["timeout"]
    for seen in (sender, receiver):  # unlinked once every rank had it open
        assert seen["mapped files"] and all(f.endswith("(deleted)") for f in seen["mapped files"])
        assert seen["disabled"]


def _traffic(shared_memory):
    shm.ENABLED = shared_memory
    group = dist.new_group(backend="toy")
    toy_backend.clear_transfers()
    t = torch.arange(6.0) * (dist.get_rank() + 1)
    dist.all_reduce(t, group=group)
    with toy_backend.algorithm("tree"):
        dist.broadcast(t, 1, group=group)
    records = [(x.op, x.algorithm, x.step, x.src, x.dst, x.nbytes) for x in toy_backend.transfers()]
    # a user's messages on the same group: a ring of isend/irecv, then a receive from any rank
    r, n = dist.get_rank(), 3
    got = torch.zeros(2, dtype=torch.int64)
    works = [dist.isend(torch.tensor([r, 10 * r]), (r + 1) % n, group=group),
             dist.irecv(got, (r - 1) % n, group=group)]
    for work in works:
        work.wait()
    anyone = torch.zeros(1)
    if r == 0:
        sender = dist.recv(anyone, group=group, tag=5)
    else:
        sender = r
        if r == 2:
            dist.send(torch.tensor([2.5]), 0, group=group, tag=5)
    return t.tolist(), records, got.tolist(), (sender, anyone.item())


@pytest.mark.parametrize("shared_memory", [True, False])
def test_the_wire_changes_no_result_and_no_logged_message(shared_memory):
    """The same calls on either wire: sums equal the single-process sum, the log equals the
    messages a 3-rank ring and tree must send (counted here, not by the toy), and a user's
    sends and receives (one from any rank) arrive."""
    results = run(_traffic, 3, shared_memory, backend="toy")
    assert all(res[0] == (torch.arange(6.0) * 6).tolist() for res in results)
    assert [res[2] for res in results] == [[2, 20], [0, 0], [1, 10]]
    assert results[0][3] == (2, 2.5)  # recv without a source: rank 2's message, and who sent
    # ring all-reduce of 6 floats on 3 ranks: 2 reduce-scatter + 2 all-gather steps, each
    # rank sends one 8-byte chunk per step; tree broadcast from rank 1: 2 sends of 24 bytes
    sent = [rec for rank, res in enumerate(results) for rec in res[1] if rec[3] == rank]
    ring = [rec for rec in sent if rec[0] == "all_reduce"]
    tree = [rec for rec in sent if rec[0] == "broadcast"]
    assert len(ring) == 3 * 4 and {rec[5] for rec in ring} == {8}
    assert len(tree) == 2 and {rec[5] for rec in tree} == {24}


def _doorbells_missing_on_rank_1():
    r = dist.get_rank()
    if r == 1:  # this rank finds the shared file but cannot open the doorbells beside it
        real = shm._bells
        shm._bells = lambda path, size: [f"{bell}.missing" for bell in real(path, size)]
    group = dist.new_group(backend="gloo")
    return shm.connect(group, r, 2, 60) is group


def test_a_rank_that_cannot_open_its_doorbells_sends_every_rank_over_gloo():
    assert run(_doorbells_missing_on_rank_1, 2) == [True, True]
