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
# # 00 · Getting started: real ranks from a notebook cell
#
# Every chapter of this companion runs **real processes** that talk through
# `torch.distributed`, the same library that trains large models on thousands of GPUs.
# Each process is called a **rank**. On a laptop the ranks are CPU processes that talk over
# the loopback network with the *gloo* backend; on a machine with GPUs they can be one
# process per GPU talking through *NCCL*.
#
# In this notebook you will:
#
# 1. check what your machine offers;
# 2. start <span data-glue="ranks">4</span> ranks from a cell and get their answers back;
# 3. watch the four basic collectives move real tensors: `all_reduce`, `all_gather`,
#    `broadcast`, and point-to-point `send`/`recv`;
# 4. see what happens when one rank fails, or waits forever;
# 5. switch to the companion's own "toy" backend and see every byte that travels: who sent
#    how much to whom, in which step, and what it would cost on a real cluster, then run
#    any collective on <span data-glue="explorer_min_ranks">2</span> to
#    <span data-glue="explorer_max_ranks">8</span> ranks yourself with an explorer;
# 6. solve four small exercises.
#
# The later chapters use exactly these operations to build data, pipeline and tensor
# parallelism (Figures 8-2 to 8-19 of the book).

# %% [markdown]
# ## 1. What this machine offers
#
# The output below depends on your machine (CPU count, GPUs), so yours will differ.

# %% tags=["nbval-ignore-output"]
import torch
import torch.distributed as dist

from parlab import launch
from parlab.launch import run

launch.environment()

# %% [markdown]
# ## 2. Four ranks, one cell
#
# `run(fn, world_size)` starts `world_size` processes, runs `fn` in each of them with
# `torch.distributed` already initialised, and returns what each rank returned, **in rank
# order**. Whatever a rank prints comes back too, labelled with its rank.

# %%
def hello():
    print("my rank is", dist.get_rank())
    return f"rank {dist.get_rank()} of {dist.get_world_size()}"


ranks = 4
run(hello, ranks)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
from parlab.viz import glue

glue("ranks", ranks)

# %% [markdown]
# The first launch in a notebook starts a helper process that imports PyTorch once; every
# later launch forks ranks from it, so it takes about a tenth of a second. (Timings vary
# from machine to machine.)

# %% tags=["nbval-ignore-output"]
import time

start = time.perf_counter()
run(hello, ranks)
print(f"a {ranks}-rank launch took {time.perf_counter() - start:.3f} s")

# %% [markdown]
# ## 3. The four basic collectives
#
# A **collective** is a call that every rank of a group makes together; together they move
# data between the ranks. Each function below returns what its rank held *before* and
# *after* the call, and `show_collective` prints a table and draws it.
#
# ### all_reduce: everyone gets the sum
# Rank *r* starts with `[10r, 10r+1, 10r+2]`. After `all_reduce` every rank holds the
# element-wise sum. Data parallelism (chapter 02) uses this to add up the gradients of all
# replicas.

# %%
from parlab.viz.plots import show_collective


def all_reduce_demo():
    x = torch.arange(3.0) + 10 * dist.get_rank()
    before = x.clone()
    dist.all_reduce(x)  # SUM by default
    return before, x


show_collective(run(all_reduce_demo, 4), "all_reduce (SUM)")

# %% [markdown]
# ### all_gather: everyone gets everyone's piece
# Each rank contributes its own slice; afterwards every rank holds all the slices in rank
# order. Tensor parallelism (chapter 04) uses this to reassemble a layer's output that was
# computed in pieces.

# %%
def all_gather_demo():
    mine = torch.tensor([float(dist.get_rank())] * 2)
    pieces = [torch.empty(2) for _ in range(dist.get_world_size())]
    dist.all_gather(pieces, mine)
    return mine, torch.cat(pieces)


show_collective(run(all_gather_demo, 4), "all_gather")

# %% [markdown]
# ### broadcast: one rank's tensor goes to everyone
# The book's tensor-parallel attention (Figure 8-18) starts this way: GPU A1 looks up the
# embeddings and broadcasts them to its partner.

# %%
def broadcast_demo():
    x = torch.tensor([3.0, 1.0, 4.0]) if dist.get_rank() == 0 else torch.zeros(3)
    before = x.clone()
    dist.broadcast(x, src=0)
    return before, x


show_collective(run(broadcast_demo, 4), "broadcast from rank 0")

# %% [markdown]
# ### send and recv: one rank to one rank
# Pipeline parallelism (chapter 03) moves activations forward and errors backward between
# neighbouring stages with point-to-point transfers. Here each rank passes its value to the
# next rank around a ring; `isend`/`irecv` start both transfers before waiting, so no rank
# blocks the others.

# %%
def ring_shift_demo():
    rank, size = dist.get_rank(), dist.get_world_size()
    mine = torch.tensor([100.0 + rank])
    received = torch.zeros(1)
    requests = [dist.isend(mine, (rank + 1) % size), dist.irecv(received, (rank - 1) % size)]
    for request in requests:
        request.wait()
    return mine, received


show_collective(run(ring_shift_demo, 4), "send to the next rank, recv from the previous")

# %% [markdown]
# ## 4. When a rank fails
#
# On a real cluster one failing GPU stops the whole job: the other ranks wait for a
# partner that will never answer. The launcher turns that into an error you can read: it
# names the rank, shows its traceback, and stops every other rank.

# %%
def unlucky():
    if dist.get_rank() == 2:
        raise ValueError("rank 2 read a corrupt micro-batch")
    dist.all_reduce(torch.ones(1))


try:
    run(unlucky, 4)
except launch.RankError as err:
    print("failed rank:    ", err.rank)
    print("exception:      ", err.exc_type)
    print("last trace line:", err.rank_traceback.strip().splitlines()[-1])

# %% [markdown]
# A rank that never makes its collective call is worse: the others would wait forever.
# Every launch has a `timeout` (<span data-glue="timeout_default">60</span> s by default); here
# <span data-glue="timeout_here">1</span> s.

# %%
def forgetful():
    if dist.get_rank() != 1:  # rank 1 forgets to take part
        dist.all_reduce(torch.ones(1))


timeout = 1
try:
    run(forgetful, 3, timeout=timeout)
except launch.RankTimeoutError as err:
    print("still running at the timeout:", err.pending)
    print(str(err).split(". ")[0])

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("timeout_default", launch.DEFAULT_TIMEOUT, "g")
glue("timeout_here", timeout, "g")

# %% [markdown]
# ## 5. What travels between the ranks: the toy backend
#
# gloo and NCCL hide *how* a collective moves data. The companion ships a third backend,
# `"toy"`, that runs the textbook algorithms itself, using only point-to-point messages,
# and writes every message into a log. Your code does not change: the same
# `dist.all_reduce` runs, only `backend="gloo"` becomes `backend="toy"`. First, check that
# both give the same answer for the `all_reduce_demo` from section 3.

# %%
gloo = run(all_reduce_demo, 4, backend="gloo")
toy = run(all_reduce_demo, 4, backend="toy")
print("same result on every rank:", all(torch.equal(g[1], t[1]) for g, t in zip(gloo, toy)))

# %% [markdown]
# Now a tensor of <span data-glue="tensor_values">16</span> float32 values
# (<span data-glue="tensor_bytes">64</span> bytes), about the gradient of a very small layer.
# `run_with_traffic` runs the function with the toy backend and brings back every rank's
# log, merged so that each message appears once. The default algorithm is the **ring**:
# the tensor is cut into <span data-glue="ring_chunks">4</span> chunks of
# <span data-glue="ring_message_bytes">16</span> bytes; in
# <span data-glue="ring_half_steps">3</span> *reduce-scatter* steps each rank passes
# a chunk to its right-hand neighbour, which adds its own share, until every rank owns one
# fully summed chunk; in <span data-glue="ring_half_steps">3</span> *all-gather* steps the
# summed chunks travel once more around the ring.

# %%
from parlab.comm import run_with_traffic


def sum_gradients(values):
    grad = torch.full((values,), float(dist.get_rank()))
    dist.all_reduce(grad)
    return grad[0].item()


values = 16
tensor_bytes = torch.empty(values).nbytes  # float32
results, ring = run_with_traffic(sum_gradients, ranks, values, algorithm="ring")
print("results:", results)
print(ring.to_pandas().head(8).to_string(index=False))
print(f"... {len(ring)} messages, {ring.total_bytes()} bytes in all")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("tensor_values", values)
glue("tensor_bytes", tensor_bytes)

# %% [markdown]
# The same log as tables: per rank, and per step.

# %%
per_rank = ring.per_rank()
print(per_rank.to_string())
print()
print(ring.per_step().to_string(index=False))
sent = int(per_rank["sent"].max())
chunk = sent // int(per_rank["messages sent"].max())

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("ring_messages", int(per_rank["messages sent"].max()))
glue("ring_message_bytes", chunk)
glue("ring_chunks", tensor_bytes // chunk)
glue("ring_half_steps", len(ring.per_step()) // 2)
glue("ring_step_links", int(ring.per_step()["messages"].min()))
glue("ring_sent", sent)
glue("ring_ratio", sent / tensor_bytes, ".1f")

# %% [markdown]
# Every rank sends <span data-glue="ring_messages">6</span> messages of
# <span data-glue="ring_message_bytes">16</span> bytes, <span data-glue="ring_sent">96</span>
# bytes, which is `2(n-1)/n` = <span data-glue="ring_ratio">1.5</span> times the tensor, and
# every step keeps all <span data-glue="ring_step_links">4</span> links of the ring busy.

# %% [markdown]
# And as a picture: one panel per step, an arrow for each message.

# %%
from parlab.viz import show
from parlab.viz.plots import bytes_per_rank_figure, steps_figure

show(steps_figure(ring, title="ring all_reduce of 64 bytes on 4 ranks", columns=3))

# %% [markdown]
# ### Ring or naive?
# The **naive** algorithm sends every tensor to rank 0, which adds them up and sends the
# sum back: only <span data-glue="naive_steps">2</span> steps, but rank 0 sends and receives
# `(n-1)` times the whole tensor. With <span data-glue="ranks">4</span> ranks that is
# <span data-glue="naive_factor">3</span> x <span data-glue="tensor_bytes">64</span> =
# <span data-glue="naive_root_sent">192</span> bytes out of one network card (and as many
# in), against <span data-glue="ring_sent">96</span> for every rank of the ring; with
# <span data-glue="many_gpus">1,000</span> GPUs it is <span data-glue="many_naive">999</span>
# times the gradient, while each rank of the ring sends
# <span data-glue="many_ring">1.998</span> times the gradient (`2(n-1)/n < 2` for any n).

# %%
from parlab.comm import allreduce_bytes_per_rank

_, naive = run_with_traffic(sum_gradients, ranks, values, algorithm="naive")
print(naive.per_rank().to_string())
root_sent = int(naive.per_rank()["sent"][0])
many = 1000  # GPUs; bytes per rank as a multiple of the gradient, rank 0 first
show(bytes_per_rank_figure({"ring": ring, "naive": naive}, "64 bytes on 4 ranks, bytes sent"))

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("naive_steps", len(naive.per_step()))
glue("naive_root_sent", root_sent)
glue("naive_factor", root_sent // tensor_bytes)
glue("many_gpus", many, ",")
glue("many_naive", allreduce_bytes_per_rank(1, many, "naive")[0], ",")
glue("many_ring", allreduce_bytes_per_rank(1, many, "ring")[0], ".3f")

# %% [markdown]
# ### Try it yourself
# The explorer below runs one collective on real ranks with the toy backend each time you
# change a setting: which collective, which algorithm, how many ranks
# (<span data-glue="explorer_min_ranks">2</span> to
# <span data-glue="explorer_max_ranks">8</span>) and how many
# float32 values each rank holds. Every rank checks its own answer against the sum or copy
# it must end up with, and the figure draws each step's messages. Things to look for: a
# ring all_reduce needs more steps as ranks are added, yet every rank sends about the same
# number of bytes (exactly the same when the ranks divide the tensor); the naive algorithm
# needs at most <span data-glue="naive_steps">2</span> steps but piles the work on rank 0; a
# broadcast passed along the ring takes `n - 1` steps (exercise 00.4 asks what the tree
# needs). Without a running kernel you see the default setting: all_gather on a ring of
# <span data-glue="explorer_ranks">4</span> ranks.

# %%
from parlab.experiments import collective_explorer

explorer = collective_explorer()
ranks_slider = explorer.controls["ranks"]
explorer

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("explorer_ranks", ranks_slider.value)
glue("explorer_min_ranks", ranks_slider.min)
glue("explorer_max_ranks", ranks_slider.max)

# %% [markdown]
# ### What it would cost on a real cluster
# The log knows bytes, not seconds. `parlab.comm.topology` describes a cluster like the book's
# Figure 8-19 (GPUs in servers joined by NVLink; each GPU's network card on a rail switch)
# and `parlab.comm.traffic` turns messages into time with the alpha-beta model: each message
# costs a latency alpha plus its bytes divided by the bandwidth, and a step lasts as long as
# its slowest message. For a <span data-glue="cost_gb">1</span> GB gradient and
# <span data-glue="cost_gbps">400</span> Gb/s network cards, the naive
# algorithm's one busy card makes it slower and slower as GPUs are added; the ring's time
# hardly grows.

# %%
from parlab.comm import allreduce_time, nic

gradient, gbps = 10**9, 400  # bytes, Gb/s
for n in (2, 8, 64):
    ring_s, naive_s = (allreduce_time(gradient, n, a, nic(gbps)) for a in ("ring", "naive"))
    print(f"{n:>3} GPUs: ring {ring_s:6.3f} s   naive {naive_s:7.3f} s")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("cost_gb", gradient / 1e9, "g")
glue("cost_gbps", gbps)

# %% [markdown]
# ## 6. Exercises
#
# Replace each `...` with your answer and run the cell. The checker tells you whether you
# are right and why, without giving the answer away.
#
# **Exercise 00.1.** Four ranks each hold `torch.tensor([rank + 1.0])`. After
# `dist.all_reduce` (SUM), which number does rank 3 hold?

# %%
from parlab.exercises import check

answer_00_1 = ...
check("00.1", answer_00_1)

# %% [markdown]
# **Exercise 00.2.** Write `fn()` so that, run on any number of ranks, every rank returns
# the sum over all ranks of `rank ** 2`, using one collective call.

# %%
def sum_of_squares():
    ...  # your code here


check("00.2", ...)  # when your function is ready: check("00.2", sum_of_squares)

# %% [markdown]
# **Exercise 00.3.** A ring `all_reduce` runs on 4 ranks over a tensor of 1 MiB
# (1,048,576 bytes). How many bytes does each rank send? (Predict first; then you can check
# with `run_with_traffic` and a tensor of `2**18` float32 values.)

# %%
answer_00_3 = ...
check("00.3", answer_00_3)

# %% [markdown]
# **Exercise 00.4.** Rank 0 broadcasts a tensor to 8 ranks. Passed along the ring, it takes
# 7 steps. How many steps does the **tree** algorithm take? (Predict, then set the explorer
# above to broadcast, tree, 8 ranks.)

# %%
answer_00_4 = ...
check("00.4", answer_00_4)

# %% [markdown]
# ## What's next
#
# Chapter 01 asks what a GPU must hold to train a network (Figure 8-1) and why one GPU is
# not enough for a 175-billion-parameter model.
