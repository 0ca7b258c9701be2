# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 · Data parallelism: replicas, averaged gradients, and the network between them
#
# **Figure 8-2** of the book is the simplest way to use two GPUs: give each of them the
# whole model and half of the data. GPU A1 trains on the first half of the micro-batches,
# GPU A2 on the second. The forward pass needs no network at all. After the backward pass
# the two GPUs add up their gradients and divide by two, so both apply the same update and
# stay identical copies. The chapter then warns that the traffic grows with hundreds or
# thousands of GPUs, and that losing even one packet during the synchronization pauses
# training, so the network must be lossless (section 8 separates what holds in that warning
# from what it overstates).
#
# One correction first. The book's Notes 8-1 and 8-2 motivate data parallelism by a dataset
# too large for one GPU, with layers spread over GPUs. Neither is what it does: every GPU
# holds *all* the layers, and a dataset of any size streams through one GPU batch by batch.
# What data parallelism buys is throughput: N replicas process N times the samples per step,
# at the price of one gradient synchronization per step.
#
# In this notebook you will:
#
# 1. split a batch over ranks, and see what happens when it does not split;
# 2. run Figure 8-2 for real on two ranks, A1 and A2, with every tensor the figure names:
#    micro-batches, local gradients, gradients received, the average, the new weights;
# 3. train any `torch.nn.Module` on several ranks and check that it learns exactly what one
#    process learns on the whole batch;
# 4. run the same training with PyTorch's production tool, `DistributedDataParallel`;
# 5. pack gradients into buckets and see why frameworks do it;
# 6. count the bytes each GPU sends, with the ring and the naive all-reduce, and scale the
#    count to thousands of GPUs;
# 7. see which link (NVLink, PCIe, InfiniBand, Ethernet) carries the exchange, then make one
#    transfer fail and watch the job stop instead of silently going wrong, then
#    resume from a checkpoint;
# 8. along the way, predict three numbers before the cell that prints them, and at the end
#    write the averaging step yourself.
#
# Book figure: 8-2 (and the slides' communication cost of data parallelism). Everything
# runs on a CPU in well under a minute.

# %% [markdown]
# ## 1. Splitting the batch
#
# The batch of Figure 8-2 has <span data-glue="split_micro">8</span> micro-batches; here
# each holds <span data-glue="split_per_micro">2</span> samples, so
# <span data-glue="split_samples">16</span> samples in all. `split_batch` says which samples
# each rank trains on: consecutive micro-batches, the first half for rank 0 (A1), the rest
# for rank 1 (A2).

# %%
import torch
import torch.distributed as dist

from parlab import data_parallel as dp
from parlab.experiments import FIGURE_8_2
from parlab.launch import RankError, run
from parlab.viz import show

batch = FIGURE_8_2  # the batch of the figure's run in section 2
for rank, shares in enumerate(dp.split_batch(batch.samples, batch.micro_batches, world_size=2)):
    print(f"rank {rank}: micro-batches (first sample, last sample + 1) = {shares}")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
from parlab.viz import glue

glue("split_micro", batch.micro_batches)
glue("split_per_micro", batch.samples // batch.micro_batches)
glue("split_samples", batch.samples)

# %% [markdown]
# A batch that does not split evenly is an error that says what would work. Each rank
# averages the loss over its own samples, and averaging those averages equals the average
# over the whole batch only when the shares are equal.

# %%
try:
    dp.split_batch(samples=14, micro_batches=7, world_size=2)
except ValueError as err:
    print(err)

# %% [markdown]
# With `uneven=True` the split is accepted: the first rank gets one micro-batch more, and
# each rank weights its micro-batches by their share of the whole batch (a micro-batch of
# `m` samples out of `B`, on `N` ranks, counts `m·N/B` times its mean loss). After the sum
# over the ranks and the division by `N`, that is exactly the mean over all `B` samples.
# Trained on an uneven split, the replicas still end equal to one process on the whole batch.

# %%
print(dp.split_batch(samples=14, micro_batches=7, world_size=2, uneven=True))

# %% [markdown]
# ## 2. Figure 8-2 for real
#
# `BookMLP` (chapter 01) is a small network whose training step is written out with the
# book's names. It leaves a seam between computing the local gradients and applying the
# update, and data parallelism fills it: each rank hands its local gradients to an
# *exchange* and gets back what its peers computed (the **remote gradients**); the update
# then uses `(local + remote) / N`.
#
# Which exchange? With an **all-reduce**, the one production code uses, a rank never sees
# a peer's gradient on its own: it gets the sum. For the figure we therefore use an
# **all-gather** first, which hands every rank every peer's gradient, so A1 really holds
# A2's gradient. Each rank runs its <span data-glue="fig_micro_per_rank">4</span>
# micro-batches as one forward pass of <span data-glue="fig_rows_per_rank">8</span> rows;
# with equal micro-batches that gives the same gradient as accumulating them one by one.

# %%
from parlab.viz.plots import figure_8_2
from parlab.experiments import run_figure_8_2

book = run_figure_8_2(how="all_gather")
print(book.table())
first, stop = book.ranks[0]["rows"]

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("fig_micro_per_rank", len(book.ranks[0]["micro"]))
glue("fig_rows_per_rank", stop - first)
glue("fig_w1_shape", " × ".join(map(str, book.ranks[0]["local"][0].shape)))

# %% [markdown]
# Each row shows the first row of the gradient of layer 1's weights
# (∇W1, <span data-glue="fig_w1_shape">6 × 4</span>). A1's "remote" row is A2's "local" row,
# and the other way round. Both compute the same average, so both end with the same weights,
# and these equal one process trained on all <span data-glue="split_micro">8</span>
# micro-batches at once. In the figure, every gradient panel shares one colour scale and the
# weights another (the two colour bars), so equal colours are equal numbers.

# %%
a1, a2 = book.ranks
print("A1 received exactly A2's local gradients:",
      all(torch.equal(r, g) for r, g in zip(a1["remote"], a2["local"])))
print("A1 and A2 hold bit-for-bit the same weights:", book.replicas_identical())
print("and they equal one process on the whole batch (to 1e-6):", book.max_difference() < 1e-6)
show(figure_8_2(book))

# %% [markdown]
# The same step with an all-reduce. Here "remote" is computed as *summed − local*: it is
# what the peers contributed, although no single message carried it.

# %%
summed = run_figure_8_2(how="all_reduce")
print(summed.table().splitlines()[2])
print("equal to one process:", summed.max_difference() < 1e-6)

# %% [markdown]
# Two remarks on the book's text:
#
# * The chapter says the derivative of the error is also synchronized. In data parallelism
#   it is not: each rank's errors E belong to its own samples, and only the gradients
#   (one number per weight) travel.
# * The chapter also says the averaged result is synchronized across the GPUs, a second
#   exchange after the first. With an all-reduce there is none: every rank receives the
#   same sum and divides it by N itself, so all ranks already hold the same average. Only a
#   scheme that first reduces to one GPU, which averages, needs a broadcast of the result
#   back (chapter 03 makes the same point for Figure 8-14).
#
# And one remark on the run itself: with more than two ranks, the all-gather version leaves
# each rank to add up its peers' gradients in its own order, and floating-point addition is
# not associative, so replicas can differ in the last bits. An all-reduce returns the very
# same sum to every rank; that is one reason production code uses it. The output below
# depends on your CPU's floating-point kernels: its last digits may differ on your machine.

# %% tags=["nbval-ignore-output"]
four = run_figure_8_2(world_size=4, how="all_gather")
print("4 ranks, all-gather: identical bits:", four.replicas_identical(),
      f"| largest difference to one process: {four.max_difference():.1e}")

# %% [markdown]
# Explore: the number of replicas, the exchange and the number of steps. The explorer opens
# on the settings of the run drawn above (its figure stays the one above until you move a
# control), and each change runs real ranks again.

# %%
from parlab.experiments import book_step_explorer

book_step_explorer(ranks=len(book.ranks), how=book.how, steps=book.spec.steps, shown_above=True)

# %% [markdown]
# ## 3. Any PyTorch model, on several ranks
#
# `dp.step` is the same recipe for any `torch.nn.Module`: forward and backward over this
# rank's micro-batches (gradients accumulate), then `all_reduce_buckets` sums the gradients
# over the ranks and divides by their number, then the optimizer updates. The rank
# function below is all a rank runs for one step, with PyTorch's own `torch.optim.SGD` as
# the optimizer.

# %%
def one_step(spec):
    model = dp.make_model(spec)
    optimizer = torch.optim.SGD(model.parameters(), lr=spec.lr)
    x, y = dp.make_batch(spec, 0)
    mine = dp.split_batch(spec.samples, spec.micro_batches, dist.get_world_size())[dist.get_rank()]
    loss, sync = dp.step(model, optimizer, torch.nn.functional.mse_loss,
                         [(x[a:b], y[a:b]) for a, b in mine], spec.samples)
    return f"loss on my samples {loss:.4f}; {sync.calls} all-reduce calls, {sync.bytes} bytes"


run(one_step, 2, dp.TrainSpec())

# %% [markdown]
# Now <span data-glue="train_steps">20</span> steps of SGD with momentum, on
# <span data-glue="train_world_sizes">1, 2 and 4</span> ranks, against one process that sees
# the whole batch every step. `dp.train` cuts each run into
# <span data-glue="train_segments">2</span> launches; each resumes from the previous one's
# in-memory checkpoint (weights and momentum), and the progress bar advances per launch.
# The bars' times are your machine's; the next cell prints the results.

# %% tags=["nbval-ignore-output"]
spec = dp.TrainSpec(steps=20, lr=0.1, momentum=0.9)
segments, world_sizes = 2, (1, 2, 4)
reference = dp.reference(spec)
runs = {n: dp.train(spec, n, segments=segments, progress=True) for n in world_sizes}

# %%
from parlab.models import max_difference
from parlab.viz.plots import loss_curves

for n, ranks in runs.items():
    identical = all(max_difference(r.state, ranks[0].state) == 0 for r in ranks)
    print(f"{n} rank(s): replicas identical: {identical}; equal to one process (1e-6): "
          f"{max_difference(ranks[0].state, reference.state) < 1e-6}; "
          f"final loss {sum(r.losses[-1] for r in ranks) / n:.4f} "
          f"(one process: {reference.losses[-1]:.4f})")
show(loss_curves(runs, reference.losses))

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("train_steps", spec.steps)
glue("train_world_sizes", f"{', '.join(map(str, world_sizes[:-1]))} and {world_sizes[-1]}")
glue("train_segments", segments)

# %% [markdown]
# ## 4. The production version: `DistributedDataParallel`
#
# PyTorch's `DistributedDataParallel` (DDP) does the same thing without a visible sync
# call: it hooks into backward, and as soon as a bucket of gradients is complete it starts
# that bucket's all-reduce, already averaged, while backward goes on with earlier layers.
# With several micro-batches per rank, `no_sync()` skips the sync for all but the last.
#
# | | hand-built (`dp.step`) | `DistributedDataParallel` |
# |---|---|---|
# | start | rank 0's weights broadcast | rank 0's weights broadcast (in the constructor) |
# | micro-batches | gradients accumulate | `no_sync()` for all but the last |
# | sync | after backward: `all_reduce_buckets` | during backward: hooks per bucket |
# | buckets | cap in bytes, last layers first | `bucket_cap_mb`, same rule from step 2 on |
# | average | sum, then divide by N | divide by N, then sum |
#
# Same model, same data, same optimizer, <span data-glue="ddp_steps">10</span> steps each:

# %%
short = spec.replace(steps=10, bucket_cap_bytes=200)
hand = dp.train(short, 2)
ddp = dp.train(short, 2, engine="ddp")
one = dp.reference(short)
print("                      hand-built   DDP")
print("replicas identical   ", *(f"{max_difference(r[0].state, r[1].state) == 0!s:<12}"
                               for r in (hand, ddp)))
print("= one process (1e-6) ", *(f"{max_difference(r[0].state, one.state) < 1e-6!s:<12}"
                               for r in (hand, ddp)))
print("hand-built = DDP (1e-6):", max_difference(hand[0].state, ddp[0].state) < 1e-6)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("ddp_steps", short.steps)

# %% [markdown]
# ## 5. Buckets: fewer, larger messages
#
# Our small model has a weight matrix and a bias per layer, and section 3 synced each of
# them with its own all-reduce. Frameworks pack gradients into **buckets** instead: one
# flat tensor, one all-reduce. `make_buckets` fills them by DDP's rule: from the last tensor
# back (backward produces the last layer's gradients first), each tensor joins the open
# bucket whole, and the bucket closes as soon as it holds the cap or more. So a bucket can
# end up larger than the cap, by less than its last tensor. This is the assignment
# PyTorch's own DDP makes, bucket for bucket, on this model and others.
#
# Two details of DDP itself. In the first step it does not yet know in which order the
# gradients become ready, so by default it syncs them all in one bucket; after that step it
# rebuilds the buckets in the order it saw, by the rule above. And unless you set
# `bucket_cap_mb`, its first bucket (the last layers) is capped at
# <span data-glue="ddp_first_mib">1</span> MiB, so that the first all-reduce starts early,
# and the others at <span data-glue="ddp_cap_mib">25</span> MiB.
#
# The model's tensors, in order (`0.weight` is W1, `0.bias` is b1, and so on; every number is
# a 4-byte float):

# %%
for name, p in dp.make_model(spec).named_parameters():
    print(f"{name:<9} {' × '.join(map(str, p.shape))}")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("ddp_first_mib", dp.DDP_FIRST_BUCKET_BYTES / 2**20, ".0f")
glue("ddp_cap_mib", dp.DDP_BUCKET_CAP_BYTES / 2**20, ".0f")

# %% [markdown]
# **Exercise 02.1 (predict first).** The next cell trains with a bucket cap of 200 bytes.
# How many all-reduce calls does one step make? Replace the `...` and run the cell; the
# checker says whether you are right, and why, without giving the number away.

# %%
from parlab.exercises import check

answer_02_1 = ...
check("02.1", answer_02_1)

# %%
caps = (None, 200, 10**6)
calls = {}
for cap in caps:
    ranks = dp.train(spec.replace(steps=2, bucket_cap_bytes=cap), 2)
    calls[cap] = ranks[0].calls[0]
    print(f"bucket cap {cap!s:>7} bytes: {ranks[0].calls[0]} all-reduce calls, "
          f"{ranks[0].sync_bytes[0]} bytes per step, equal to one process: "
          f"{max_difference(ranks[0].state, dp.reference(spec.replace(steps=2)).state) < 1e-6}")
bucket_sizes = dp.bucket_bytes(list(dp.make_model(spec).parameters()), caps[1])
print(f"bytes per bucket with the {caps[1]}-byte cap: {bucket_sizes}")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("buckets_calls_none", calls[None])
glue("buckets_cap", caps[1])
glue("buckets_calls_cap", calls[caps[1]])
glue("buckets_calls_one", calls[caps[2]])
glue("buckets_sizes_cap", f"{', '.join(map(str, bucket_sizes[:-1]))} and {bucket_sizes[-1]}")
glue("grad_bytes", ranks[0].sync_bytes[0])
glue("grad_numbers", sum(p.numel() for p in dp.make_model(spec).parameters()))

# %% [markdown]
# Synced one by one, the tensors make <span data-glue="buckets_calls_none">6</span>
# all-reduce calls per step; with a cap of <span data-glue="buckets_cap">200</span> bytes,
# <span data-glue="buckets_calls_cap">2</span> (buckets of
# <span data-glue="buckets_sizes_cap">224 and 120</span> bytes: the first one closed only
# once it had passed the cap); in one bucket, <span data-glue="buckets_calls_one">1</span>
# call. The bytes are the same in every case (the whole gradient,
# <span data-glue="grad_numbers">86</span> numbers or <span data-glue="grad_bytes">344</span>
# bytes), and so are the weights.

# %% [markdown]
# Why it matters: every message pays a fixed start-up cost (latency, α) before its bytes
# flow at the link's bandwidth (β): `time = α + bytes / β` per message, and a ring
# all-reduce over N GPUs is 2(N−1) such steps. The table applies `parlab.comm.cost`'s
# alpha-beta model, with α = <span data-glue="bucket_alpha_us">2</span> µs per message (an
# assumed RDMA latency through one switch), to GPT-2 small
# (<span data-glue="gpt2_params_m">124</span> M parameters in
# <span data-glue="gpt2_tensors">196</span> tensors, fp32) on
# <span data-glue="bucket_gpus">64</span> GPUs with <span data-glue="bucket_gbps">400</span>
# Gb/s NICs: the bytes cost the same in every row, the latency does not.
#
# Why not one bucket for everything? Because the sync of a bucket can start as soon as its
# gradients exist, while backward is still computing earlier layers. A few medium buckets
# let communication overlap computation.

# %%
from parlab.models import GPT, GPT2_SMALL
from parlab.comm import nic
from parlab.data_parallel import bucketing_table

with torch.device("meta"):  # shapes only, no memory
    gpt2 = list(GPT(GPT2_SMALL).parameters())
gpus, gbps = 64, 400
print(bucketing_table(gpt2, gpus=gpus, gbps=gbps).to_string(index=False))

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("gpt2_params_m", sum(p.numel() for p in gpt2) / 1e6, ".0f")
glue("gpt2_tensors", len(gpt2))
glue("bucket_gpus", gpus)
glue("bucket_alpha_us", nic(gbps).alpha * 1e6, ".0f")
glue("bucket_gbps", gbps)

# %% [markdown]
# ## 6. Counting bytes with the toy backend
#
# The toy backend runs the ordinary `dist.all_reduce` with algorithms written out as
# point-to-point messages, and logs each message. We train Figure 8-2's model with all
# gradients in one bucket, with the **ring** (the gradient cut into N chunks; a
# reduce-scatter passes chunks around the ring, adding as it goes, then an all-gather passes
# the finished sums around) and the **naive** algorithm (everyone sends everything to rank 0,
# which adds and sends the result back), and count what each GPU sent per step.
#
# First, the book's claim that the forward pass needs no network, measured: two ranks run
# a forward pass on their halves of a batch, then the backward pass with its gradient
# all-reduce, and the toy backend logs every message of each.

# %%
from parlab.comm import run_with_traffic


def forward_then_backward(with_backward):
    torch.manual_seed(0)  # the same replica on every rank
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    x = torch.randn(8, 4)[dist.get_rank()::dist.get_world_size()]  # this rank's half
    out = model(x)
    if with_backward:
        out.pow(2).mean().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)


_, forward_log = run_with_traffic(forward_then_backward, 2, False)
_, step_log = run_with_traffic(forward_then_backward, 2, True)
print(f"forward pass only:        {len(forward_log)} messages, {forward_log.total_bytes()} bytes")
print(f"forward + backward + sync: {len(step_log)} messages, {step_log.total_bytes()} bytes")

# %% [markdown]
# Now the bucketed synchronization of Figure 8-2's model, counted per GPU and step.
#
# **Exercise 02.2 (predict first).** The next cell syncs the whole gradient
# (<span data-glue="grad_numbers">86</span> fp32 numbers,
# <span data-glue="grad_bytes">344</span> bytes) in one bucket with the ring on 4 GPUs. Before
# you run it: how many bytes does one GPU send per step, on average over the 4?

# %%
answer_02_2 = ...
check("02.2", answer_02_2)

# %%
from parlab.data_parallel import gradient_bytes, traffic_table
from parlab.experiments import FIGURE_8_2
from parlab.viz.plots import traffic_figure

one_bucket = FIGURE_8_2.replace(steps=2, bucket_cap_bytes=10**6)
size = gradient_bytes(one_bucket)
table = traffic_table(one_bucket, world_sizes=(2, 4), algorithms=("ring", "naive"))
print(f"gradient: {size} bytes; ring closed form 2(N-1)/N x {size}")
print(table.to_string(index=False))
show(traffic_figure(table, size))
small, large = sorted(table["ranks"].unique())
sent = {key: part["sent per step (B)"] for key, part in table.groupby(["ranks", "algorithm"])}

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("traffic_small", small)
glue("traffic_large", large)
glue("ring_ratio_large", sent[large, "ring"].mean() / size, ".1f")
glue("ring_min_large", sent[large, "ring"].min())
glue("ring_max_large", sent[large, "ring"].max())
glue("naive_root_ratio_large", sent[large, "naive"].max() / size, ".0f")

# %% [markdown]
# * On **<span data-glue="traffic_small">2</span> GPUs** ring and naive are the same: each GPU
#   sends its whole gradient once.
# * On **<span data-glue="traffic_large">4</span> GPUs** the ring spreads the work: every GPU
#   sends about <span data-glue="ring_ratio_large">1.5</span> × the gradient, in two passes
#   around the ring, each sending N−1 of the N chunks, so 2(N−1)/N on average. The
#   <span data-glue="grad_numbers">86</span> numbers do not split into
#   <span data-glue="traffic_large">4</span> equal chunks, so single GPUs send between
#   <span data-glue="ring_min_large">512</span> and
#   <span data-glue="ring_max_large">520</span> bytes. The naive root sends
#   <span data-glue="naive_root_ratio_large">3</span> × the gradient and receives as much,
#   while the others idle: its NIC is the bottleneck, and it gets worse with every GPU
#   added.
#
# **Does a layer's traffic grow with the batch?** The next cell syncs Figure 8-2's model on
# two ranks, one all-reduce per tensor, once with a small batch and once with a large one,
# and prints what rank 0 sent for each tensor.
#
# **Exercise 02.3 (predict first).** For the second layer's weight matrix W2 (6 inputs,
# 6 outputs, fp32), how many bytes does rank 0 send per step with a batch of 64 samples?

# %%
answer_02_3 = ...
check("02.3", answer_02_3)

# %%
from parlab.data_parallel import layer_traffic

layer_batches = (8, 64)
layers = layer_traffic(FIGURE_8_2, batches=layer_batches)
print(layers.to_string(index=False))
w2 = layers.iloc[2]

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("layer_w2", f"{w2['C_out']} × {w2['C_in']}")
glue("layer_w2_bytes", w2[f"sent, batch {layer_batches[-1]} (B)"])
glue("layer_batch_small", layer_batches[0])
glue("layer_batch_large", layer_batches[-1])

# %% [markdown]
# The slides put the cost of data parallelism at C_in × C_out per layer and step, and the
# table agrees: the gradient has the shape of the weight matrix, however many samples were
# summed into it. Rank 0 sends <span data-glue="layer_w2_bytes">144</span> bytes for the
# <span data-glue="layer_w2">6 × 6</span> weight with a batch of
# <span data-glue="layer_batch_small">8</span> and with a batch of
# <span data-glue="layer_batch_large">64</span>. A larger batch means more computation per
# step for the same traffic, which is why data parallelism likes large batches.
#
# ## 7. Hundreds or thousands of GPUs
#
# The closed forms of `parlab.comm.cost` (they equal the bytes the toy backend logs on
# small runs) scale the count up. Below: bytes through the busiest NIC per step, and the time of
# one gradient all-reduce from the alpha-beta model, against the compute time of the step
# (<span data-glue="flops_per_token">6</span> FLOPs per parameter per token,
# <span data-glue="tokens_per_gpu">16,384</span> tokens per GPU, an H100 at
# <span data-glue="mfu">40%</span> of its <span data-glue="h100_tflops">989</span> TFLOP/s;
# assumptions, not measurements).
#
# * **ring**: per NIC 2(N−1)/N × gradient, which levels off at twice the gradient; its
#   time levels off too, plus 2(N−1) latencies.
# * **naive**: the root's NIC carries (N−1) × gradient: hopeless beyond a few GPUs.
# * **tree** (a binomial tree, not pipelined): every message is the whole gradient. The
#   busiest ranks (the root, and the roots of the subtrees) send about log₂ N of them; half
#   the ranks are leaves and send one. Measured on
#   <span data-glue="tree_ranks_small">4</span> and
#   <span data-glue="tree_ranks_large">8</span> ranks below. This is not how NCCL runs a
#   tree: it cuts the gradient into chunks and streams them through two trees at once, so a
#   GPU sends about twice the gradient, close to the ring, while the latency grows only
#   with log₂ N.
#
# For naive and tree, the time counts the receive phase (the sums travel towards the root)
# and then the send phase (the result travels back), one after the other, so it is twice
# the busiest NIC's bytes divided by its bandwidth. In the ring every GPU sends and receives
# at the same time, so its time is about its bytes over the bandwidth.
#
# GPT-3 175B does not fit on one GPU, so pure data parallelism is a thought experiment
# here; in practice it is combined with tensor and pipeline parallelism (chapter 05), and
# the data-parallel all-reduce then carries each replica's shard of the gradients. DDP also
# overlaps this traffic with backward, so it only costs time where it is longer.

# %%
from parlab.models import (
    FLOPS_PER_PARAMETER_TOKEN, GPT3_175B, H100_BF16_TFLOPS, MFU, compute_seconds, count_parameters
)
from parlab.data_parallel import TOKENS_PER_GPU, sync_cost

params, replicas, nic_gbps = count_parameters(GPT3_175B)["total"], 1024, 400
compute = compute_seconds(params, TOKENS_PER_GPU)
print(f"GPT-3 175B, bf16 gradients, {replicas} GPUs, {nic_gbps} Gb/s NICs; "
      f"compute {compute:.1f} s per step")
cost = {}
for algorithm in ("ring", "naive", "tree"):
    busiest, seconds = cost[algorithm] = sync_cost(params, replicas, nic_gbps, algorithm)
    label = "tree (binomial)" if algorithm == "tree" else algorithm
    print(f"  {label:<15} busiest NIC {busiest / 1e9:>10,.0f} GB per step, "
          f"all-reduce {seconds:>9,.1f} s")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("flops_per_token", FLOPS_PER_PARAMETER_TOKEN)
glue("tokens_per_gpu", TOKENS_PER_GPU, ",")
glue("mfu", MFU, ".0%")
glue("h100_tflops", H100_BF16_TFLOPS, ".0f")
glue("scale_replicas", replicas, ",")
glue("scale_compute_s", compute, ".1f")
glue("scale_ring_s", cost["ring"][1], ".1f")
glue("scale_ring_gb", cost["ring"][0] / 1e9, ",.0f")
glue("scale_tree_gb", cost["tree"][0] / 1e9, ",.0f")
glue("scale_tree_s", cost["tree"][1], ".1f")
glue("scale_naive_h", cost["naive"][1] / 3600, ".0f")

# %% [markdown]
# On <span data-glue="scale_replicas">1,024</span> GPUs the ring's all-reduce takes
# <span data-glue="scale_ring_s">14.0</span> s against
# <span data-glue="scale_compute_s">43.4</span> s of compute, so it can hide behind backward;
# the naive root would need about <span data-glue="scale_naive_h">4</span> hours per step.
# The binomial tree's root sends <span data-glue="scale_tree_gb">3,492</span> GB (the ring's
# NICs <span data-glue="scale_ring_gb">698</span> GB) and needs
# <span data-glue="scale_tree_s">139.7</span> s: that is the price of sending the whole
# gradient in every message, which NCCL's pipelined trees avoid.

# %%
from parlab.comm import one_collective

tree_sizes = (4, 8)
for n in tree_sizes:
    _, tree = run_with_traffic(one_collective, n, "all_reduce", 4, algorithm="tree")
    sent = tree.per_rank()["messages sent"]
    print(f"tree all_reduce on {n:>2} ranks, messages sent per rank: {sent.tolist()}")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("tree_ranks_small", tree_sizes[0])
glue("tree_ranks_large", tree_sizes[-1])
glue("tree_max_large", int(sent.max()))
glue("tree_leaves_large", int((sent == 1).sum()))

# %% [markdown]
# On <span data-glue="tree_ranks_large">8</span> ranks the root sends
# <span data-glue="tree_max_large">3</span> messages,
# log₂ <span data-glue="tree_ranks_large">8</span>, while
# <span data-glue="tree_leaves_large">4</span> leaves send one each: "log₂ N per rank" is
# true only of the busiest rank.

# %%
from parlab.viz.widgets import scaling_explorer

scaling_explorer()

# %% [markdown]
# ## 8. The links, and lossless transport
#
# ### Which link carries the exchange
#
# The book names the links the gradients can take: PCIe and NVLink inside a server,
# InfiniBand, Ethernet and "wireless" between servers. What each carries today, per
# direction:
#
# * **NVLink**: <span data-glue="links_nvlink_gbs">450</span> GB/s for each H100 to the
#   other GPUs of its server, through the server's NVSwitches (`parlab.hardware`).
# * **PCIe**: an H100's PCIe Gen5 x16 link carries 128 GB/s counting both directions,
#   64 GB/s each way (NVIDIA's H100 datasheet). In an NVLink server it joins the GPU to the
#   host and to its NIC, and GPUDirect RDMA lets the NIC read the GPU's memory across it
#   without a copy through the host; GPUs without NVLink exchange over PCIe itself.
# * **InfiniBand and Ethernet**: one NIC per GPU of
#   <span data-glue="links_nic_gbps">400</span> Gb/s, that is
#   <span data-glue="links_nic_gbs">50</span> GB/s each way (`parlab.comm.topology`: an NDR
#   InfiniBand port, or Ethernet at the same speed carrying RDMA as RoCE). NVLink is
#   <span data-glue="links_ratio">9</span> times faster. Both fabrics are built to lose
#   almost nothing, for the reasons below.
# * **"Wireless"**: no training cluster joins its servers by radio. A radio channel is
#   shared by everyone on it, loses frames to interference and resends them, and its
#   latency varies from frame to frame: the opposite of what the book itself asks of the
#   network, low latency and no loss. Wireless does carry distributed learning of another
#   kind, federated learning across phones, which exchanges updates rarely and copes with
#   devices that drop out.
#
# The book also says that in the two-GPU example the GPUs "can use 100% of their NICs".
# Whether a NIC is used at all depends on where A1 and A2 sit. The rail-optimized layout of
# Figure 8-19 (chapter 04), here with servers of
# <span data-glue="links_per_server">8</span> GPUs, each GPU with its own NIC on its own
# rail, gives each pair its link; the exchange is the all-reduce of GPT-2
# small's fp32 gradient from section 5, <span data-glue="links_grad_mb">498</span> MB.

# %%
from parlab.comm import NVLINK, nic
from parlab.experiments import two_gpu_links
from parlab.hardware import NIC_GBPS

gpt2_grad = 4 * sum(p.numel() for p in gpt2)  # fp32 gradient of GPT-2 small (section 5)
per_server = 8  # GPUs per server
links = two_gpu_links(gpt2_grad, nic_gbps=NIC_GBPS, gpus_per_server=per_server)
print(links.to_string(index=False))
rail = links[links["link"] == "rail"].iloc[0]

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("links_nvlink_gbs", NVLINK.bandwidth / 1e9, ".0f")
glue("links_nic_gbps", NIC_GBPS)
glue("links_nic_gbs", nic(NIC_GBPS).bandwidth / 1e9, ".0f")
glue("links_ratio", NVLINK.bandwidth / nic(NIC_GBPS).bandwidth, ".0f")
glue("links_per_server", per_server)
glue("links_grad_mb", gpt2_grad / 1e6, ".0f")
glue("links_rail_busy", rail["port busy (%)"], ".1f")
glue("links_speedup", rail["all-reduce (ms)"] / links.iloc[0]["all-reduce (ms)"], ".0f")

# %% [markdown]
# On two servers the claim holds, NIC by NIC. Each GPU has its own NIC; in a ring of two it
# sends half of the gradient and receives the other half in each of the two steps, both at
# once, so its NIC is busy in both directions for
# <span data-glue="links_rail_busy">100.0</span> % of the exchange. Across the spine
# (A1 and B2, different rails) the bytes are the same and only the latency grows. In one
# server the same pair talks over NVLink, <span data-glue="links_speedup">9</span> times
# faster, and the NICs carry nothing at all. In a server with fewer NICs than GPUs, the
# GPUs that share a NIC divide it, and none of them can use all of it.
#
# ### Lossless matters
#
# The chapter asks for lossless transport, because training pauses if even one packet goes
# missing during the synchronization, and without a snapshot it must start over. Two
# different failures hide in that warning:
#
# * **A lost packet** is not fatal. RDMA transports (InfiniBand, RoCE) detect the loss and
#   retransmit; the collective finishes, late. Loss costs latency and throughput, which is
#   why training fabrics are built to be nearly lossless (credit-based flow control, PFC):
#   a slower all-reduce makes every step slower, on every GPU.
# * **A failed transfer** is fatal: a link, NIC or host that stays down, so the data never
#   arrives. A collective is a promise that every rank takes part, so the ranks waiting for
#   it wait until a timeout, and the job stops.
#
# The book's warning that a single lost packet pauses training merges the two: the second
# stops a run, the first only slows it. Below is the second kind.
#
# With a cap of <span data-glue="fail_cap">200</span> bytes a step syncs
# <span data-glue="fail_buckets">2</span> buckets. We make rank
# <span data-glue="fail_rank">1</span> lose its transfer of bucket
# <span data-glue="fail_bucket">1</span> (buckets are counted from 0) in step
# <span data-glue="fail_step">5</span>. Every rank keeps a journal of the buckets it sent and
# the updates it applied, and rank 0 saves a checkpoint every
# <span data-glue="fail_every">3</span> steps.

# %%
import tempfile

journal, checkpoints = tempfile.TemporaryDirectory(), tempfile.TemporaryDirectory()
faulty = spec.replace(steps=8, bucket_cap_bytes=200)
fail_rank, fail_step, fail_bucket = fail_at = (1, 5, 1)
every = 3
try:
    dp.train(faulty, 2, fail_at=fail_at, journal_dir=journal.name,
             checkpoint_dir=checkpoints.name, checkpoint_every=every)
except RankError as err:
    print(f"RankError: rank {err.rank} raised {err.exc_type}")
    print(err.rank_traceback.strip().splitlines()[-1])
journals = {rank: dp.read_journal(journal.name, rank) for rank in (0, 1)}
for rank, lines in journals.items():
    print(f"journal of rank {rank}, from step {fail_step - 1} on:")
    for line in lines:
        if int(line.split(":")[0].split()[1]) >= fail_step - 1:
            print("    " + line)
last_update = {int(line.split(":")[0].split()[1])
               for lines in journals.values() for line in lines if "update applied" in line}

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("fail_rank", fail_rank)
glue("fail_bucket", fail_bucket)
glue("fail_step", fail_step)
glue("fail_cap", faulty.bucket_cap_bytes)
glue("fail_buckets", len(dp.make_buckets(list(dp.make_model(faulty).parameters()),
                                         faulty.bucket_cap_bytes)))
glue("fail_every", every)
glue("fail_last_update", max(last_update))

# %% [markdown]
# Rank 0 had already received the average of every bucket before the lost one, but no rank
# applied a partial update: the update only happens once every bucket has come back. Both
# journals end with the update of step <span data-glue="fail_last_update">4</span>, and the
# same weights. The job stopped as a whole, and the replicas are still copies of one model:
# a failure that stops the job costs time, but it is better than going on with wrong
# numbers.
#
# What would "going on" look like? Below, rank <span data-glue="lose_rank">1</span> silently
# keeps its own gradient in step <span data-glue="lose_step">2</span>, as if its peers' data
# had been dropped and nobody noticed. Nothing fails, and the two replicas are no longer
# copies of one model:

# %%
lose_rank, lose_step = lose_at = (1, 2)
drifted = dp.train(spec.replace(steps=10), 2, lose_at=lose_at)
print("replicas differ after the silent loss (by more than 1e-4):",
      max_difference(drifted[0].state, drifted[1].state) > 1e-4)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("lose_rank", lose_rank)
glue("lose_step", lose_step)

# %% [markdown]
# Now the checkpoint. The failed run saved the state after step
# <span data-glue="resume_from">3</span> (weights and momentum); a new launch resumes there
# and runs steps <span data-glue="resume_first">4</span> to
# <span data-glue="resume_last">8</span>. Its weights equal an uninterrupted run's exactly.
# The price: step <span data-glue="fail_last_update">4</span> was finished but not saved, so
# it is computed twice.

# %%
start = dp.latest_checkpoint(checkpoints.name)
resumed = dp.train(faulty, 2, start=start)
uninterrupted = dp.train(faulty, 2)
print(f"resumed from the checkpoint after step {start['step']}, ran {len(resumed[0].losses)} steps")
print("final weights equal to an uninterrupted run:",
      max_difference(resumed[0].state, uninterrupted[0].state) == 0)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("resume_from", start["step"])
glue("resume_first", start["step"] + 1)
glue("resume_last", start["step"] + len(resumed[0].losses))

# %% [markdown]
# On the book's scale this is money. `parlab.memory.energy` prices the chapter's run
# (<span data-glue="cost_gpus">50,000</span> GPUs at <span data-glue="cost_watts">350</span> W
# for <span data-glue="cost_days">60</span> days at
# $<span data-glue="cost_usd_kwh">0.10</span> per kWh) and what a failure
# <span data-glue="cost_hours_in">2</span> hours into day
# <span data-glue="cost_days">60</span> throws away, without a checkpoint and with one every
# <span data-glue="cost_every">3</span> hours (chapter 01 explores the trade-off).

# %%
from parlab.memory import failure_cost, training_cost

days, hours_in, every_h = 60, 2, 3
book_run = training_cost(gpus=50_000, watts_per_gpu=350, days=days, usd_per_kwh=0.10)
at = (days - 1) * 24 + hours_in  # into the last day
lost, lost_with = failure_cost(book_run, at), failure_cost(book_run, at, every_h)
print(book_run)
print(f"failure after {at:,} h, no checkpoint:          ${lost:>12,.0f}")
print(f"failure after {at:,} h, checkpoint every {every_h} h:   ${lost_with:>12,.0f}")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("cost_gpus", book_run.gpus, ",")
glue("cost_watts", book_run.watts_per_gpu, ".0f")
glue("cost_days", days)
glue("cost_usd_kwh", book_run.usd_per_kwh, ".2f")
glue("cost_hours_in", hours_in)
glue("cost_every", every_h)
glue("cost_lost", lost, ",.0f")
glue("cost_lost_with", lost_with, ",.0f")

# %% [markdown]
# The checkpoints turn a loss of $<span data-glue="cost_lost">2,481,500</span> into one of
# $<span data-glue="cost_lost_with">3,500</span>: only the work since the last one is redone.

# %% [markdown]
# ## 9. One more exercise
#
# Exercises 02.1 to 02.3 are in sections 5 and 6, each before the cell that prints its
# answer. The last one is code of your own.
#
# **Exercise 02.4 (write and run).** Write `average(grads)`: on each rank, average a list of
# gradient tensors in place across all ranks with a single `dist.all_reduce` call (pack them
# into one flat bucket, as in section 5). The checker runs it on a few ranks, counts your
# calls and compares the result with the true average.

# %%
def average(grads):
    ...  # your code here


check("02.4", ...)  # when your function is ready: check("02.4", average)

# %% [markdown]
# Worked solutions are in `pkg/parlab/exercises/ch02_solutions.py`. This notebook does not
# import it; open it once you have tried.

# %% [markdown]
# ## What's next
#
# Data parallelism needs the whole model on every GPU. Chapter 03 cuts the model into
# stages instead (Figures 8-3 to 8-14), and shows how pipeline and data parallelism
# combine.
