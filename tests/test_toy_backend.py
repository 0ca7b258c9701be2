"""Backend "toy": every collective, every algorithm, every gloo dtype, checked against gloo.

Each world size runs one launch: the world is a toy group, a gloo group over the same
ranks computes the reference, and every rank compares and returns the cases that differ
(an empty list means everything matched). Integer-valued data must match bit for bit;
random floats to rounding (the toy ring adds in another order than gloo).
"""
import pytest
import torch
import torch.distributed as dist

from parlab.comm import ALGORITHMS

from parlab import launch
from parlab.comm.toy import backend as toy_backend, shm as toy_shm, wire as toy_wire
from parlab.launch import RankError, run
from parlab.comm.toy import REDUCE_OPS, SUPPORTED_DTYPES
from parlab.comm import TrafficLog

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 5e-2}


def _values(shape, dtype, seed, low=-4, high=5):
    """Integer-valued data: exact in every dtype, so any correct order gives equal bits."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype == torch.uint8:
        low = 0
    return torch.randint(low, high, shape, generator=g).to(dtype)


class Battery:
    """Runs each case with toy and with gloo on this rank and records the differences."""

    def __init__(self, toy=None):
        self.gloo = dist.new_group(backend="gloo")
        self.toy = toy  # None: the world (shared memory on one Linux machine)
        self.rank, self.n = dist.get_rank(), dist.get_world_size()
        self.problems, self.cases = [], 0

    def compare(self, name, call, make, exact=True, dtype=None):
        """``make()`` -> fresh arguments; ``call(args, group)`` -> tensors to compare."""
        toy = call(make(), self.toy)
        ref = call(make(), self.gloo)
        self.cases += 1
        for got, want in zip(_flatten(toy), _flatten(ref)):
            ok = (torch.equal(got, want) if exact else
                  torch.allclose(got.double(), want.double(), rtol=TOLERANCE.get(dtype, 1e-5),
                                 atol=1e-5))
            if not ok:
                self.problems.append(f"{name}: toy {got.tolist()} != gloo {want.tolist()}")
                return


def _flatten(x):
    if isinstance(x, torch.Tensor):
        return [x]
    return [t for item in x for t in _flatten(item)]


def _all_reduce_cases(b, algorithm, dtypes_to_try):
    n, r = b.n, b.rank
    for dtype in dtypes_to_try:
        for op_name, dtypes in REDUCE_OPS.items():
            if dtype not in dtypes:
                continue
            low, high = (-1, 3) if op_name == "PRODUCT" else (-4, 5)  # products stay exact in bf16
            op = getattr(dist.ReduceOp, op_name)

            def call(t, group, op=op, op_name=op_name):
                if op_name == "AVG" and group is not None:  # gloo has no AVG: SUM, then divide
                    dist.all_reduce(t, group=group)
                    return t / n
                dist.all_reduce(t, op=op, group=group)
                return t
            # 7 on 4 ranks: uneven chunks; for SUM also 1 (fewer elements than ranks) and 0
            for numel in (7, 1, 0) if op_name == "SUM" else (7,):
                b.compare(f"{algorithm} all_reduce {op_name} {dtype} x{numel}", call,
                          lambda: _values((numel,), dtype, 100 + r, low, high),
                          exact=op_name != "AVG", dtype=dtype)
    for op_name in ("SUM", "MAX", "PRODUCT"):  # random floats, a non-contiguous 2-D tensor
        def call(t, group, op=getattr(dist.ReduceOp, op_name)):
            dist.all_reduce(t, op=op, group=group)
            return t
        b.compare(f"{algorithm} all_reduce {op_name} random float32 transposed", call,
                  lambda: torch.randn(5, 3, generator=torch.Generator().manual_seed(r)).t(),
                  exact=False)


def _data_movement_cases(b, algorithm, dtypes_to_try):
    n, r = b.n, b.rank
    for dtype in dtypes_to_try:
        def gather_list(x, group):
            out = [torch.empty(3, dtype=x.dtype) for _ in range(n)]
            dist.all_gather(out, x, group=group)
            return out
        b.compare(f"{algorithm} all_gather {dtype}", gather_list, lambda: _values((3,), dtype, r))

        def bcast(x, group):
            dist.broadcast(x, src=n - 1, group=group)
            return x
        b.compare(f"{algorithm} broadcast {dtype}", bcast, lambda: _values((5,), dtype, r))

    def gather_tensor(x, group):
        out = torch.empty(n, 2, dtype=x.dtype)
        dist.all_gather_into_tensor(out, x, group=group)
        return out
    b.compare(f"{algorithm} all_gather_into_tensor", gather_tensor,
              lambda: _values((1, 2), torch.int64, r))

    sizes = toy_wire.chunk_sizes(2 * n + 1, n)  # uneven: 2n+1 elements over n ranks

    def reduce_scatter_list(args, group):
        out, inputs = args
        dist.reduce_scatter(out, inputs, group=group)
        return out
    for dtype in (torch.float32, torch.int32, torch.bool):
        b.compare(f"{algorithm} reduce_scatter {dtype} uneven", reduce_scatter_list,
                  lambda: (torch.empty(sizes[r], dtype=dtype),
                           list(_values((2 * n + 1,), dtype, r).split(sizes))))

    def reduce_scatter_tensor(args, group):
        out, x = args
        dist.reduce_scatter_tensor(out, x, op=dist.ReduceOp.MAX, group=group)
        return out
    b.compare(f"{algorithm} reduce_scatter_tensor MAX", reduce_scatter_tensor,
              lambda: (torch.empty(3, dtype=torch.float64), _values((3 * n,), torch.float64, r)))

    def reduce_to(x, group):
        dist.reduce(x, dst=n // 2, group=group)
        return [x] if r == n // 2 else []  # only the root's result is defined
    b.compare(f"{algorithm} reduce", reduce_to, lambda: _values((7,), torch.int64, r))

    def gather_to(x, group):
        out = [torch.empty(2, dtype=x.dtype) for _ in range(n)] if r == n - 1 else None
        dist.gather(x, out, dst=n - 1, group=group)
        return out or []
    b.compare(f"{algorithm} gather", gather_to, lambda: _values((2,), torch.int32, r))

    def scatter_from(pieces, group):
        out = torch.empty(2, dtype=torch.int32)
        dist.scatter(out, pieces if r == 0 else None, src=0, group=group)
        return out
    b.compare(f"{algorithm} scatter", scatter_from,
              lambda: [_values((2,), torch.int32, 50 + p) for p in range(n)])

    in_splits = [(r + p) % 3 for p in range(n)]  # uneven all-to-all: rank r sends (r+p)%3 rows to p
    out_splits = [(p + r) % 3 for p in range(n)]

    def all_to_all(x, group):
        out = torch.empty(sum(out_splits), 2, dtype=x.dtype)
        dist.all_to_all_single(out, x, out_splits, in_splits, group=group)
        return out
    b.compare(f"{algorithm} all_to_all_single uneven", all_to_all,
              lambda: _values((sum(in_splits), 2), torch.float32, r))

    def all_to_all_list(xs, group):
        out = [torch.empty(2, dtype=torch.int64) for _ in range(n)]
        try:
            dist.all_to_all(out, xs, group=group)
        except RuntimeError as e:  # torch 2.11's gloo has only the single-tensor form
            if group is None or "does not support alltoall" not in str(e):
                raise
            flat = torch.empty(2 * n, dtype=torch.int64)
            dist.all_to_all_single(flat, torch.cat(xs), group=group)
            out = list(flat.split(2))
        return out
    b.compare(f"{algorithm} all_to_all", all_to_all_list,
              lambda: [_values((2,), torch.int64, 10 * r + p) for p in range(n)])


def _battery(piece_bytes, dtypes, shared_memory=True):
    """Every collective x algorithm on this rank; returns (cases run, differences found).

    ``shared_memory=False``: on a toy group whose wire is gloo's point-to-point calls (the
    toy's road between machines) instead of the world's."""
    toy_wire.PIECE_BYTES = piece_bytes  # small pieces exercise the pipelined paths
    toy_shm.ENABLED = shared_memory
    b = Battery(None if shared_memory else dist.new_group(backend="toy"))
    for algorithm in ALGORITHMS:
        with toy_backend.algorithm(algorithm):
            _all_reduce_cases(b, algorithm, dtypes)
            _data_movement_cases(b, algorithm, dtypes)
            dist.barrier()
    objects = [None] * b.n
    dist.all_gather_object(objects, {"rank": b.rank})
    if objects != [{"rank": p} for p in range(b.n)]:
        b.problems.append(f"all_gather_object gave {objects}")
    return b.cases, b.problems


#: Many ranks on a small machine are slow: with 4 and 8 ranks every collective and every
#: algorithm runs, on fewer dtypes (every dtype runs with 1, 2 and 3 ranks).
FEW_DTYPES = (torch.float32, torch.bfloat16, torch.int8, torch.bool)


@pytest.mark.parametrize("world_size, shared_memory", [
    (1, True), (2, True), (3, True), (4, True), (8, True), (3, False)])
def test_every_collective_equals_gloo(world_size, shared_memory):
    dtypes = FEW_DTYPES if world_size >= 4 else SUPPORTED_DTYPES
    piece_bytes = 4 if world_size == 3 else 1 << 20  # 3 ranks: one element per piece
    results = run(_battery, world_size, piece_bytes, dtypes, shared_memory, backend="toy",
                  timeout=120)
    assert results[0][0] > (100 if world_size >= 4 else 200)  # cases run
    assert [problems for _, problems in results] == [[]] * world_size


def _async_and_p2p():
    r, n = dist.get_rank(), dist.get_world_size()
    t = torch.nn.Parameter(torch.full((4,), float(r)))  # requires grad: written in place anyway
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    mine, got = torch.tensor([100 + r]), torch.zeros(1, dtype=torch.int64)
    for request in (dist.isend(mine, (r + 1) % n), dist.irecv(got, (r - 1) % n)):
        request.wait()
    anyone = torch.zeros(1, dtype=torch.int64)
    if r == 0:
        dist.recv(anyone)  # from whichever rank sends (here only rank 1)
    elif r == 1:
        dist.send(torch.tensor([7]), 0)
    return t.tolist(), got.item(), anyone.item(), toy_backend.transfers()


def test_async_work_and_point_to_point():
    results = run(_async_and_p2p, 3, backend="toy")
    assert [res[:3] for res in results] == [([3.0] * 4, 102, 7), ([3.0] * 4, 100, 0),
                                            ([3.0] * 4, 101, 0)]
    # rank 1's own log: what it sent, and what it received (from rank 0)
    sends = [rec for rec in results[1][3] if rec.op == "send"]
    assert {(rec.src, rec.dst, rec.nbytes) for rec in sends} == {(1, 2, 8), (0, 1, 8), (1, 0, 8)}


def _sub_groups():
    r = dist.get_rank()
    evens = dist.new_group([0, 2], backend="toy",
                           pg_options=toy_backend.ToyOptions(label="data", algorithm="tree"))
    odds = dist.new_group([1, 3], backend="toy", group_desc="pipeline")
    pair = dist.new_group([2, 3], backend="toy")
    mine = evens if r % 2 == 0 else odds
    toy_backend.clear_transfers()
    t = torch.tensor([float(r)] * 2)
    dist.all_reduce(t, group=mine)
    if r in (2, 3):
        toy_backend.set_label(pair, "tensor")
        toy_backend.set_algorithm("naive", group=pair)
        dist.all_reduce(torch.ones(2), group=pair)
    return t.tolist(), toy_backend.transfers()


def test_sub_groups_log_global_ranks_and_labels():
    results = run(_sub_groups, 4, backend="toy")
    assert [res[0] for res in results] == [[2.0] * 2, [4.0] * 2, [2.0] * 2, [4.0] * 2]
    sent = {(rec.group, rec.algorithm, rec.src, rec.dst) for res in results for rec in res[1]}
    assert ("data", "tree", 0, 2) in sent and ("data", "tree", 2, 0) in sent
    assert ("pipeline", "ring", 1, 3) in sent
    assert ("tensor", "naive", 3, 2) in sent and ("tensor", "naive", 2, 3) in sent
    assert all(rec.call == 0 for res in results for rec in res[1])


def _device_mesh():
    """A 2 x 2 DeviceMesh on toy; DTensor's functional all-reduce along the "tensor" dim."""
    from torch.distributed import _functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("data", "tensor"))
    group = mesh.get_group("tensor")
    toy_backend.clear_transfers()
    t = funcol.all_reduce(torch.tensor([float(dist.get_rank())]), "sum", (mesh, 1))
    names = (dist.group.WORLD.group_name, group.group_name)
    return funcol.wait_tensor(t).item(), names, toy_backend.transfers()


def test_device_mesh_and_functional_collectives_run_on_toy():
    results = run(_device_mesh, 4, backend="toy")
    assert [res[0] for res in results] == [1.0, 1.0, 5.0, 5.0]  # rows {0, 1} and {2, 3}
    assert all(res[1][0] and res[1][1] and res[1][0] != res[1][1] for res in results)
    sent = {(rec.op, rec.src, rec.dst) for res in results for rec in res[2]}
    assert sent == {("all_reduce", 0, 1), ("all_reduce", 1, 0),
                    ("all_reduce", 2, 3), ("all_reduce", 3, 2)}


def _toy_group_in_gloo_world():
    group = dist.new_group(backend="toy")
    t = torch.tensor([dist.get_rank() + 1])
    dist.all_reduce(t, group=group)
    return t.item(), len(toy_backend.transfers())


def test_toy_sub_group_of_a_gloo_world():
    assert run(_toy_group_in_gloo_world, 2, backend="gloo") == [(3, 2), (3, 2)]


def _choose_algorithms():
    used = []
    t = torch.ones(4)
    for step in range(3):
        if step == 1:
            toy_backend.set_algorithm("tree")
        if step == 2:
            with toy_backend.algorithm("naive"):
                dist.all_reduce(t)
        else:
            dist.all_reduce(t)
        used.append(toy_backend.transfers()[-1].algorithm)
    try:
        toy_backend.set_algorithm("butterfly")
    except ValueError as err:
        used.append(str(err))
    return used


def test_algorithm_per_process_per_call_and_a_clear_error():
    used = run(_choose_algorithms, 2, backend="toy")[0]
    assert used[:3] == ["ring", "tree", "naive"]
    assert "butterfly" in used[3] and "['ring', 'naive', 'tree']" in used[3]


def _call(kind):
    r = dist.get_rank()
    if kind == "sizes":
        dist.all_reduce(torch.ones(7 + r))
    elif kind == "collectives":
        (dist.all_reduce if r == 0 else lambda t: dist.broadcast(t, 0))(torch.ones(2))
    elif kind == "dtype":
        dist.all_reduce(torch.ones(2, dtype=torch.int16))
    elif kind == "avg_int":
        dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.AVG)
    elif kind == "premul":
        dist.all_reduce(torch.ones(2), op=dist._make_nccl_premul_sum(2.0))
    elif kind == "gather_list":
        out = [torch.empty(2) for _ in range(2)]  # one short on 3 ranks
        dist.all_gather(out, torch.ones(2))
    elif kind == "gather_tensor":
        dist.all_gather_into_tensor(torch.empty(5), torch.ones(2))
    elif kind == "a2a_split":
        dist.all_to_all_single(torch.empty(4), torch.ones(4))
    elif kind == "tag":
        dist.send(torch.ones(1), 1 - r, tag=toy_wire.TAG_BASE) if r == 0 else None


WRONG_CALLS = [
    ("sizes", "tensor sizes differ across ranks (tensor elements per rank: rank 0: 7, "
              "rank 1: 8, rank 2: 9)"),
    ("collectives", "not in the same collective"),
    ("dtype", "int16 tensors, which the toy backend does not support; supported: float32, float64"),
    ("avg_int", "ReduceOp.AVG does not work on int32 tensors in the toy backend; it works "
                "on: float32"),
    ("premul", "does not support ReduceOp.PREMUL_SUM; supported: SUM, PRODUCT, MIN, MAX, AVG"),
    ("gather_list", "passes a list of 2 tensors; it needs one per rank (3)"),
    ("gather_tensor", "rank 0's output has 5 elements but needs 3 x 2 = 6"),
    ("a2a_split", "rank 0's input does not split evenly over 3 ranks; pass split sizes"),
    ("tag", "tag must be from 0 to"),
]


@pytest.mark.parametrize("kind, message", WRONG_CALLS, ids=[kind for kind, _ in WRONG_CALLS])
def test_a_wrong_call_is_a_clear_error_not_a_hang(kind, message):
    with pytest.raises(RankError) as info:
        run(_call, 3, kind, backend="toy", timeout=60)
    assert message in str(info.value)
    assert not isinstance(info.value, launch.RankTimeoutError)  # an error, not a hang


def test_launch_brings_the_traffic_home():
    def fn():
        dist.all_reduce(torch.ones(4))
    record = run(fn, 2, backend="toy")
    assert record.backend == "toy"
    for rank in (0, 1):  # each rank reports what it sent
        mine = record.extras[rank]["traffic"].filter(op="all_reduce")
        assert [(rec.src, rec.dst, rec.step) for rec in mine.records] == [
            (rank, 1 - rank, 0), (rank, 1 - rank, 1)]
    merged = record.traffic.filter(op="all_reduce")
    assert isinstance(merged, TrafficLog)
    assert [(rec.src, rec.dst, rec.step) for rec in merged.records] == [
        (0, 1, 0), (1, 0, 0), (0, 1, 1), (1, 0, 1)]


def test_a_transfer_record_is_frozen():
    from dataclasses import FrozenInstanceError
    from parlab.comm import Transfer
    rec = Transfer("all_reduce", "ring", 0, 0, 1, 8)
    with pytest.raises(FrozenInstanceError):
        rec.nbytes = 9
