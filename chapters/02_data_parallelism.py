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
# whole model and half of the data. GPU A1 trains on micro-batches 1 to 4, GPU A2 on 5 to
# 8. The forward pass needs no network at all. After the backward pass the two GPUs add up
# their gradients and divide by two, so both apply the same update and stay identical
# copies. The chapter then warns that the traffic grows with hundreds or thousands of GPUs,
# and that a single lost transfer stops the whole job (section 8 separates what holds in
# that warning from what it overstates).
#
# One correction first. The book's notes motivate data parallelism by a dataset too large
# for one GPU, with layers spread over GPUs. Neither is what it does: every GPU holds *all*
# the layers, and a dataset of any size streams through one GPU batch by batch. What data
# parallelism buys is throughput: N replicas process N times the samples per step, at the
# price of one gradient synchronization per step.
#
# In this notebook you will:
#
# 1. split a batch over ranks, and see what happens when it does not split;
# 2. run Figure 8-2 for real on two ranks, A1 and A2, with every tensor the figure names:
#    micro-batches, local gradients, gradients received, the average, the new weights;
# 3. train any `torch.nn.Module` on 1, 2 and 4 ranks and check that it learns exactly what
#    one process learns on the whole batch;
# 4. run the same training with PyTorch's production tool, `DistributedDataParallel`;
# 5. pack gradients into buckets and see why frameworks do it;
# 6. count the bytes each GPU sends, with the ring and the naive all-reduce, and scale the
#    count to thousands of GPUs;
# 7. make one transfer fail and watch the job stop instead of silently going wrong, then
#    resume from a checkpoint;
# 8. solve four exercises.
#
# Book figure: 8-2 (and the slides' communication cost of data parallelism). Everything
# runs on a CPU in well under a minute.

# %% [markdown]
# ## 1. Splitting the batch
#
# The batch of Figure 8-2 has 8 micro-batches; here each holds 2 samples, so 16 samples in
# all. `split_batch` says which samples each rank trains on: consecutive micro-batches, the
# first four for rank 0 (A1), the rest for rank 1 (A2).

# %%
import torch
import torch.distributed as dist

from parlab import data_parallel as dp
from parlab.launch import RankError, run
from parlab.viz import show

for rank, shares in enumerate(dp.split_batch(samples=16, micro_batches=8, world_size=2)):
    print(f"rank {rank}: micro-batches (first sample, last sample + 1) = {shares}")

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
# The tests train uneven splits against one process.

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
# A2's gradient. Each rank runs its four micro-batches as one forward pass of 8 rows; with
# equal micro-batches that gives the same gradient as accumulating them one by one.

# %%
from parlab.viz.plots import figure_8_2
from parlab.data_parallel import run_figure_8_2

book = run_figure_8_2(how="all_gather")
print(book.table())

# %% [markdown]
# Each row shows the first row of the gradient of layer 1's weights (∇W1, 6 × 4). A1's
# "remote" row is A2's "local" row, and the other way round. Both compute the same
# average, so both end with the same weights, and these equal one process trained on all
# 8 micro-batches at once.

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
# * With more than two ranks, the all-gather version leaves each rank to add up its peers'
#   gradients in its own order, and floating-point addition is not associative, so
#   replicas can differ in the last bits. An all-reduce returns the very same sum to every
#   rank; that is one reason production code uses it. The output below depends on the
#   CPU's floating-point kernels, so nbval ignores it.

# %%
# NBVAL_IGNORE_OUTPUT
four = run_figure_8_2(world_size=4, how="all_gather")
print("4 ranks, all-gather: identical bits:", four.replicas_identical(),
      f"| largest difference to one process: {four.max_difference():.1e}")

# %% [markdown]
# Explore: the number of replicas, the exchange and the number of steps. Each change runs
# real ranks again.

# %%
from parlab.viz.widgets import book_step_explorer

book_step_explorer()

# %% [markdown]
# ## 3. Any PyTorch model, on 1, 2 and 4 ranks
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
# Now 30 steps of SGD with momentum, on 1, 2 and 4 ranks, against one process that sees
# the whole batch every step. `dp.train` cuts each run into 5 launches; each resumes from
# the previous one's in-memory checkpoint (weights and momentum), and the progress bar
# advances per launch.
#
# The bar shows elapsed time and speed, which differ on every run, so this cell is marked
# `# NBVAL_IGNORE_OUTPUT` and prints nothing else; the next cell prints the results, and
# nbval compares those. (Writing the bar to stderr without timings would also work, but
# then the notebook's bar would look unlike the one readers see everywhere else.)

# %%
# NBVAL_IGNORE_OUTPUT
spec = dp.TrainSpec(steps=30, lr=0.1, momentum=0.9)
reference = dp.reference(spec)
runs = {n: dp.train(spec, n, segments=5, progress=True) for n in (1, 2, 4)}

# %%
from parlab.viz.plots import loss_curves

for n, ranks in runs.items():
    identical = all(dp.max_difference(r.state, ranks[0].state) == 0 for r in ranks)
    print(f"{n} rank(s): replicas identical: {identical}; equal to one process (1e-6): "
          f"{dp.max_difference(ranks[0].state, reference.state) < 1e-6}; "
          f"final loss {sum(r.losses[-1] for r in ranks) / n:.4f} "
          f"(one process: {reference.losses[-1]:.4f})")
show(loss_curves(runs, reference.losses))

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
# | buckets | cap in bytes, last layers first | `bucket_cap_mb` (25 MiB default), same order |
# | average | sum, then divide by N | divide by N, then sum |
#
# Same model, same data, same optimizer, 10 steps each:

# %%
short = spec.replace(steps=10, bucket_cap_bytes=200)
hand = dp.train(short, 2)
ddp = dp.train(short, 2, engine="ddp")
one = dp.reference(short)
print("                      hand-built   DDP")
print("replicas identical   ", *(f"{dp.max_difference(r[0].state, r[1].state) == 0!s:<12}"
                               for r in (hand, ddp)))
print("= one process (1e-6) ", *(f"{dp.max_difference(r[0].state, one.state) < 1e-6!s:<12}"
                               for r in (hand, ddp)))
print("hand-built = DDP (1e-6):", dp.max_difference(hand[0].state, ddp[0].state) < 1e-6)

# %% [markdown]
# ## 5. Buckets: fewer, larger messages
#
# Our small model has 6 parameter tensors. Synced one by one, that is 6 all-reduce calls
# per step; packed into buckets of at most 200 bytes, 3; in one bucket, 1. The bytes are
# the same, and so are the weights.

# %%
for cap in (None, 200, 10**6):
    ranks = dp.train(spec.replace(steps=2, bucket_cap_bytes=cap), 2)
    print(f"bucket cap {cap!s:>7} bytes: {ranks[0].calls[0]} all-reduce calls, "
          f"{ranks[0].sync_bytes[0]} bytes per step, equal to one process: "
          f"{dp.max_difference(ranks[0].state, dp.reference(spec.replace(steps=2)).state) < 1e-6}")

# %% [markdown]
# Why it matters: every message pays a fixed start-up cost (latency, α) before its bytes
# flow at the link's bandwidth (β): `time = α + bytes / β` per message, and a ring
# all-reduce over N GPUs is 2(N−1) such steps. The table applies `parlab.comm.cost`'s
# alpha-beta model to GPT-2 small (124 M parameters in 196 tensors, fp32) on 64 GPUs with
# 400 Gb/s NICs: the bytes cost the same in every row, the latency does not.
#
# Why not one bucket for everything? Because the sync of a bucket can start as soon as its
# gradients exist, while backward is still computing earlier layers. A few medium buckets
# let communication overlap computation; DDP's default cap is 25 MiB.

# %%
from parlab.models import GPT, GPT2_SMALL
from parlab.data_parallel import bucketing_table

with torch.device("meta"):  # shapes only, no memory
    gpt2 = list(GPT(GPT2_SMALL).parameters())
print(bucketing_table(gpt2, gpus=64, gbps=400).to_string(index=False))

# %% [markdown]
# ## 6. Counting bytes with the toy backend
#
# The toy backend runs the ordinary `dist.all_reduce` with algorithms written out as
# point-to-point messages, and logs each message. We train Figure 8-2's model with all
# gradients in one bucket, with the **ring** (reduce-scatter, then all-gather: each rank
# sends 2(N−1) chunks of 1/N of the gradient) and the **naive** algorithm (everyone sends
# everything to rank 0, which adds and sends the result back), and count what each GPU
# sent per step.
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
print(f"forward pass only:        {len(forward_log)} messages, {forward_log.total_bytes} bytes")
print(f"forward + backward + sync: {len(step_log)} messages, {step_log.total_bytes} bytes")

# %% [markdown]
# Now the bucketed synchronization of Figure 8-2's model, counted per GPU and step.

# %%
from parlab.data_parallel import FIGURE_8_2, gradient_bytes, traffic_table
from parlab.viz.plots import traffic_figure

one_bucket = FIGURE_8_2.replace(steps=2, bucket_cap_bytes=10**6)
size = gradient_bytes(one_bucket)
table = traffic_table(one_bucket, world_sizes=(2, 4), algorithms=("ring", "naive"))
print(f"gradient: {size} bytes; ring closed form 2(N-1)/N x {size}")
print(table.to_string(index=False))
show(traffic_figure(table, size))

# %% [markdown]
# * On **2 GPUs** ring and naive are the same: each GPU sends its whole gradient once.
# * On **4 GPUs** the ring spreads the work: every GPU sends about 1.5 × the gradient
#   (exactly 2(N−1)/N on average; 86 numbers do not split into 4 equal chunks, so single
#   GPUs differ by a few bytes). The naive root sends 3 × the gradient and receives as
#   much, while the others idle: its NIC is the bottleneck, and it gets worse with every
#   GPU added.
#
# **Traffic per layer does not depend on the batch.** The slides put the cost of data
# parallelism at C_in × C_out per layer and step: the gradient has the shape of the weight
# matrix, whatever the number of samples it was summed over. One all-reduce per tensor on
# 2 ranks, with batches of 8 and 64:

# %%
from parlab.data_parallel import layer_traffic

print(layer_traffic(FIGURE_8_2, batches=(8, 64)).to_string(index=False))

# %% [markdown]
# A larger batch means more computation per step for the same traffic, which is why data
# parallelism likes large batches.
#
# ## 7. Hundreds or thousands of GPUs
#
# The closed forms of `parlab.comm.cost` (checked against the toy backend's logs by its
# tests) scale the count up. Below: bytes through the busiest NIC per step, and the time of
# one gradient all-reduce from the alpha-beta model, against the compute time of the step
# (6 FLOPs per parameter per token, 8 × 2048 tokens per GPU, an H100 at 40 % of its
# 989 TFLOP/s; assumptions, not measurements).
#
# * **ring**: per NIC 2(N−1)/N × gradient, which levels off at twice the gradient; its
#   time levels off too, plus 2(N−1) latencies.
# * **naive**: the root's NIC carries (N−1) × gradient: hopeless beyond a few GPUs.
# * **tree**: every message is the whole gradient. The busiest ranks (the root, and the
#   roots of the subtrees) send about log₂ N of them; half the ranks are leaves and send
#   one. Measured on 8 and 16 ranks below.
#
# GPT-3 175B does not fit on one GPU, so pure data parallelism is a thought experiment
# here; in practice it is combined with tensor and pipeline parallelism (chapter 05), and
# the data-parallel all-reduce then carries each replica's shard of the gradients. DDP also
# overlaps this traffic with backward, so it only costs time where it is longer.

# %%
from parlab.models import GPT3_175B, count_parameters
from parlab.data_parallel import TOKENS_PER_GPU, sync_cost
from parlab.models import compute_seconds

params = count_parameters(GPT3_175B)["total"]
print(f"GPT-3 175B, bf16 gradients, 1024 GPUs, 400 Gb/s NICs; "
      f"compute {compute_seconds(params, TOKENS_PER_GPU):.1f} s per step")
for algorithm in ("ring", "naive", "tree"):
    busiest, seconds = sync_cost(params, 1024, 400, algorithm)
    print(f"  {algorithm:<6} busiest NIC {busiest / 1e9:>10,.0f} GB per step, "
          f"all-reduce {seconds:>9,.1f} s")

# %%
from parlab.comm import one_collective
from parlab.viz import glue

for n in (8, 16):
    _, tree = run_with_traffic(one_collective, n, "all_reduce", 4, algorithm="tree")
    sent = tree.per_rank()["messages sent"]
    print(f"tree all_reduce on {n:>2} ranks, messages sent per rank: {sent.tolist()}")
    glue(f"tree_max_{n}", int(sent.max()))
    glue(f"tree_leaves_{n}", int((sent == 1).sum()))

# %% [markdown]
# On 16 ranks the root sends <span data-glue="tree_max_16">4</span> messages, log₂ 16, while
# <span data-glue="tree_leaves_16">8</span> leaves send one each: "log₂ N per rank" is true
# only of the busiest rank.

# %%
from parlab.viz.widgets import scaling_explorer

scaling_explorer()

# %% [markdown]
# ## 8. Lossless matters
#
# The chapter says the network must not lose a transfer, because training stops when one
# goes missing. Two different failures hide in that sentence:
#
# * **A lost packet** is not fatal. RDMA transports (InfiniBand, RoCE) detect the loss and
#   retransmit; the collective finishes, late. Loss costs latency and throughput, which is
#   why training fabrics are built to be nearly lossless (credit-based flow control, PFC):
#   a slower all-reduce makes every step slower, on every GPU.
# * **A failed transfer** is fatal: a link, NIC or host that stays down, so the data never
#   arrives. A collective is a promise that every rank takes part, so the ranks waiting for
#   it wait until a timeout, and the job stops.
#
# The book's "one lost packet stops the run" merges the two: the second stops a run, the
# first only slows it. Below is the second kind.
#
# We make rank 1 lose its transfer of bucket 1 in step 5 (with 200-byte buckets, a step
# syncs 3 buckets). Every rank keeps a journal of the buckets it sent and the updates it
# applied, and rank 0 saves a checkpoint every 3 steps.

# %%
import tempfile

journal, checkpoints = tempfile.TemporaryDirectory(), tempfile.TemporaryDirectory()
faulty = spec.replace(steps=8, bucket_cap_bytes=200)
try:
    dp.train(faulty, 2, fail_at=(1, 5, 1), journal_dir=journal.name,
             checkpoint_dir=checkpoints.name, checkpoint_every=3)
except RankError as err:
    print(f"RankError: rank {err.rank} raised {err.exc_type}")
    print(err.rank_traceback.strip().splitlines()[-1])
for rank in (0, 1):
    print(f"journal of rank {rank}, from step 4 on:")
    for line in dp.read_journal(journal.name, rank):
        if int(line.split(":")[0].split()[1]) >= 4:
            print("    " + line)

# %% [markdown]
# Rank 0 had already received the average of bucket 0 for step 5, but no rank applied a
# partial update: the update only happens once every bucket has come back. Both journals
# end with the update of step 4, and the same weights. The job stopped as a whole, which is what the
# chapter asks of the network: it is better to stop than to go on with wrong numbers.
#
# What would "going on" look like? Below, rank 1 silently keeps its own gradient in step 2,
# as if its peers' data had been dropped and nobody noticed. Nothing fails, and the two
# replicas are no longer copies of one model:

# %%
drifted = dp.train(spec.replace(steps=10), 2, lose_at=(1, 2))
print("replicas differ after the silent loss (by more than 1e-4):",
      dp.max_difference(drifted[0].state, drifted[1].state) > 1e-4)

# %% [markdown]
# Now the checkpoint. The failed run saved the state after step 3 (weights and momentum);
# a new launch resumes there and runs steps 4 to 8. Its weights equal an uninterrupted
# run's exactly. The price: step 4 was finished but not saved, so it is computed twice.

# %%
start = dp.latest_checkpoint(checkpoints.name)
resumed = dp.train(faulty, 2, start=start)
uninterrupted = dp.train(faulty, 2)
print(f"resumed from the checkpoint after step {start['step']}, ran {len(resumed[0].losses)} steps")
print("final weights equal to an uninterrupted run:",
      dp.max_difference(resumed[0].state, uninterrupted[0].state) == 0)

# %% [markdown]
# On the book's scale this is money. `parlab.memory.energy` prices the chapter's run (50,000 GPUs
# at 350 W for 60 days at $0.10 per kWh) and what a failure two hours into day 60 throws
# away, without a checkpoint and with one every 3 hours (chapter 01 explores the
# trade-off).

# %%
from parlab.memory import failure_cost, training_cost

book_run = training_cost(gpus=50_000, watts_per_gpu=350, days=60, usd_per_kwh=0.10)
at = 59 * 24 + 2  # two hours into day 60
print(book_run)
print(f"failure after {at:,} h, no checkpoint:          ${failure_cost(book_run, at):>12,.0f}")
print(f"failure after {at:,} h, checkpoint every 3 h:   ${failure_cost(book_run, at, 3):>12,.0f}")

# %% [markdown]
# ## 9. Exercises
#
# Replace each `...` with your answer and run the cell. The checker says whether you are
# right and why, without giving the answer away.
#
# **Exercise 02.1.** Four ranks each hold 8 samples of a 32-sample batch and compute the mean
# loss over their own samples. After the all-reduce has summed their gradients, what must
# each rank divide the sum by, so that the update equals one process training on the mean
# loss over all 32 samples?

# %%
from parlab.exercises import check

check("02.1", ...)

# %% [markdown]
# **Exercise 02.2.** Eight GPUs synchronize 1.2 GB of gradients with a ring all-reduce. How
# many GB does each GPU send per step?

# %%
check("02.2", ...)

# %% [markdown]
# **Exercise 02.3.** A fully connected layer has C_in = 1024 inputs and C_out = 4096 outputs
# (fp32 weights; ignore the bias). The batch grows from 32 to 256 samples per GPU. How many
# bytes does data parallelism synchronize for this layer per step?

# %%
check("02.3", ...)

# %% [markdown]
# **Exercise 02.4.** Write `average(grads)`: on each rank, average a list of gradient tensors
# in place across all ranks with a single `dist.all_reduce` call (pack them into one flat
# bucket). The checker runs it on 2 and 3 ranks and counts your calls.

# %%
def average(grads):
    ...  # your code here


check("02.4", ...)  # when your function is ready: check("02.4", average)

# %% [markdown]
# ## What's next
#
# Data parallelism needs the whole model on every GPU. Chapter 03 cuts the model into
# stages instead (Figures 8-3 to 8-14), and shows how pipeline and data parallelism
# combine.
