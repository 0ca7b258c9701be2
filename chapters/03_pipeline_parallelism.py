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
# # 03 · Pipeline parallelism: eleven time steps on four GPUs
#
# The chapter cuts a small network into four pieces: hidden layer 1 on GPU **A1**, hidden
# layer 2 on **A2**, hidden layer 3 on **B1** and the output layer on **B2**. A batch is
# split into four micro-batches **x1 ... x4** that follow each other through the GPUs like
# cars on an assembly line. Figures 8-3 to 8-13 show this in eleven time steps; Figure
# 8-14 adds a second copy of the pipeline.
#
# In this notebook you will:
#
# 1. write the book's schedule down as data, in the same notation PyTorch uses;
# 2. let a simulator rebuild the chapter's step-by-step table from it (and find where the
#    text slips);
# 3. slide through the eleven time steps (Figures 8-3 to 8-13);
# 4. run the schedule for real on four ranks and compare the ranks' logs with the table,
#    and their gradients with ordinary one-process training; then look at the run's real
#    timeline, as Perfetto shows it;
# 5. compare the schedules that came after the book's: GPipe, 1F1B, interleaved 1F1B;
# 6. run two pipelines side by side with their gradients synchronized (Figure 8-14);
# 7. run the same model with PyTorch's own `torch.distributed.pipelining`;
# 8. solve four exercises.

# %% [markdown]
# ## 1. A schedule is a table
#
# A pipeline schedule says, for every time step and every GPU, what that GPU computes.
# We write it the way `torch.distributed.pipelining` does: an **action** such as `2F0`
# means "stage 2, forward pass, micro-batch 0" and `2B0` is the backward pass of the same
# micro-batch (computing its error *E* and the weight gradient *G*). PyTorch counts from 0,
# so the book's x1 is micro-batch `0`, and stage 2 is GPU B1.
#
# Each rank gets one entry per time step: an action, `.` when it is idle, and `a+b` when it
# does two things in one step. Nobody typed the table below: the schedule generator only
# knows that every stage runs its forward passes in order and its backward passes in order,
# each as soon as its input has arrived, and at most one of each per step.

# %%
from parlab.pipeline import describe_step, errata, schedule, simulate

book = schedule("book", stages=4, microbatches=4)
print(book)

# %% [markdown]
# Two ranks double up. B2 (rank 3) computes the model output of one micro-batch and the
# error of the previous one in the same step, from step 5 to step 7. B1 (rank 2) does the
# same once, in step 6: its last forward pass, and the first error that came back from B2.
# The same table is also available as a dict, `book.pipeline_order`, in the form PyTorch
# uses: `{rank: [action, (action, action), None, ...]}`.
#
# Keep those doubled entries in mind. A forward and a backward pass in one step means two
# units of work in one unit of time, which no other schedule in this notebook allows
# itself. Section 5 counts what that does to the comparison with GPipe and 1F1B.

# %%
book.pipeline_order[3]

# %% [markdown]
# ## 2. The simulator rebuilds the chapter's table
#
# `simulate` goes through the schedule step by step. Every step has a computing phase and
# then a communication phase. A forward pass sends its activation *y* to the next GPU. A
# backward pass sends its error *E* to the previous GPU. A tensor sent in step *t* can be
# used in step *t + 1*. The simulator also checks that no action runs before its input
# has arrived.
#
# The table names actions by micro-batch, counted from 1 as in the book: `F2` is the
# forward pass of x2 and `E1` the backward pass of x1, the step that computes the error E1
# and the gradient G1. The letter is `E` and not `B` because B1 and B2 are GPUs here: a
# cell `B2` in GPU B1's column would name a GPU and a pass at once. PyTorch's strings such
# as `2B0` keep their `B`, since they begin with the stage and cannot be taken for a GPU.
# The Gantt charts and the measured timeline below use the same `F1`/`E1` labels; the step
# figures spell a backward pass out as `E1, G1`. The last column is the share of GPUs that
# are busy.

# %%
from parlab.pipeline import BOOK_ACTIVE_PERCENT

sim = simulate(book)
print(sim.table())
print()
print("active GPUs per step (%):", sim.active_percent)
print("the same as the chapter's percentages:", sim.active_percent == BOOK_ACTIVE_PERCENT)

# %% [markdown]
# The percentages count GPUs, not work: a GPU that runs two actions in a step counts once.
# Section 5 shows what they leave out. Here is one step in the chapter's own format:

# %%
print(describe_step(sim, 5))

# %% [markdown]
# ### Errata, found by computation
#
# The package also stores the lists the chapter prints for each step, as data.
# `errata` compares them with the simulated table. Everything the GPUs *compute* agrees,
# and so do the percentages. Three *communication* lists do not:

# %%
for erratum in errata(sim):
    print(erratum)

# %% [markdown]
# * **Step 2**: the text sends y1 from A2 "to B3". There is no B3 in this pipeline; B1 is
#   meant.
# * **Step 4**: the text repeats step 3's list (y3, y2, y1). In step 4 the activations that
#   move are y4, y3 and y2.
# * **Step 6**: B1 computes the error E1 in step 6 and A2 uses it in step 7, so B1 must send
#   E1 to A2 in step 6. The text leaves this transfer out.

# %% [markdown]
# ## 3. Figures 8-3 to 8-13, step by step
#
# The upper panel shows the four GPUs at one time step: what each computes, the
# activations sent forward (blue) and the errors sent back (red). The lower panel is the
# whole schedule as a Gantt chart. Colour stands for the micro-batch, light for forward
# (`F1`) and dark for backward (`E1`), and the frame marks the current step. Move the
# slider or press play. The dropdown switches to the other schedules of section 5.

# %%
from parlab.viz.widgets import step_explorer

step_explorer()

# %% [markdown]
# Step 6 is the busiest step for B1, and it is the one with the missing transfer:

# %%
from parlab.viz import show
from parlab.viz.plots import step_figure

show(step_figure(sim, 6))

# %% [markdown]
# ## 4. Run it for real
#
# `execute` starts one process per stage. Each rank builds its layer of the chapter's
# network: 3 inputs, three hidden layers of 4 sigmoid neurons, and 2 outputs. The weights
# come from a fixed seed. Then the rank follows its row of the schedule. Activations and
# errors travel with `dist.send` / `dist.recv`. In each step's communication phase every
# rank walks the same ordered list of transfers, so two ranks that send to each other in
# the same step cannot deadlock.
#
# Each rank logs what it computed and what it sent. `execute` checks two things:
#
# * the log must equal the simulated table, action by action and transfer by transfer;
# * the gradients must equal those of a single process that trains the whole network on
#   the whole batch of 8 samples (4 micro-batches of 2).

# %%
from parlab.pipeline import execute

run = execute(book)
print(run.report())
print()
print(run.log_text(2))

# %% [markdown]
# The loss is the squared error averaged over all 8 samples. Each micro-batch adds its
# share, so the four backward passes add up to exactly the gradient of the whole batch.
# GPipe and 1F1B (next section) also run on the same four ranks:

# %%
runs = {name: execute(schedule(name, stages=4, microbatches=4)) for name in ("gpipe", "1f1b")}
for name, other in runs.items():
    print(other.report())

# %% [markdown]
# ### The traffic, as the network sees it
#
# The package's *toy* backend (chapter 00's collectives, built on point-to-point messages)
# logs every message a rank sends. Run the book's schedule on it, and the messages of each
# time step should be exactly that step's communication list: the same pairs of GPUs, and
# each message the size of one micro-batch's activation or error (2 samples x 4 values x 4
# bytes). That includes step 6's E1 from B1 to A2, the transfer the chapter's text leaves
# out.

# %%
toy_run = execute(book, backend="toy")
print("messages logged per step = simulated communication list:", toy_run.traffic_matches)
print(toy_run.traffic_table())

# %% [markdown]
# ### The timeline of the real run
#
# The simulator counts time steps, all of the same length. The ranks live in seconds.
# While `execute` ran, every rank also timed each of its actions and each `send` and
# `recv` with `time.perf_counter_ns`. All processes on one machine read that same clock, so
# the four ranks' times line up. `chrome_trace` writes these *spans* in the Chrome trace
# format, the same JSON that `torch.profiler` exports. Each rank becomes one track with two
# rows, "compute" and "communication", and an arrow joins every send to the receive that
# took its message. Open the file `pipeline_trace.json` (written next to this notebook) at
# https://ui.perfetto.dev, or at `chrome://tracing` in Chrome, to zoom and click through it.
#
# First the facts that cannot change from run to run: one track per rank, and on each
# track one compute span per action of that rank's row in the schedule.

# %%
from parlab.comm import trace_summary

trace = run.chrome_trace("pipeline_trace.json")
actions = [sum(len(book.actions(r, t)) for t in range(book.steps)) for r in range(book.stages)]
for row in trace_summary(trace):
    print(f"{row['track']}: {row['compute spans']} compute spans, "
          f"{row['communication spans']} sends and receives")
print("compute spans per rank = actions per rank in the schedule:",
      [row["compute spans"] for row in trace_summary(trace)] == actions)

# %% [markdown]
# Now the measured part: how long each rank computed, communicated and did nothing at
# all, and the timeline drawn under the simulated Gantt chart of the same schedule. Colours
# are as in the Gantt chart: one per micro-batch, light for forward (`F1`), dark for
# backward (`E1`).
# These numbers change with every run and every machine, so compare them with each other,
# not with a number in the text.

# %%
# NBVAL_IGNORE_OUTPUT
from parlab.viz.plots import trace_figure

for row in trace_summary(trace):
    print(f"{row['track']}: compute {row['compute ms']:.2f} ms, communication "
          f"{row['communication ms']:.2f} ms, idle {row['idle ms']:.2f} ms")
show(trace_figure(trace, sim))

# %% [markdown]
# What the simulated chart leaves out shows up in the measured one:
#
# * **Steps are not equal.** Here a forward pass moves 2 samples through 4 neurons, a tiny
#   amount of work, so the compute spans are thin. Handing even a few bytes to another
#   process goes through the operating system, so the communication row dominates, and a
#   step lasts as long as its slowest hand-over.
# * **The bubble is waiting.** In the Gantt chart the bubble is the empty cells. In the
#   trace it is a `recv` that waits for a message the previous stage has not sent yet.
#   With gloo a `send` waits as well, until the receiver has posted its `recv`. This is
#   what blocking point-to-point communication costs, and why real pipelines post their
#   sends and receives asynchronously (`isend`/`irecv`) and overlap them with compute.
# * **The order is the schedule's.** Each rank's compute spans follow its row of the
#   table above, F and B in the same order. The simulator got the order right; only the
#   durations are new.
#
# `parlab.data_parallel.training_trace(runs, path)` writes the same kind of file for a
# data-parallel run from chapter 02: forward and backward per micro-batch, one `all_reduce`
# per gradient bucket, and the optimizer step.

# %% [markdown]
# ## 5. Bubbles and memory: naive, GPipe, 1F1B, interleaved
#
# The chapter's schedule was one of several answers to a simple problem. Without
# micro-batches (**naive** model parallelism), one GPU works while the other three wait.
# Every idle cell in the Gantt chart is a **bubble**. The schedules that followed the
# first pipelines each change one thing:
#
# * **GPipe** runs all forward passes, then all backward passes. More micro-batches shrink
#   the bubble, but every stage holds the activations of all *m* micro-batches until their
#   backward pass.
# * **1F1B** starts backward passes as early as it can and then alternates one forward
#   with one backward. The bubble stays the same, but a stage never holds more than *p*
#   micro-batches.
# * **Interleaved 1F1B** gives each GPU *v* smaller chunks of the model (GPU A1 holds
#   chunks 1 and 5 of 8, for example). Each chunk's step is *v* times shorter, so the
#   bubble shrinks. The price is more messages between GPUs. A micro-batch now crosses a
#   GPU boundary at every chunk boundary: p·v - 1 of them each way instead of p - 1. That
#   is (pv - 1)/(p - 1) times the messages, more than v; the count is measured below.
#
# **Bubble fraction**, here and in the package, means idle slots divided by all slots.
# For GPipe that is (p-1)/(m+p-1). Papers often quote bubble time over ideal time
# instead, (p-1)/m for GPipe. `Simulation.bubble_over_ideal` gives that number.
#
# The Gantt charts below share one time axis. One unit is one micro-batch going through one
# whole stage, so the interleaved schedule's shorter steps line up with the others.

# %%
from parlab.viz.plots import gantt_figure

sims = [simulate(schedule(name, 4, 4, 2 if name == "interleaved" else 1))
        for name in ("naive", "book", "gpipe", "1f1b", "interleaved")]
for s in sims:
    print(s.summary())
show(gantt_figure(sims))

# %% [markdown]
# ### The book's schedule is not faster: it does two things at once
#
# In these summaries the book's schedule beats GPipe and 1F1B: fewer time steps, a smaller
# bubble. The whole lead comes from its doubled steps. There a GPU runs a forward and a
# backward pass in the time the other schedules give to one, and the Gantt chart draws the
# pair as two half-width cells inside one time unit. A real GPU cannot: running both takes
# as long as running one after the other. Count the actions against the busy (GPU, step)
# slots:

# %%
from parlab.pipeline import one_action_per_slot, slot_count, work_percent

for s in sims[1:4]:  # book, GPipe, 1F1B
    print(f"{s.schedule.name:<6} {slot_count(s)}")

# %% [markdown]
# All three run the same number of actions. GPipe and 1F1B need one busy slot per action;
# the book's schedule needs fewer, and the difference is its doubled slots. The chapter's
# active-GPU percentages hide that extra work, because they count GPUs. Per step, the work
# done (actions as a share of one action per GPU) next to the share of active GPUs:

# %%
print("work per step (%):       ", work_percent(sim))
print("active GPUs per step (%):", sim.active_percent)

# %% [markdown]
# Where the two rows differ, a GPU worked twice in one step. Now hold the book's schedule to
# the rule the others follow, one action per slot: each GPU keeps its order of work, every
# doubled step is split, and each action moves to the earliest step its inputs allow. The
# book's schedule then takes as many steps as GPipe and 1F1B, with the same bubble:

# %%
serial = simulate(one_action_per_slot(book))
for s in (serial, sims[2], sims[3]):
    print(s.summary())
show(gantt_figure([sims[1], serial, sims[2]]))

# %% [markdown]
# Counted fairly, the book's schedule is GPipe with its backward passes started as early
# as possible; on the last GPU it already alternates forward and backward, as 1F1B does on
# every GPU. What it keeps over GPipe is memory on the last stage (the peak in-flight
# counts above), not time.

# %% [markdown]
# Activation memory in bytes needs a real model. The comparison below uses GPT-3 175B
# with one sequence of 2048 tokens per micro-batch in bf16.
# `parlab.memory.activation_bytes` (chapter 01) gives the bytes one micro-batch leaves on
# a stage. The simulator walks through the schedule and adds and frees them, action by
# action. "time" is in the same unit as the Gantt charts. "transfers" counts the tensors
# sent between GPUs per batch.

# %%
from parlab.pipeline import compare, comparison_table

rows = compare(stages=4, microbatches=8, chunks=2)
print(comparison_table(rows))

# %% [markdown]
# The transfers column is where interleaving pays. Its ratio to 1F1B's, next to
# (pv - 1)/(p - 1) and to v:

# %%
p, v = 4, 2
transfers = {r.name: r.transfers for r in rows}
print(f"interleaved / 1F1B transfers: {transfers['interleaved'] / transfers['1f1b']:.3f}; "
      f"(pv-1)/(p-1) = {(p * v - 1) / (p - 1):.3f}; v = {v}")

# %% [markdown]
# The same count from real ranks: interleaved 1F1B with v = 2 on the toy backend, with a
# network of 8 layers so that each of the 4 ranks holds 2 chunks. The book's schedule of
# section 4 ran on the same 4 ranks and sent as many messages per micro-batch as GPipe and
# 1F1B, so it is the baseline here.

# %%
from parlab.pipeline import Network

deep = Network(widths=(3,) + (4,) * 7 + (2,))
interleaved_run = execute(schedule("interleaved", 4, 4, 2), deep, backend="toy")
print(interleaved_run.report())
sent = {"interleaved": len(interleaved_run.traffic.records), "book": len(toy_run.traffic.records)}
print(f"messages logged: {sent}; ratio {sent['interleaved'] / sent['book']:.3f}")

# %% [markdown]
# The slide deck's three trade-offs, as curves. Move the sliders to change p, m and v.
# Interleaving needs the micro-batches to split into equal rounds. Where they do not, the
# table says so.

# %%
from parlab.viz.widgets import compare_explorer

compare_explorer(stages=4, microbatches=8, chunks=2)

# %% [markdown]
# ## 6. Figure 8-14: pipeline + data parallelism
#
# Figure 8-14 runs two copies of the pipeline: A1, A2, ... and C1, C2, .... Each copy gets
# half of the batch. After the backward pass, the two GPUs that hold the same layer (A1
# and C1, A2 and C2) synchronize its gradients: they add them, divide by 2, and both keep
# the result. Here that runs on 4 ranks: 2 stages of 2 layers each, times 2 replicas. Each
# stage's pair of GPUs gets its own process group (`dist.new_group`), and the sync is one
# `all_reduce` in that group. The result must equal one process training on the whole
# batch.

# %%
from parlab.pipeline import pipeline_data_parallel
from parlab.viz.plots import sync_figure

hybrid = pipeline_data_parallel(schedule("book", stages=2, microbatches=2), replicas=2)
print(hybrid.report())
print()
print(hybrid.sync_table(layer=0))
show(sync_figure(hybrid))

# %% [markdown]
# The chapter's own layout has 4 stages times 2 replicas, on 8 ranks:

# %%
print(pipeline_data_parallel(schedule("book", stages=4, microbatches=2), replicas=2).report())

# %% [markdown]
# ## 7. The production API: `torch.distributed.pipelining`
#
# PyTorch ships these schedules as `ScheduleGPipe` and `Schedule1F1B`. Each rank wraps its
# layer in a `PipelineStage`, and the schedule's `step()` does the sends and receives.
# Below, the same 4-stage network with the same data runs on gloo ranks, and we compare
# PyTorch's gradients with our executor's. PyTorch also exposes its plan as
# `pipeline_order`, in the same action notation. We compare each rank's order of actions
# with ours (idle steps left out).

# %%
from parlab.pipeline import our_action_order, torch_pipelining

torch_runs = torch_pipelining(("gpipe", "1f1b"), stages=4, microbatches=4)
for kind, theirs in torch_runs.items():
    print(f"{kind}: largest gradient difference from our executor below 1e-6: "
          f"{theirs.difference(runs[kind]) < 1e-6}")  # runs: our executor's, from section 4

# %% [markdown]
# The order of actions on each rank, PyTorch's plan beside ours. (This output depends on
# the installed PyTorch version, so the notebook tests do not compare it.)

# %%
# NBVAL_IGNORE_OUTPUT
for kind, theirs in torch_runs.items():
    print(kind)
    mine = our_action_order(runs[kind].simulation.schedule)
    for rank in range(4):
        same = theirs.actions[rank] == mine[rank]
        print(f"  rank {rank}: " + ("same order" if same else
                                    f"torch {' '.join(theirs.actions[rank])} | "
                                    f"ours {' '.join(mine[rank])}"))

# %% [markdown]
# The gradients agree for both schedules. The orders agree for every rank of GPipe and for
# the first three ranks of 1F1B. For the last rank, the `pipeline_order` that PyTorch
# (torch 2.13) builds for `Schedule1F1B` lists forward passes of micro-batches 1 to 4. A
# batch of 4 micro-batches has no micro-batch 4 (they are numbered 0 to 3), so this list is
# off by one. PyTorch uses `pipeline_order` only to draw schedules; the execution follows
# a different code path, which is why the gradients still agree. Our simulator would
# reject that list as a schedule.

# %% [markdown]
# ## 8. Exercises
#
# Replace each `...` with your answer and run the cell. The checker computes the right
# answer with the simulator. It tells you whether you are right and why, without
# revealing the answer.
#
# **Exercise 03.1.** GPipe on p = 4 stages with m = 12 micro-batches: what fraction of all
# (GPU, time step) slots is idle? Give a number between 0 and 1.

# %%
from parlab.exercises import check

answer_03_1 = ...
check("03.1", answer_03_1)

# %% [markdown]
# **Exercise 03.2.** 1F1B on p = 4 stages with m = 8 micro-batches: at most how many
# micro-batches' activations does the first GPU (A1) hold at the same time?

# %%
answer_03_2 = ...
check("03.2", answer_03_2)

# %% [markdown]
# **Exercise 03.3.** In the book's schedule, in which time step does GPU B1 both run a
# forward pass and compute an error?

# %%
answer_03_3 = ...
check("03.3", answer_03_3)

# %% [markdown]
# **Exercise 03.4.** Write the `pipeline_order` of GPipe for 2 stages and 2 micro-batches:
# a dict `{rank: [entry per time step]}` with actions such as `"0F0"` and `None` for an
# idle step. It must be a valid schedule, and as short as possible. The checker runs it
# through the simulator, so an invalid schedule gets the simulator's reason.

# %%
answer_03_4 = ...  # for example {0: ["0F0", ...], 1: [None, ...]}
check("03.4", answer_03_4)

# %% [markdown]
# ## What's next
#
# Pipelines split a model *between* layers. Chapter 04 splits *inside* a layer: the
# attention and feed-forward layers of a transformer, sharded across GPUs (Figures 8-15
# to 8-19).
