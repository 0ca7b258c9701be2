# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
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
# 2. start 4 ranks from a cell and get their answers back;
# 3. watch the four basic collectives move real tensors: `all_reduce`, `all_gather`,
#    `broadcast`, and point-to-point `send`/`recv`;
# 4. see what happens when one rank fails, or waits forever;
# 5. solve two small exercises.
#
# The later chapters use exactly these operations to build data, pipeline and tensor
# parallelism (Figures 8-2 to 8-19 of the book).

# %% [markdown]
# ## 1. What this machine offers
#
# The output below depends on your machine (CPU count, GPUs), so yours will differ.

# %%
# NBVAL_IGNORE_OUTPUT
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


run(hello, 4)

# %% [markdown]
# The first launch in a notebook starts a helper process that imports PyTorch once; every
# later launch forks ranks from it, so it takes about a tenth of a second. (Timings vary
# from machine to machine.)

# %%
# NBVAL_IGNORE_OUTPUT
import time

start = time.perf_counter()
run(hello, 4)
print(f"a 4-rank launch took {time.perf_counter() - start:.3f} s")

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
from parlab.plots.basics import show_collective


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
# Every launch has a `timeout` (60 s by default); here 2 s.

# %%
def forgetful():
    if dist.get_rank() != 1:  # rank 1 forgets to take part
        dist.all_reduce(torch.ones(1))


try:
    run(forgetful, 3, timeout=2)
except launch.RankTimeoutError as err:
    print("still running at the timeout:", err.pending)
    print(str(err).split(". ")[0])

# %% [markdown]
# ## 5. Exercises
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
# ## What's next
#
# Chapter 01 asks what a GPU must hold to train a network (Figure 8-1) and why one GPU is
# not enough for a 175-billion-parameter model.
