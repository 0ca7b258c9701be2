"""The CUDA paths, run where a GPU is present (the project's device machine); skipped on CPU.

What they guard: the launcher picks NCCL with one GPU per rank and binds each rank to its GPU;
several ranks can share one GPU through gloo with CUDA tensors (NCCL refuses that: "Duplicate
GPU detected"); the toy backend carries CUDA tensors (over NCCL with a GPU per rank, else
staged through CPU copies) with the same results and the same traffic log as on the CPU;
the memory measurement on a GPU agrees with the CPU one part by part; and CPU tensors run
beside CUDA ones under the default NCCL (its group is "cpu:gloo,cuda:nccl"). CPU-only CI skips
them, and every other test covers the same code on the CPU. Ranks on gloo beside a GPU (one
GPU, several ranks) are what the rest of the suite runs there: chapter 06's FSDP2 runs
failed so until its mesh was put on the ranks' own device.
"""
import pytest
import torch
import torch.distributed as dist

from parlab import memory
from parlab.launch import rank_device, run
from parlab.models import BookMLP
from parlab.comm import run_with_traffic

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (checks NCCL and CUDA tensors; on a CPU-only machine"
                                       " all 5 are skipped)")


def _nccl_all_reduce():
    device = rank_device()
    t = torch.full((3,), float(dist.get_rank() + 1), device=device)
    dist.all_reduce(t)
    return str(dist.get_backend()), str(device), t.cpu().tolist()


def test_one_rank_per_gpu_uses_nccl_on_its_own_gpu():
    n = torch.cuda.device_count()
    results = run(_nccl_all_reduce, n, timeout=120)
    total = float(n * (n + 1) // 2)
    # NCCL for CUDA tensors, gloo for CPU ones, in one group (parlab.launch.rank)
    assert results == [("cpu:gloo,cuda:nccl", f"cuda:{r}", [total] * 3) for r in range(n)]


def _gloo_on_one_gpu():
    mine = float(dist.get_rank() + 1)
    t = torch.full((4,), mine, device="cuda:0")
    dist.all_reduce(t)
    pieces = [torch.empty(2, device="cuda:0") for _ in range(dist.get_world_size())]
    dist.all_gather(pieces, torch.full((2,), mine, device="cuda:0"))  # each rank's own value
    return t.device.type, t.cpu().tolist(), [p.cpu().tolist() for p in pieces]


def test_several_ranks_share_one_gpu_through_gloo():
    results = run(_gloo_on_one_gpu, 3, backend="gloo", timeout=120)
    for device, summed, gathered in results:
        assert device == "cuda"
        assert summed == [6.0] * 4
        assert gathered == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]


def _toy_battery(device):
    rank, n = dist.get_rank(), dist.get_world_size()
    x = torch.arange(8, dtype=torch.float32, device=device) * (rank + 1)
    dist.all_reduce(x)
    pieces = [torch.empty(3, device=device) for _ in range(n)]
    dist.all_gather(pieces, torch.full((3,), float(rank), device=device))
    b = torch.full((5,), float(rank), device=device)
    dist.broadcast(b, src=n - 1)
    if rank == 0:
        dist.send(torch.ones(2, device=device), dst=1)
        got = None
    elif rank == 1:
        got = torch.empty(2, device=device)
        dist.recv(got, src=0)
        got = got.cpu().tolist()
    else:
        got = None
    return (x.device.type, x.cpu().tolist(), [p.cpu().tolist() for p in pieces],
            b.cpu().tolist(), got)


def test_toy_backend_carries_cuda_tensors_like_cpu_ones():
    gpu, gpu_log = run_with_traffic(_toy_battery, 3, "cuda:0", timeout=120)
    cpu, cpu_log = run_with_traffic(_toy_battery, 3, "cpu", timeout=120)
    assert [r[0] for r in gpu] == ["cuda"] * 3
    assert [r[1:] for r in gpu] == [r[1:] for r in cpu]
    assert gpu[0][1] == [float(6 * i) for i in range(8)]  # (1 + 2 + 3) x arange(8)
    # the same messages, whatever carried them (staged copies or NCCL)
    assert gpu_log.per_rank().to_dict() == cpu_log.per_rank().to_dict()


def test_memory_measured_on_a_gpu_equals_the_cpu_measurement():
    model = BookMLP((64, 128, 10))
    gpu = memory.measure(model, (16,), optimizer="adam", device="cuda")
    cpu = memory.measure(model, (16,), optimizer="adam", device="cpu")
    for part in ("parameters", "gradients", "optimizer_state", "activations"):
        assert getattr(gpu, part) == getattr(cpu, part), part
    assert gpu.other >= 0  # CUDA's transient buffers, only visible on a GPU


def _cpu_and_gpu_all_reduce():
    cpu = torch.ones(2)  # a rank function written for the CPU, under the default backend
    gpu = torch.ones(2, device=rank_device())
    dist.all_reduce(cpu)
    dist.all_reduce(gpu)
    return str(dist.get_backend()), str(gpu.device), cpu.tolist(), gpu.cpu().tolist()


def test_cpu_tensors_run_beside_cuda_ones_under_the_default_nccl():
    n = torch.cuda.device_count()
    results = run(_cpu_and_gpu_all_reduce, n, timeout=120)
    assert results == [("cpu:gloo,cuda:nccl", f"cuda:{r}", [float(n)] * 2, [float(n)] * 2)
                       for r in range(n)]
