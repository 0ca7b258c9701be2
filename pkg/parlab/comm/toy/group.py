"""ToyProcessGroup: what torch.distributed calls, turned into :mod:`parlab.comm.toy.algorithms`.

torch.distributed hands a process group calls such as ``allreduce(tensors, opts)``; this
class checks each call against the other ranks' (:mod:`parlab.comm.toy.checks`), cuts the
tensors into the blocks an algorithm works on, runs the algorithm the reader chose over
a :class:`~parlab.comm.toy.wire.Wire`, and writes every message into this process's log.
The user-facing switches (algorithm, labels, the log) are in :mod:`parlab.comm.toy.backend`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (AllreduceOptions, BroadcastOptions, GatherOptions,
                                        PrefixStore, ProcessGroupGloo, ReduceOptions,
                                        ReduceScatterOptions, ScatterOptions)

from parlab.comm.toy import algorithms as alg, checks, shm
from parlab.comm.toy.checks import EFFECTIVE, ToyMismatchError
from parlab.comm.toy.state import STATE, ToyOptions, valid
from parlab.comm.toy.wire import CONTROL_TAG, RING_BUFFERS, TAG_BASE, Wire
from parlab.comm.toy.work import (
    StagedRecvWork, as_work, average, collective, combiner, done, flat_view, nccl_usable,
    reduce_op_name, relay_blocks, split_rows
)
from parlab.comm.traffic import Transfer

__all__ = ["ToyProcessGroup"]


class ToyProcessGroup(dist.ProcessGroup):
    """A torch.distributed process group whose collectives are :mod:`parlab.comm.toy.algorithms`."""

    def __init__(self, store, rank: int, size: int, timeout, global_ranks=(), name: str = "",
                 options: ToyOptions | None = None):
        super().__init__(rank, size)
        self._rank, self._size = rank, size  # (plain attributes: read on every call)
        options = options or ToyOptions()
        self._algorithm = valid(options.algorithm) if options.algorithm else None
        self._label = options.label
        self._global = list(global_ranks) or list(range(size))
        self._is_world = not global_ranks
        self._store, self._timeout = store, timeout
        self._group_name = name  # torch sets the same name again once the group is made
        self._gloo = ProcessGroupGloo(PrefixStore("toy/gloo/", store), rank, size, timeout)
        self._nccl = None
        # every rank makes the group together: the road for CPU messages, also for a user's
        self._cpu = shm.connect(self._gloo, rank, size, timeout)  # shared memory, or gloo
        self._calls = 0       # collectives so far (every rank of the group agrees)
        self._shown_from = 0  # the call logged as 0 (see clear_transfers)
        self._pairs, self._scratch = {}, {}  # p2p messages per (src, dst); reused buffers
        self._next_headers: dict = {}  # receives posted for the next call's headers
        STATE.groups.add(self)

    def getBackendName(self) -> str:
        return "toy"

    # ------------------------------------------------------------------ the group's name
    # torch.distributed names every group it makes and registers it under that name;
    # DeviceMesh reads ``group.group_name``, and the functional collectives (what DTensor
    # issues) find the group by name in C++. A plain ProcessGroup keeps its name in its
    # backends; this group has none (it *is* the backend), so without these two methods
    # (PyTorch's PyProcessGroup trampoline routes them here) the name is lost.
    def getGroupName(self) -> str:
        if not self._group_name:
            raise RuntimeError("ProcessGroup name not set: create toy groups with "
                               "dist.init_process_group or dist.new_group(backend='toy')")
        return self._group_name

    def setGroupName(self, name: str) -> None:
        self._group_name = str(name)

    def __repr__(self) -> str:
        return f"ToyProcessGroup(rank {self._rank} of {self._size}, label {self.label!r})"

    @property
    def label(self) -> str:
        """The name this group's records carry: set_label / ToyOptions / group_desc / default."""
        if self._label:
            return self._label
        desc = getattr(self, "group_desc", "")
        if desc and desc not in ("undefined", "default_pg"):
            return desc
        return "world" if self._is_world else "ranks " + ",".join(map(str, self._global))

    # ------------------------------------------------------------------ plumbing
    def _transport(self, tensor: torch.Tensor):
        if tensor.device.type == "cpu":
            return self._cpu
        if self._nccl is None:  # only reached when NCCL is usable (see toy_work.collective)
            from torch.distributed import ProcessGroupNCCL
            self._nccl = ProcessGroupNCCL(PrefixStore("toy/nccl/", self._store), self._rank,
                                          self._size, ProcessGroupNCCL.Options())
        return self._nccl

    def _begin(self, op: str, tensors, reduce_op: str = "", root: int = 0, **shape):
        """Check the call against every rank's, then open a wire for its transfers.

        Every rank gets every rank's header (control messages, not logged) and applies the
        same rules, so a bad call raises the same error on every rank instead of leaving
        some waiting. ``self._rows`` keeps the table (a tree gather needs others' sizes).
        """
        name = STATE.algorithm_for(self) if op != "barrier" else "ring"
        call, self._calls = self._calls, self._calls + 1
        header = checks.Header(self._size, op, name, checks.dtype_code(tensors), reduce_op,
                               root, call, **shape).tensor()
        self._rows = checks.parse([row.tolist() for row in self._exchange(header)], self._size)
        if problem := checks.verdict(op, self._rows, self._size):
            raise ToyMismatchError(problem)
        if reduce_op:
            checks.check_reduce_op(reduce_op, tensors[0].dtype)
        used = EFFECTIVE.get(op, {}).get(name, name)
        transport = self._transport(tensors[0]) if tensors else self._cpu

        def log(step, src, dst, nbytes):
            STATE.log.append(Transfer(op, used, step, self._global[src], self._global[dst],
                                      nbytes, self.label, call - self._shown_from))
        return Wire(transport, self._rank, self._size, call, log), used

    def _exchange(self, header: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's header: each rank sends its own straight to every other rank.

        Direct messages take one hop where an allgather takes n-1 in a row; the next call's
        receives are posted as soon as this call's arrive (gloo sends once a receive waits).
        All headers share one tag: between two ranks, the k-th header sent meets the k-th
        expected, so ranks out of step learn it (the check says so).
        """
        n, r = self._size, self._rank
        table = self._next_headers or self._post_header_recvs(header)
        sends = [self._cpu.send([header], p, CONTROL_TAG) for p in range(n) if p != r]
        for _, work in table.values():
            work.wait()
        self._next_headers = self._post_header_recvs(header)
        for work in sends:
            work.wait()
        return [header if p == r else table[p][0] for p in range(n)]

    def _post_header_recvs(self, like: torch.Tensor) -> dict:
        bufs = {p: torch.empty_like(like) for p in range(self._size) if p != self._rank}
        return {p: (buf, self._cpu.recv([buf], p, CONTROL_TAG)) for p, buf in bufs.items()}

    def _buffer(self, slot: int, numel: int, like: torch.Tensor) -> torch.Tensor:
        """Scratch memory reused across calls (fresh large buffers cost page faults each time)."""
        key = (slot, like.dtype, like.device)
        buf = self._scratch.get(key)
        if buf is None or buf.numel() < numel:
            buf = self._scratch[key] = torch.empty(numel, dtype=like.dtype, device=like.device)
        return buf[:numel]

    # ------------------------------------------------------------------ collectives
    @collective
    def allreduce(self, tensors, opts=None):
        op = reduce_op_name((opts or AllreduceOptions()).reduceOp)
        for tensor in tensors:
            self._all_reduce(tensor, op)
        return done(tensors)

    allreduce_coalesced = allreduce

    def _all_reduce(self, tensor, op):
        wire, used = self._begin("all_reduce", [tensor], op, numel_in=tensor.numel())
        flat, write_back = flat_view(tensor)
        n, r, combine = self._size, self._rank, combiner(op)
        if used == "ring":
            chunks = list(flat.tensor_split(n))
            early = alg.ring_all_gather_receives(wire, chunks, step0=n - 1)
            alg.ring_reduce_scatter(wire, chunks, chunks[r], combine, self._ring_buffers(chunks))
            average(op, chunks[r], n)
            alg.ring_all_gather(wire, chunks, step0=n - 1, posted=early)
        elif used == "naive":
            alg.naive_reduce(wire, flat, combine, root=0, step=0, acc=flat)
            average(op, flat, n if r == 0 else 1)
            alg.naive_broadcast(wire, [flat], root=0, step=1)
        else:
            alg.tree_reduce(wire, flat, combine, root=0)
            average(op, flat, n if r == 0 else 1)
            alg.tree_broadcast(wire, [flat], root=0, step0=alg.tree_depth(n))
        wire.finish()
        write_back()

    def _ring_buffers(self, chunks):
        """Scratch for a ring reduce-scatter: up to RING_BUFFERS chunks of partial sums."""
        biggest = max(c.numel() for c in chunks)
        return [self._buffer(i, biggest, chunks[0])
                for i in range(min(RING_BUFFERS, len(chunks) - 1))]

    @collective
    def broadcast(self, tensors, opts=None):
        root = (opts or BroadcastOptions()).rootRank
        for tensor in tensors:
            wire, used = self._begin("broadcast", [tensor], root=root, numel_in=tensor.numel())
            flat, write_back = flat_view(tensor)
            if used == "ring":
                alg.ring_broadcast(wire, flat, root)
            elif used == "naive":
                alg.naive_broadcast(wire, [flat], root)
            else:
                alg.tree_broadcast(wire, [flat], root)
            wire.finish()
            write_back()
        return done(tensors)

    @collective
    def allgather(self, output_lists, inputs, opts=None):
        for outputs, tensor in zip(output_lists, inputs):
            wire, used = self._begin("all_gather", [tensor, *outputs], numel_in=tensor.numel(),
                                     sizes=[o.numel() for o in outputs])
            flats = [flat_view(o) for o in outputs]
            self._all_gather(wire, used, [f for f, _ in flats], tensor)
            for _, write_back in flats:
                write_back()
        return done(output_lists)

    def _all_gather(self, wire, used, blocks, tensor):
        blocks[self._rank].copy_(tensor.reshape(-1))
        if used == "ring":
            alg.ring_all_gather(wire, blocks)
        elif used == "naive":
            alg.naive_gather(wire, blocks, root=0, step=0)
            alg.naive_broadcast(wire, blocks, root=0, step=1)
        else:
            alg.tree_gather(wire, blocks, root=0)
            alg.tree_broadcast(wire, blocks, root=0, step0=alg.tree_depth(self._size))
        wire.finish()

    @collective
    def all_gather_single(self, output, tensor, opts=None):
        wire, used = self._begin("all_gather", [tensor, output], numel_in=tensor.numel(),
                                 numel_out=output.numel(), single=True)
        flat, write_back = flat_view(output)
        self._all_gather(wire, used, list(flat.tensor_split(self._size)), tensor)
        write_back()
        return done([output])

    _allgather_base = all_gather_single  # the name before torch 2.13

    @collective
    def reduce_scatter(self, outputs, input_lists, opts=None):
        op = reduce_op_name((opts or ReduceScatterOptions()).reduceOp)
        for output, inputs in zip(outputs, input_lists):
            wire, used = self._begin("reduce_scatter", [output, *inputs], op,
                                     numel_out=output.numel(), sizes=[t.numel() for t in inputs])
            self._reduce_scatter(wire, used, op, output, [t.reshape(-1) for t in inputs])
        return done(outputs)

    @collective
    def reduce_scatter_single(self, output, tensor, opts=None):
        op = reduce_op_name((opts or ReduceScatterOptions()).reduceOp)
        wire, used = self._begin("reduce_scatter", [output, tensor], op, numel_in=tensor.numel(),
                                 numel_out=output.numel(), single=True)
        self._reduce_scatter(wire, used, op, output,
                             list(tensor.reshape(-1).tensor_split(self._size)))
        return done([output])

    _reduce_scatter_base = reduce_scatter_single

    def _reduce_scatter(self, wire, used, op, output, inputs):
        n, r, combine = self._size, self._rank, combiner(op)
        out, write_back = flat_view(output)
        if used == "ring":
            alg.ring_reduce_scatter(wire, inputs, out, combine, self._ring_buffers(inputs))
            average(op, out, n)
        else:  # reduce everything to rank 0, which hands each rank its chunk
            acc = torch.cat(inputs)
            blocks = list(acc.split([t.numel() for t in inputs]))
            if used == "naive":
                alg.naive_reduce(wire, acc, combine, root=0, step=0, acc=acc)
                alg.naive_scatter(wire, blocks, root=0, step=1)
            else:
                alg.tree_reduce(wire, acc, combine, root=0)
                alg.tree_scatter(wire, blocks, root=0, step0=alg.tree_depth(n))
            out.copy_(blocks[r])  # (the algorithms return once received data is in place)
            average(op, out, n)
        wire.finish()
        write_back()

    @collective
    def reduce(self, tensors, opts=None):
        opts = opts or ReduceOptions()
        op, root = reduce_op_name(opts.reduceOp), opts.rootRank
        for tensor in tensors:
            wire, used = self._begin("reduce", [tensor], op, root=root, numel_in=tensor.numel())
            flat, write_back = flat_view(tensor)
            self._reduce(wire, used, op, root, flat)
            wire.finish()
            write_back()
        return done(tensors)

    def _reduce(self, wire, used, op, root, flat):
        n, r, combine = self._size, self._rank, combiner(op)
        mine = flat if r == root else flat.clone()  # only the root's tensor changes
        if used == "ring":  # reduce-scatter, then every rank sends its reduced chunk to the root
            chunks = list(mine.tensor_split(n))
            alg.ring_reduce_scatter(wire, chunks, chunks[r], combine, self._ring_buffers(chunks))
            alg.naive_gather(wire, chunks, root, step=n - 1)
        elif used == "naive":
            alg.naive_reduce(wire, mine, combine, root, step=0, acc=mine)
        else:
            alg.tree_reduce(wire, mine, combine, root)
        wire.finish()
        average(op, flat, n if r == root else 1)

    @collective
    def gather(self, output_lists, inputs, opts=None):
        root, tensor = (opts or GatherOptions()).rootRank, inputs[0]
        outputs = output_lists[0] if output_lists else []
        wire, used = self._begin("gather", [tensor, *outputs], root=root, numel_in=tensor.numel(),
                                 sizes=[o.numel() for o in outputs])
        flats = [flat_view(o) for o in outputs]
        blocks = relay_blocks([f for f, _ in flats], tensor.reshape(-1), self._rows, self._rank,
                              "numel_in", used)
        if blocks[self._rank].data_ptr() != tensor.data_ptr():
            blocks[self._rank].copy_(tensor.reshape(-1))
        (alg.tree_gather if used == "tree" else alg.naive_gather)(wire, blocks, root)
        wire.finish()
        for _, write_back in flats:
            write_back()
        return done(output_lists)

    @collective
    def scatter(self, outputs, input_lists, opts=None):
        root, output = (opts or ScatterOptions()).rootRank, outputs[0]
        inputs = input_lists[0] if input_lists else []
        wire, used = self._begin("scatter", [output, *inputs], root=root,
                                 numel_out=output.numel(), sizes=[t.numel() for t in inputs])
        out, write_back = flat_view(output)
        blocks = relay_blocks([t.reshape(-1) for t in inputs], out, self._rows, self._rank,
                              "numel_out", used)
        (alg.tree_scatter if used == "tree" else alg.naive_scatter)(wire, blocks, root)
        wire.finish()
        if blocks[self._rank].data_ptr() != out.data_ptr():
            out.copy_(blocks[self._rank])
        write_back()
        return done(outputs)

    @collective
    def alltoall(self, outputs, inputs, opts=None):
        wire, used = self._begin("all_to_all", [*outputs, *inputs],
                                 sizes=[t.numel() for t in inputs],
                                 sizes2=[t.numel() for t in outputs])
        flats = [flat_view(o) for o in outputs]
        alg.pairwise_all_to_all(wire, [f for f, _ in flats], [t.reshape(-1) for t in inputs])
        wire.finish()
        for _, write_back in flats:
            write_back()
        return done(outputs)

    @collective
    def all_to_all_single(self, output, tensor, output_splits, input_splits, opts=None):
        outputs, inputs = (split_rows(t, s, self._size) for t, s in
                           ((output, output_splits), (tensor, input_splits)))
        wire, used = self._begin(
            "all_to_all", [output, tensor],
            sizes=[t.numel() for t in inputs] if inputs else [-1] * self._size,
            sizes2=[t.numel() for t in outputs] if outputs else [-1] * self._size)
        alg.pairwise_all_to_all(wire, [o.reshape(-1) for o in outputs],
                                [t.reshape(-1) for t in inputs])
        wire.finish()
        return done([output])

    alltoall_base = all_to_all_single

    @collective
    def barrier(self, opts=None):
        wire, _ = self._begin("barrier", [])
        alg.dissemination_barrier(wire)
        wire.finish()
        return done([])

    # ------------------------------------------------------------------ point to point
    def send(self, tensors, dst: int, tag: int = 0):
        return self._p2p("send", tensors[0], dst, tag)

    def recv(self, tensors, src: int, tag: int = 0):
        return self._p2p("recv", tensors[0], src, tag)

    def recv_anysource(self, tensors, tag: int = 0):
        """Receive from whichever rank sends first (its sender logs the transfer)."""
        self._check_tag(tag)
        return as_work(self._transport(tensors[0]).recv_anysource(tensors, tag))

    def _check_tag(self, tag):
        if not 0 <= tag < TAG_BASE:
            raise ValueError(f"tag must be from 0 to {TAG_BASE - 1} (higher tags are the toy "
                             f"backend's own), got {tag}")

    def _p2p(self, kind, tensor, peer, tag):
        self._check_tag(tag)
        src, dst = (self._rank, peer) if kind == "send" else (peer, self._rank)
        index = self._pairs[(src, dst)] = self._pairs.get((src, dst), -1) + 1
        STATE.log.append(Transfer("send", "p2p", 0, self._global[src], self._global[dst],
                                  tensor.numel() * tensor.element_size(), self.label, index))
        if tensor.device.type != "cpu" and not nccl_usable():
            if kind == "send":
                return as_work(self._cpu.send([tensor.cpu().contiguous()], peer, tag))
            staging = torch.empty(tensor.shape, dtype=tensor.dtype)
            return StagedRecvWork(self._cpu.recv([staging], peer, tag), staging, tensor)
        transport = self._transport(tensor)
        return as_work((transport.send if kind == "send" else transport.recv)([tensor], peer, tag))

