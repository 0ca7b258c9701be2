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
# 4. run the schedule for real on <span data-glue="s4_ranks">4</span> ranks and compare the
#    ranks' logs with the table, and their gradients with ordinary one-process training;
#    update the weights after the last micro-batch and see where the next iteration can
#    start; then look at the run's real timeline, as Perfetto shows it;
# 5. compare the schedules that came after the book's: GPipe, 1F1B, interleaved 1F1B, and
#    run the first two on the same ranks;
# 6. run <span data-glue="hyb_replicas">2</span> pipelines side by side on
#    <span data-glue="hyb_ranks">8</span> ranks, with their gradients synchronized
#    (Figure 8-14);
# 7. run the same model with PyTorch's own `torch.distributed.pipelining`;
# 8. along the way, predict three numbers before the notebook prints them (exercises 03.1
#    to 03.3, in section 5), and at the end write a schedule of your own (03.4).

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
from parlab.pipeline import describe_step, doubled_steps, schedule, simulate
from parlab.experiments import errata

book = schedule("book", stages=4, microbatches=4)
print(book)
doubled = doubled_steps(book)
print("\nsteps in which a rank runs two actions:", doubled)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
from parlab.viz import glue

glue("s1_b2_first", doubled[3][0])
glue("s1_b2_last", doubled[3][-1])
glue("s1_b1_step", doubled[2][0])

# %% [markdown]
# Two ranks double up. B2 (rank 3) computes the model output of one micro-batch and the
# error of the previous one in the same step, from step <span data-glue="s1_b2_first">5</span>
# to step <span data-glue="s1_b2_last">7</span>. B1 (rank 2) does the same once, in step
# <span data-glue="s1_b1_step">6</span>: its last forward pass, and the first error that came
# back from B2.
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
from parlab.experiments import BOOK_ACTIVE_PERCENT

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
# and so do the percentages. <span data-glue="err_count">3</span> *communication* lists do
# not:

# %%
for erratum in errata(sim):
    print(erratum)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
slips = [e.step for e in errata(sim)]
glue("err_count", len(slips))
glue("err_b3", slips[0])
glue("err_repeat", slips[1])
glue("err_repeat_prev", slips[1] - 1)
glue("err_e1", slips[2])
glue("err_e1_next", slips[2] + 1)

# %% [markdown]
# * **Step <span data-glue="err_b3">2</span>**: the text sends y1 from A2 "to B3". There is no
#   B3 in this pipeline; B1 is meant.
# * **Step <span data-glue="err_repeat">4</span>**: the text repeats step
#   <span data-glue="err_repeat_prev">3</span>'s list (y3, y2, y1). In step
#   <span data-glue="err_repeat">4</span> the activations that move are y4, y3 and y2.
# * **Step <span data-glue="err_e1">6</span>**: B1 computes the error E1 in step
#   <span data-glue="err_e1">6</span> and A2 uses it in step
#   <span data-glue="err_e1_next">7</span>, so B1 must send E1 to A2 in step
#   <span data-glue="err_e1">6</span>. The text leaves this transfer out.

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
# Step <span data-glue="s1_b1_step">6</span>, in which B1 runs two actions, is also the step
# with the missing transfer:

# %%
from parlab.viz import show
from parlab.viz.plots import step_figure

show(step_figure(sim, doubled[2][0]))

# %% [markdown]
# ## 4. Run it for real
#
# `execute` starts one process per stage. Each rank builds its layer of the chapter's
# network: <span data-glue="net_inputs">3</span> inputs, <span data-glue="net_hidden">3</span>
# hidden layers of <span data-glue="net_width">4</span> sigmoid neurons, and
# <span data-glue="net_outputs">2</span> outputs. The weights come from a fixed seed. Then
# the rank follows its row of the schedule. Activations and errors travel with
# `dist.send` / `dist.recv`. In each step's communication phase every
# rank walks the same ordered list of transfers, so two ranks that send to each other in
# the same step cannot deadlock.
#
# The book says that y and E travel by RDMA (Remote Direct Memory Access). With RDMA the
# network card reads the tensor straight out of the sending GPU's memory and writes it into
# the receiving GPU's memory: no CPU copies it and the operating system is not on the path
# (for GPUs this is GPUDirect RDMA, over InfiniBand or RoCE). On a cluster, `dist.send` and
# `dist.recv` on the NCCL backend take that path between servers where the cards and
# drivers allow it, and NVLink between GPUs of one server. Here the ranks are processes on
# one machine: gloo hands the same tensors over through the operating system's sockets, and
# the toy backend (below) logs each message and passes it on through memory the ranks
# share (on Linux x86-64; elsewhere over gloo). The transport differs; what moves, from
# which GPU to which, and how many bytes, does not.
#
# Each rank logs what it computed and what it sent. `execute` checks two things:
#
# * the log must equal the simulated table, action by action and transfer by transfer;
# * the gradients must equal those of a single process that trains the whole network on
#   the whole batch of <span data-glue="net_samples">8</span> samples
#   (<span data-glue="net_mb">4</span> micro-batches of <span data-glue="net_mb_size">2</span>).

# %%
from parlab.pipeline import execute

run = execute(book, lr=0.5)
print(run.report())
print()
print(run.log_text(2))

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("s4_ranks", run.simulation.schedule.stages)
glue("net_inputs", run.net.widths[0])
glue("net_hidden", len(run.net.widths) - 2)
glue("net_width", run.net.widths[1])
glue("net_outputs", run.net.widths[-1])
glue("net_samples", run.net.samples)
glue("net_mb", book.microbatches)
glue("net_mb_size", run.net.samples // book.microbatches)

# %% [markdown]
# The loss is the squared error averaged over all <span data-glue="net_samples">8</span>
# samples. Each micro-batch adds its share, so the backward passes of the micro-batches add
# up to exactly the gradient of the whole batch.
#
# What does one backward action leave on a GPU? The error E of its micro-batch, which it
# sends back, and the gradient G of its own layer, which stays. The book's figures write
# "x3" above G1 on B2, and its text explains the mark: the gradients are computed for every
# weight on a neuron's inputs, the bias included, and again for each of the four
# micro-batches. So "x3" counts gradients; it does not name micro-batch x3, which reaches B2
# only a step later: in step <span data-glue="s1_b2_first">5</span>, where B2 computes G1, it
# also runs the forward pass of x2. In this network the count per neuron is its number of
# inputs plus one. The run's gradients, layer by layer:

# %%
print(run.gradient_table())

# %% [markdown]
# PyTorch adds each micro-batch's gradients into the same `.grad` tensors, so after its last
# backward a GPU holds its layer's gradient for the whole batch.
#
# ### After the last micro-batch: the update and the next iteration
#
# The book closes its eleven steps this way: once A1 has the gradients of the last
# micro-batch, the weights are adjusted and the second iteration's forward pass begins. The
# run above did the update too: `execute(book, lr=...)` has each rank take one SGD step,
# w − lr·G, on its own layer as soon as its own last backward is done. No gradient leaves
# its GPU for this, since each layer lives on one GPU only (Figure 8-14, in section 6, adds
# copies and with them an exchange). When each GPU updated, and where the next iteration
# can start:

# %%
print(run.update_table())
flush = run.simulation.next_iteration()

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("s4_next_a1", flush[0][1])
glue("s4_b2_last", flush[-1][0])
glue("s4_b2_next", flush[-1][1])
glue("s4_b2_wait", flush[-1][1] - flush[-1][0] - 1)

# %% [markdown]
# Each GPU updates on its own schedule, B2 first and A1 last, and the new weights equal one
# process's SGD step on the whole batch. The next batch can only enter through A1, with A1's
# new weights, so its x1 runs in step <span data-glue="s4_next_a1">12</span> and the other
# GPUs follow one step apart. B2, finished since step
# <span data-glue="s4_b2_last">8</span>, first works again in step
# <span data-glue="s4_b2_next">15</span>: <span data-glue="s4_b2_wait">6</span> idle steps.
# The draining of one iteration and the filling of the next never overlap. The pipeline is
# *flushed* between iterations, so the bubble that section 5 measures is paid again at every
# iteration. GPipe and 1F1B flush the same way (1F1B with a flush is what Narayanan et al.
# call PipeDream-Flush). PipeDream's asynchronous schedule lets the next batch in before the
# update, at the price of keeping older versions of the weights for the micro-batches still
# in flight. The run stops after one iteration; the table's last two columns come from the
# same schedule (`Simulation.next_iteration`), shifted as little as the updates allow.

# %% [markdown]
# ### The traffic, as the network sees it
#
# The package's *toy* backend (chapter 00's collectives, built on point-to-point messages)
# logs every message a rank sends. Run the book's schedule on it, and the messages of each
# time step should be exactly that step's communication list: the same pairs of GPUs, and
# each message the size of one micro-batch's activation or error
# (<span data-glue="net_mb_size">2</span> samples × <span data-glue="net_width">4</span>
# values × 4 bytes). That includes step <span data-glue="err_e1">6</span>'s E1 from B1 to
# A2, the transfer the chapter's text leaves out.

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
# the ranks' times line up. `chrome_trace` writes these *spans* in the Chrome trace
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

# %% tags=["nbval-ignore-output"]
from parlab.viz.plots import trace_figure

for row in trace_summary(trace):
    print(f"{row['track']}: compute {row['compute ms']:.2f} ms, communication "
          f"{row['communication ms']:.2f} ms, idle {row['idle ms']:.2f} ms")
show(trace_figure(trace, sim))

# %% [markdown]
# What the simulated chart leaves out shows up in the measured one:
#
# * **Steps are not equal.** Here a forward pass moves
#   <span data-glue="net_mb_size">2</span> samples through
#   <span data-glue="net_width">4</span> neurons, a tiny amount of work, so the compute
#   spans are thin. Handing even a few bytes to another process goes through the operating
#   system, so the communication row dominates, and a step lasts as long as its slowest
#   hand-over.
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
# Two letters serve this whole section: **p**, the number of pipeline stages, one per GPU
# (the book's p = <span data-glue="s4_ranks">4</span>: A1, A2, B1, B2), and **m**, the
# number of micro-batches a batch is cut into (the book's m =
# <span data-glue="net_mb">4</span>: x1 to x4).
#
# The chapter's schedule was one of several answers to a simple problem. Without
# micro-batches (**naive** model parallelism), one GPU works while the others wait.
# Every idle cell in the Gantt chart is a **bubble**. The schedules that followed the
# first pipelines each change one thing:
#
# * **GPipe** runs all forward passes, then all backward passes. More micro-batches shrink
#   the bubble, but every stage holds the activations of all *m* micro-batches until their
#   backward pass.
# * **1F1B** starts backward passes as early as it can. In its warm-up, a stage runs just
#   enough forwards to fill the pipeline from itself to the last stage, then waits for its
#   first error to come back. From then on it alternates one backward with one forward. The
#   bubble stays the same, but each backward frees the activations of one micro-batch
#   before the next forward adds some.
# * **Interleaved 1F1B** gives each GPU *v* smaller chunks of the model (with
#   p = <span data-glue="s5_il_p">4</span> and v = <span data-glue="s5_il_v">2</span>, GPU A1
#   holds chunks <span data-glue="s5_a1_chunk_a">1</span> and
#   <span data-glue="s5_a1_chunk_b">5</span> of <span data-glue="s5_chunks">8</span>). Each
#   chunk's step is *v* times shorter, so the bubble shrinks. The price is more messages
#   between GPUs. A micro-batch now crosses a GPU boundary at every chunk boundary: p·v - 1
#   of them each way instead of p - 1. That is (pv - 1)/(p - 1) times the messages, more
#   than v; the count is measured below.
#
# **Bubble fraction**, here and in the package, means idle slots divided by all slots: a
# slot is one GPU during one time step. **Peak in-flight** is the memory side: for each GPU,
# the most micro-batches it has run forward but not yet backward at the same moment. Each of
# them keeps its activations on that GPU until its backward pass. (For the interleaved
# schedule it counts (chunk, micro-batch) pairs.) The summaries below print both.
#
# First, GPipe and 1F1B run for real on the same <span data-glue="s4_ranks">4</span> ranks
# as the book's schedule, with the same network and batch, and are checked the same way:

# %%
runs = {name: execute(schedule(name, stages=4, microbatches=4)) for name in ("gpipe", "1f1b")}
for name, other in runs.items():
    print(other.report())

# %% [markdown]
# **Exercise 03.1 (predict first).** The cell above ran GPipe on p = 4 ranks with m = 4
# micro-batches; its report gave the number of time steps. Now double the micro-batches:
# GPipe on p = 4 stages with m = 8. What fraction of its (GPU, time step) slots is idle?
# The notebook prints it further down in this section. Replace the `...` and run the cell;
# the checker says whether you are right, and why, without giving the number away.

# %%
from parlab.exercises import check

answer_03_1 = ...
check("03.1", answer_03_1)

# %% [markdown]
# **Exercise 03.2 (predict first).** Now take 1F1B on the same p = 4 stages with m = 8
# micro-batches, twice as many as stages. At most how many micro-batches' activations does
# the first GPU (A1) hold at the same time? (The table further down, with m = 8, prints
# it.)

# %%
answer_03_2 = ...
check("03.2", answer_03_2)

# %% [markdown]
# The Gantt charts below share one time axis. One unit is one micro-batch going through one
# whole stage, so the interleaved schedule's shorter steps line up with the others.

# %%
from parlab.viz.plots import gantt_figure

sims = [simulate(schedule(name, 4, 4, 2 if name == "interleaved" else 1))
        for name in ("naive", "book", "gpipe", "1f1b", "interleaved")]
for s in sims:
    print(s.summary())
show(gantt_figure(sims))
naive, book_sim, gpipe, one_f_one_b, interleaved = sims

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
a1_chunks = [k + 1 for k in range(interleaved.schedule.virtual_stages)
             if interleaved.schedule.rank_of(k) == 0]
glue("s5_a1_chunk_a", a1_chunks[0])
glue("s5_a1_chunk_b", a1_chunks[1])
glue("s5_chunks", interleaved.schedule.virtual_stages)
glue("s5_il_p", interleaved.schedule.stages)
glue("s5_il_v", interleaved.schedule.chunks)
glue("s5_gpipe_bubble", gpipe.bubble_fraction, ".3f")
glue("s5_gpipe_over_ideal", gpipe.bubble_over_ideal, ".2f")
glue("s5_gpipe_steps", gpipe.steps)
glue("s5_book_steps", book_sim.steps)
glue("s5_book_bubble", book_sim.bubble_fraction, ".3f")

# %% [markdown]
# GPipe leaves <span data-glue="s5_gpipe_bubble">0.429</span> of its slots idle. Every row
# of its Gantt chart has 2(p - 1) empty cells (where they fall differs: the last GPU idles
# while the pipeline fills and drains, A1 between its forwards and its backwards) out of
# 2(m + p - 1) steps, so the bubble fraction is (p - 1)/(m + p - 1). Papers often quote
# bubble time over ideal (busy) time instead, (p - 1)/m for GPipe, here
# <span data-glue="s5_gpipe_over_ideal">0.75</span>; `Simulation.bubble_over_ideal` gives
# that number. 1F1B has the same bubble, but its stage s holds at most p - s micro-batches
# (counting stages from 0), where GPipe's stages all hold m.
#
# ### The book's schedule is not faster: it does two things at once
#
# In these summaries the book's schedule beats GPipe and 1F1B:
# <span data-glue="s5_book_steps">11</span> time steps against
# <span data-glue="s5_gpipe_steps">14</span>, a bubble of
# <span data-glue="s5_book_bubble">0.364</span> against
# <span data-glue="s5_gpipe_bubble">0.429</span>. The whole lead comes from its doubled
# steps. There a GPU runs a forward and a backward pass in the time the other schedules
# give to one, and the Gantt chart draws the pair as two half-width cells inside one time
# unit. A real GPU cannot: running both takes as long as running one after the other.
# Count the actions against the busy (GPU, step) slots:

# %%
from parlab.pipeline import one_action_per_slot, slot_count, work_percent

slots = {s.schedule.name: slot_count(s) for s in (book_sim, gpipe, one_f_one_b)}
for name, count in slots.items():
    print(f"{name:<6} {count}")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("s5_actions", slots["book"].actions)
glue("s5_book_busy", slots["book"].busy_slots)
glue("s5_book_doubled", slots["book"].doubled_slots)

# %% [markdown]
# All three run <span data-glue="s5_actions">32</span> actions. GPipe and 1F1B need one busy
# slot per action; the book's schedule needs <span data-glue="s5_book_busy">28</span>, and
# the difference is its <span data-glue="s5_book_doubled">4</span> doubled slots. The
# chapter's active-GPU percentages hide that extra work, because they count GPUs. Per step,
# the work done (actions as a share of one action per GPU) next to the share of active GPUs:

# %%
print("work per step (%):       ", work_percent(sim))
print("active GPUs per step (%):", sim.active_percent)

# %% [markdown]
# Where the two rows differ, a GPU worked twice in one step. Now hold the book's schedule to
# the rule the others follow, one action per slot: each GPU keeps its order of work, every
# doubled step is split, and each action moves to the earliest step its inputs allow:

# %%
serial = simulate(one_action_per_slot(book))
for s in (serial, gpipe, one_f_one_b):
    print(s.summary())
show(gantt_figure([book_sim, serial, gpipe]))

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("s5_serial_steps", serial.steps)
glue("s5_serial_bubble", serial.bubble_fraction, ".3f")

# %% [markdown]
# Split that way, the book's schedule takes <span data-glue="s5_serial_steps">14</span>
# steps with a bubble of <span data-glue="s5_serial_bubble">0.429</span>, exactly GPipe's
# and 1F1B's. Counted fairly, it is GPipe with its backward passes started as early as
# possible; on the last GPU it already alternates forward and backward, as 1F1B does on
# every GPU. What it keeps over GPipe is memory on the last stage (the peak in-flight
# counts above), not time.

# %% [markdown]
# ### Messages: the price of interleaving
#
# **Exercise 03.3 (predict first).** The next cell runs interleaved 1F1B for real, on the
# toy backend, which logs every message: p = 4 ranks, v = 2 chunks each (a network of 8
# layers, so each chunk is one layer) and m = 4 micro-batches. How many messages,
# activations forward and errors back, will the ranks send for one batch? The book's
# schedule of section 4 ran on the same 4 ranks with one chunk each; its toy run is the
# baseline.

# %%
answer_03_3 = ...
check("03.3", answer_03_3)

# %%
from parlab.pipeline import Network

deep = Network(widths=(3,) + (4,) * 7 + (2,))
interleaved_run = execute(schedule("interleaved", 4, 4, 2), deep, backend="toy")
print(interleaved_run.report())
sent = {"interleaved": len(interleaved_run.traffic.records), "book": len(toy_run.traffic.records)}
print(f"messages logged: {sent}; ratio {sent['interleaved'] / sent['book']:.3f}")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("s5_sent_interleaved", sent["interleaved"])
glue("s5_sent_book", sent["book"])
glue("s5_sent_ratio", sent["interleaved"] / sent["book"], ".2f")

# %% [markdown]
# <span data-glue="s5_sent_interleaved">56</span> messages against the book's
# <span data-glue="s5_sent_book">24</span>, <span data-glue="s5_sent_ratio">2.33</span>
# times as many, counted by the ranks themselves. That is (pv - 1)/(p - 1), more than v:
# each chunk's step is v times shorter, but the traffic grows by more than v.
#
# ### Memory and traffic for a real model
#
# Activation memory in bytes needs a real model. The comparison below uses GPT-3 175B
# with one sequence of <span data-glue="s5_seq">2048</span> tokens per micro-batch in bf16,
# on p = <span data-glue="s5_p">4</span> stages with m = <span data-glue="s5_m">8</span>
# micro-batches and v = <span data-glue="s5_v">2</span> chunks for the interleaved schedule.
# `parlab.memory.activation_bytes` (chapter 01) gives the bytes one micro-batch leaves on
# a stage. The simulator walks through the schedule and adds and frees them, action by
# action. "time" is in the same unit as the Gantt charts. "transfers" counts the tensors
# sent between GPUs per batch.

# %%
from parlab.pipeline import compare, comparison_table

p, m, v, seq = 4, 8, 2, 2048
rows = compare(stages=p, microbatches=m, chunks=v, microbatch_size=1, seq=seq,
               precision="bf16")
print(comparison_table(rows))
cost = {r.name: r for r in rows}

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("s5_seq", seq)
glue("s5_p", p)
glue("s5_m", m)
glue("s5_v", v)
glue("s5_gpipe_bubble_m8", cost["gpipe"].bubble_fraction, ".3f")
glue("s5_gpipe_peak_m8", cost["gpipe"].peak_inflight)
glue("s5_1f1b_peak_m8", cost["1f1b"].peak_inflight)
glue("s5_naive_peak", cost["naive"].peak_inflight)
glue("s5_gpipe_gb", cost["gpipe"].peak_bytes / 1e9, ".3g")
glue("s5_naive_gb", cost["naive"].peak_bytes / 1e9, ".3g")
glue("s5_1f1b_gb", cost["1f1b"].peak_bytes / 1e9, ".3g")

# %% [markdown]
# With twice as many micro-batches as stages, GPipe's bubble fraction falls to
# <span data-glue="s5_gpipe_bubble_m8">0.273</span> (exercise 03.1): each row keeps its
# 2(p - 1) empty cells, in a longer schedule. But a GPipe stage now holds
# <span data-glue="s5_gpipe_peak_m8">8</span> micro-batches at its peak, while 1F1B's
# fullest stage, A1, still holds <span data-glue="s5_1f1b_peak_m8">4</span>: p, not m
# (exercise 03.2). In bytes, GPipe's fullest GPU holds the activations of the whole batch,
# <span data-glue="s5_gpipe_gb">312</span> GB; 1F1B's fullest holds
# <span data-glue="s5_1f1b_gb">155</span> GB. The naive row's
# <span data-glue="s5_naive_peak">1</span> in flight is no saving: its one piece is the whole
# batch of <span data-glue="s5_m">8</span> sequences, so it holds
# <span data-glue="s5_naive_gb">312</span> GB too.
#
# The transfers column is where interleaving pays its price. Its ratio to 1F1B's, next to
# (pv - 1)/(p - 1) and to v:

# %%
ratio = cost["interleaved"].transfers / cost["1f1b"].transfers
print(f"interleaved / 1F1B transfers: {ratio:.3f}; "
      f"(pv-1)/(p-1) = {(p * v - 1) / (p - 1):.3f}; v = {v}")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("s5_ratio", ratio, ".2f")

# %% [markdown]
# Interleaving sends <span data-glue="s5_ratio">2.33</span> times the messages of 1F1B here,
# the ratio the ranks counted above with fewer micro-batches: it does not depend on m.
#
# The slide deck's three trade-offs, as curves. Move the sliders to change p, m and v.
# Interleaving needs the micro-batches to split into equal rounds. Where they do not, the
# table says so.

# %%
from parlab.viz.widgets import compare_explorer

compare_explorer(stages=4, microbatches=8, chunks=2)

# %% [markdown]
# ## 6. Figure 8-14: pipeline + data parallelism
#
# When one pipeline is not enough, Figure 8-14 runs copies of it side by side and gives each
# copy its share of the batch. The book's layout has
# <span data-glue="hyb_replicas">2</span> copies of the
# <span data-glue="hyb_stages">4</span>-stage pipeline on
# <span data-glue="hyb_ranks">8</span> GPUs, and so does the run below. The first copy keeps
# the names of the earlier figures, A1, A2, B1, B2; the second runs on C1, C2, D1, D2, so a
# stage sits in the same position in both: A1 and C1 hold hidden layer 1, A2 and C2 hidden
# layer 2, B1 and D1 hidden layer 3, B2 and D2 the output layer. (The book names only A1/C1
# and A2/C2; we continue its pattern.) Each copy runs the book's schedule rule on its half of
# the batch, as <span data-glue="hyb_mb">2</span> micro-batches of
# <span data-glue="hyb_mb_size">2</span> samples. After the backward passes, the GPUs that
# hold the same stage synchronize its gradients: the pair gets a process group of its own
# (`dist.new_group`), one `all_reduce` in that group gives both GPUs the sum, and each
# divides it by the number of copies. The result must equal one process training on the
# whole batch.
#
# The book's paragraph on this figure has three slips:
#
# * It calls the step "intra-layer" gradient synchronization and then, for the same step,
#   "(inter-layer)": two labels for one exchange. "Intra-layer" can be read as "among one
#   layer's copies", but both words usually name something else: intra-layer parallelism is
#   tensor parallelism (chapter 04) and inter-layer parallelism is pipeline parallelism, as
#   in Megatron-LM's papers. The exchange is better called a data-parallel all-reduce among
#   the copies of a stage. The groups the run prints below are exactly those pairs.
# * It introduces the setup for a "test dataset" too large for one GPU. Gradients come only
#   from training data (a test set never goes through a backward pass), so it is the
#   training batch that gets split between the copies.
# * Its last step synchronizes the averaged gradients once more. With an all-reduce that step
#   has nothing left to do: every GPU already holds the same sum and computes the same
#   average by itself, so the run below makes no second exchange, and its copies still
#   agree. A second exchange is needed only when one GPU of the pair averages for both and
#   sends the result back (a reduce, then a broadcast).

# %%
from parlab.hybrid import pipeline_data_parallel

hybrid = pipeline_data_parallel(schedule("book", stages=4, microbatches=2), replicas=2)
print(hybrid.report())
print("all-reduce groups:", hybrid.sync_groups)
print()
print(hybrid.sync_table())

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
from parlab.hybrid import SYNC_FORMAT

first = hybrid.sync_pairs()[0]  # hidden layer 1, on A1 and C1
glue("hyb_replicas", hybrid.replicas)
glue("hyb_stages", hybrid.schedule.stages)
glue("hyb_ranks", len(hybrid.ranks))
glue("hyb_pairs", len(hybrid.sync_groups))
glue("hyb_mb", hybrid.schedule.microbatches)
glue("hyb_mb_size", hybrid.net.samples // (hybrid.replicas * hybrid.schedule.microbatches))
glue("hyb_a1", first.local[0], SYNC_FORMAT)
glue("hyb_c1", first.local[1], SYNC_FORMAT)
glue("hyb_sum", first.summed, SYNC_FORMAT)
glue("hyb_avg", first.averaged, SYNC_FORMAT)
glue("hyb_single", first.single, SYNC_FORMAT)

# %% [markdown]
# The <span data-glue="hyb_pairs">4</span> groups are the <span data-glue="hyb_pairs">4</span>
# stages. Each copy saw different samples, so each pair starts from different local
# gradients. For one weight of hidden layer 1: A1 has
# <span data-glue="hyb_a1">-1.3312e-03</span> and C1 has
# <span data-glue="hyb_c1">-1.4265e-03</span>; the all-reduce leaves both with the sum,
# <span data-glue="hyb_sum">-2.7577e-03</span>, and each halves it to
# <span data-glue="hyb_avg">-1.3788e-03</span>. One process that trains on the whole batch
# gets <span data-glue="hyb_single">-1.3788e-03</span> for the same weight. The figure draws
# the same numbers: the rows are the two copies, and the red arrows the all-reduces.

# %%
from parlab.viz.plots import sync_figure

show(sync_figure(hybrid))

# %% [markdown]
# ## 7. The production API: `torch.distributed.pipelining`
#
# PyTorch ships these schedules as `ScheduleGPipe` and `Schedule1F1B`. Each rank wraps its
# layer in a `PipelineStage`, and the schedule's `step()` does the sends and receives.
# Below, the same <span data-glue="s7_stages">4</span>-stage network with the same data runs
# on gloo ranks, and we compare PyTorch's gradients with our executor's. PyTorch also
# exposes its plan as `pipeline_order`, in the same action notation. We compare each rank's
# order of actions with ours (idle steps left out).

# %%
from parlab.pipeline import our_action_order, torch_pipelining

torch_runs = torch_pipelining(("gpipe", "1f1b"), stages=4, microbatches=4)
for kind, theirs in torch_runs.items():
    print(f"{kind}: largest gradient difference from our executor below 1e-6: "
          f"{theirs.difference(runs[kind]) < 1e-6}")  # runs: our executor's, from section 5

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("s7_stages", torch_runs["1f1b"].stages)
glue("s7_m", torch_runs["1f1b"].microbatches)
glue("s7_m_last", torch_runs["1f1b"].microbatches - 1)

# %% [markdown]
# The order of actions on each rank, PyTorch's plan beside ours. (PyTorch's plan can differ
# from one PyTorch version to the next.)

# %% tags=["nbval-ignore-output"]
import torch

same = {}
for kind, theirs in torch_runs.items():
    print(kind)
    mine = our_action_order(runs[kind].simulation.schedule)
    same[kind] = [theirs.actions[rank] == mine[rank] for rank in range(4)]
    for rank in range(4):
        print(f"  rank {rank}: " + ("same order" if same[kind][rank] else
                                    f"torch {' '.join(theirs.actions[rank])} | "
                                    f"ours {' '.join(mine[rank])}"))
last_forwards = torch_runs["1f1b"].forward_microbatches(3)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell", "nbval-ignore-output"]
glue("s7_torch", torch.__version__.split("+")[0])
glue("s7_1f1b_same", sum(same["1f1b"]))
glue("s7_first_mb", last_forwards[0])
glue("s7_last_mb", last_forwards[-1])

# %% [markdown]
# The gradients agree for both schedules. The orders agree for every rank of GPipe and for
# the first <span data-glue="s7_1f1b_same">3</span> ranks of 1F1B. For the last rank, the
# `pipeline_order` that PyTorch (torch <span data-glue="s7_torch">2.13.0</span>) builds for
# `Schedule1F1B` lists forward passes of micro-batches
# <span data-glue="s7_first_mb">1</span> to <span data-glue="s7_last_mb">4</span>. A batch of
# <span data-glue="s7_m">4</span> micro-batches has no micro-batch
# <span data-glue="s7_last_mb">4</span> (they are numbered 0 to
# <span data-glue="s7_m_last">3</span>), so this list is off by one. PyTorch uses
# `pipeline_order` only to draw schedules; the execution follows a different code path,
# which is why the gradients still agree. Our simulator would reject that list as a
# schedule.

# %% [markdown]
# ## 8. Exercises
#
# Exercises 03.1 to 03.3 are in section 5, each before the cell that prints its answer. One
# more, to write yourself.
#
# **Exercise 03.4 (write and run).** Write the `pipeline_order` of GPipe for 2 stages and 2
# micro-batches: a dict `{rank: [entry per time step]}` with actions such as `"0F0"` and
# `None` for an idle step. It must be a valid schedule with one action per GPU and time step
# (no doubled entries: section 5 showed what they hide), and as short as possible. The checker
# runs it through the simulator, so an invalid schedule gets the simulator's reason. To try
# it yourself first, `from parlab.pipeline import from_order`: then
# `print(from_order(answer_03_4))` shows your dict as a table, and
# `print(simulate(from_order(answer_03_4)).summary())` counts its time steps (or raises an
# error that says what is wrong).

# %%
answer_03_4 = ...  # for example {0: ["0F0", ...], 1: [None, ...]}
check("03.4", answer_03_4)

# %% [markdown]
# Worked solutions are in `pkg/parlab/exercises/ch03_solutions.py`. This notebook does not
# import it; open it once you have tried.
#
# ## What's next
#
# Pipelines split a model *between* layers. Chapter 04 splits *inside* a layer: the
# attention and feed-forward layers of a transformer, sharded across GPUs (Figures 8-15
# to 8-19).
