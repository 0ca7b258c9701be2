"""The hardware behind the companion's numbers, in one place: a GPU's datasheet and its links.

Every calculator that needs a GPU's memory, peak FLOP/s, HBM bandwidth or a link's speed
reads it from here, so changing an assumption changes it everywhere. Imports nothing.

Sources (NVIDIA H100 SXM5 datasheet): 80 GB of HBM3 at 3.35 TB/s; 989 TFLOP/s dense bf16
(1,979 with 2:4 sparsity, which training does not use); fourth-generation NVLink, 900 GB/s
in both directions together, so 450 GB/s each way; each GPU beside a ConnectX-7 NIC of up
to 400 Gb/s (NDR InfiniBand). GB and TB are decimal (:mod:`parlab.units`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GPU", "H100", "GPUS", "GPU_MEMORY_GB", "H100_BF16_TFLOPS", "H100_HBM_TB_PER_S",
           "NVLINK_GB_PER_S", "NIC_GBPS", "NIC_SPEEDS_GBPS"]


@dataclass(frozen=True)
class GPU:
    """One GPU model's datasheet numbers."""

    name: str
    memory_gb: float        # HBM capacity, GB (10**9 bytes)
    bf16_tflops: float      # dense bf16 peak, TFLOP/s
    hbm_tb_per_s: float     # HBM bandwidth, TB/s
    nvlink_gb_per_s: float  # NVLink bandwidth per direction, GB/s


#: The card the book's cluster and every default assume.
H100 = GPU("H100-80GB", memory_gb=80, bf16_tflops=989.0, hbm_tb_per_s=3.35,
           nvlink_gb_per_s=450)
#: GPUs by name.
GPUS = {H100.name: H100}

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
