"""Data parallelism (chapter 02, Figure 8-2): whole replicas, a split batch, averaged gradients.

``sync`` (splitting the batch, bucketing gradients, the exchange of one step), ``training`` (many
steps on N real ranks, DDP beside ours, checkpoints and a lost transfer, the ranks' timeline as
a Chrome trace), ``scaling`` (bytes per rank measured on the toy backend, then modelled up to thousands of
GPUs). Imports :mod:`parlab.launch`, :mod:`parlab.comm` and :mod:`parlab.models`.
"""

from parlab.data_parallel.sync import (
    all_reduce_buckets, bucket_bytes, DDP_BUCKET_CAP_BYTES, DDP_FIRST_BUCKET_BYTES,
    GradientExchange, make_buckets, split_batch, step, SyncStats
)
from parlab.data_parallel.training import (
    latest_checkpoint, LostTransfer, make_batch, make_model, make_optimizer,
    RankRun, read_journal, reference, train, train_rank, training_trace, TrainSpec
)
from parlab.data_parallel.scaling import (
    replica_names, SCALES, TOKENS_PER_GPU, bucketing_table, gradient_bytes, layer_traffic, measure_traffic,
    sync_cost, traffic_table
)
from parlab.data_parallel.scaling import sync_scaling, SyncScaling

__all__ = ["split_batch", "make_buckets", "bucket_bytes", "DDP_FIRST_BUCKET_BYTES",
           "DDP_BUCKET_CAP_BYTES", "all_reduce_buckets", "SyncStats", "step",
           "GradientExchange", "TrainSpec", "RankRun", "make_model", "make_batch",
           "make_optimizer", "train", "train_rank", "reference", "LostTransfer",
           "latest_checkpoint", "read_journal", "training_trace",
           "replica_names", "gradient_bytes",
           "measure_traffic", "traffic_table", "layer_traffic", "sync_cost", "bucketing_table",
           "TOKENS_PER_GPU", "SCALES", "SyncScaling", "sync_scaling"]
