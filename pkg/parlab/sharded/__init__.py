"""Sharded data parallelism (chapter 06, beyond the book): ZeRO stages 0 to 3 and PyTorch's FSDP.

``flat`` (a layer's parameters as one flat buffer cut into N equal shards, and the two
single-tensor collectives that move it), ``zero`` (ZeRO by hand: which rank keeps what and
which collective runs when, for stages 0 to 3), ``runs`` (N real ranks against one process,
step by step, with the model-state bytes each rank held and the toy backend's log),
``fsdp`` (the same problem through ``torch.distributed.fsdp.fully_shard``), ``scaling``
(bytes, memory and time per GPU in closed form, up to thousands of GPUs). Imports
:mod:`parlab.launch`, :mod:`parlab.comm`, :mod:`parlab.models` and :mod:`parlab.memory`.
"""

from parlab.sharded.flat import FlatShard
from parlab.sharded.zero import optimizer_by_name, STATE_PARTS, Zero
from parlab.sharded.runs import (
    make_zero_batch, make_zero_model, RankResult, ShardRun, train_zero, zero_rank, zero_reference,
    ZeroSpec
)
from parlab.sharded.fsdp import train_fsdp, train_stages
from parlab.sharded.scaling import GLOBAL_BATCH, GLOBAL_TOKENS, zero_bytes_per_rank, zero_scaling

__all__ = ["FlatShard", "Zero", "optimizer_by_name", "ZeroSpec", "RankResult", "ShardRun",
           "make_zero_model", "make_zero_batch", "train_zero", "zero_rank", "zero_reference",
           "train_fsdp", "train_stages", "zero_bytes_per_rank", "zero_scaling", "GLOBAL_BATCH", "GLOBAL_TOKENS", "STATE_PARTS"]
