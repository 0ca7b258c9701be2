"""The hardware behind the companion's numbers, in one place: a GPU's datasheet and its links.

Every calculator that needs a GPU's memory, peak FLOP/s, HBM bandwidth or a link's speed
reads it from here, so changing an assumption changes it everywhere. Imports nothing.

Sources (NVIDIA H100 SXM5 datasheet): 80 GB of HBM3 at 3.35 TB/s; 989 TFLOP/s dense bf16
(1,979 with 2:4 sparsity, which training does not use); fourth-generation NVLink, 900 GB/s
in both directions together, so 450 GB/s each way; each GPU beside a ConnectX-7 NIC of up
to 400 Gb/s (NDR InfiniBand). GB and TB are decimal (:mod:`parlab.units`).

Sources (NVIDIA A100 Tensor Core GPU datasheet, SXM4 80 GB): 80 GB of HBM2e at 2,039 GB/s;
312 TFLOP/s dense bf16 (624 with sparsity); third-generation NVLink, 600 GB/s in both
directions together, so 300 GB/s each way. A DGX A100 server pairs its 8 GPUs with 8
ConnectX-6 NICs of 200 Gb/s (HDR InfiniBand): the cluster of Narayanan et al. (2021), section 5.

**Maximum achievable matmul FLOP/s** (``matmul_tflops``), measured, not a datasheet number:
Stas Bekman, "Machine Learning Engineering Open Book" (repository stas00/ml-engineering),
compute/accelerator/README.md, the "Maximum Achievable Matmul FLOPS comparison table", bf16:
NVIDIA A100 SXM 271.2 TFLOP/s of its 312 (86.9 %), NVIDIA H100 SXM 794.5 of its 989 (80.3 %),
each the best shape found by the book's mamf-finder.py (the mean of 100 timed iterations
after 50 warm-up ones, torch 2.6.0+cu126). It is a ceiling measured on the best shape: a
product of another shape runs at most that fast, and the roofline's shape factor
(:func:`parlab.models.matmul_efficiency`) still applies below it
(:mod:`parlab.models.kernels`, the planner's ``compute_model="kernels"``).

GPUs are data: :data:`GPUS` maps a name to its :class:`GPU`, and :func:`gpu` looks one up
(what the planner's and the memory calculator's ``gpu`` keyword does).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GPU", "H100", "A100", "GPUS", "gpu", "gpu_memory", "GPU_MEMORY_GB", "H100_BF16_TFLOPS", "H100_HBM_TB_PER_S",
           "NVLINK_GB_PER_S", "NIC_GBPS", "NIC_SPEEDS_GBPS"]


@dataclass(frozen=True)
class GPU:
    """One GPU model's datasheet numbers."""

    name: str
    memory_gb: float        # HBM capacity, GB (10**9 bytes)
    bf16_tflops: float      # dense bf16 peak, TFLOP/s
    hbm_tb_per_s: float     # HBM bandwidth, TB/s
    nvlink_gb_per_s: float  # NVLink bandwidth per direction, GB/s
    matmul_tflops: float    # maximum achievable bf16 matmul, TFLOP/s (measured: docstring)

    @property
    def matmul_share(self) -> float:
        """The maximum achievable matmul speed as a share of the dense bf16 peak."""
        return self.matmul_tflops / self.bf16_tflops


#: The card the book's cluster and every default assume.
H100 = GPU("H100-80GB", memory_gb=80, bf16_tflops=989.0, hbm_tb_per_s=3.35,
           nvlink_gb_per_s=450, matmul_tflops=794.5)
#: The card of the Megatron-LM papers' runs (Narayanan et al. 2021; Korthikanti et al. 2022).
A100 = GPU("A100-80GB", memory_gb=80, bf16_tflops=312.0, hbm_tb_per_s=2.039,
           nvlink_gb_per_s=300, matmul_tflops=271.2)
#: GPUs by name.
GPUS = {g.name: g for g in (H100, A100)}


def gpu(name: str | None) -> GPU:
    """The :class:`GPU` called ``name`` in :data:`GPUS` (None: the default, :data:`H100`)."""
    if name is None:
        return H100
    if not isinstance(name, str) or name not in GPUS:
        raise ValueError(f"unknown gpu {name!r}; choose one of {list(GPUS)}")
    return GPUS[name]


def gpu_memory(name: str | None, gpu_memory_gb: float | None) -> float:
    """The GPU memory in GB a calculator uses: ``gpu_memory_gb``, or the named GPU's capacity
    (the default GPU's when neither is given). Both given and different: a ValueError."""
    if name is None:
        return GPU_MEMORY_GB if gpu_memory_gb is None else gpu_memory_gb
    card = gpu(name)
    if gpu_memory_gb is not None and gpu_memory_gb != card.memory_gb:
        raise ValueError(f"gpu={name!r} has {card.memory_gb:g} GB but gpu_memory_gb="
                         f"{gpu_memory_gb!r} was given too; give one of them, or both agreeing")
    return card.memory_gb

#: The default GPU memory of every calculator, GB.
GPU_MEMORY_GB = H100.memory_gb
#: The default GPU's dense bf16 peak, TFLOP/s, and its HBM bandwidth, TB/s.
H100_BF16_TFLOPS = H100.bf16_tflops
H100_HBM_TB_PER_S = H100.hbm_tb_per_s
#: NVLink between GPUs of one server, GB/s per direction.
NVLINK_GB_PER_S = H100.nvlink_gb_per_s
#: The default NIC speed, Gb/s, and the usual ones.
NIC_GBPS = 400
NIC_SPEEDS_GBPS = (100, 200, 400)
