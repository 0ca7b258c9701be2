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
# # 09 · Beyond the book: pipelines without bubbles
#
# Chapter 03 stopped where pipeline research stood in 2021. GPipe, 1F1B and interleaving
# all leave every GPU idle for p - 1 stages' worth of passes per batch while the pipeline
# fills and drains. Two ideas since then are in every large training stack. **Zero-bubble**
# scheduling (Qi et al., 2024) splits the backward pass in two and fills the idle time with
# the half that nobody waits for. **DualPipe** (DeepSeek-AI, 2024, the DeepSeek-V3 report)
# feeds micro-batches from both ends of the pipeline; its "cut in half" form, DualPipeV,
# runs on a V-shaped placement of the stages. PyTorch has both (`ScheduleZBVZeroBubble`,
# `ScheduleDualPipeV`), and both run on CPU ranks.
#
# In this notebook you will:
#
# 1. see, on one stage of chapter 03's network, why half of the backward pass can wait;
# 2. put 1F1B, ZB-H1, ZBV and DualPipeV side by side on one time axis, for the same model
#    on <span data-glue="zb_ranks">4</span> ranks, and change the ranks, the micro-batches
#    and the times of B and W with sliders;
# 3. time F, B and W on your machine and see how the bubble shrinks with micro-batches and
#    grows with ranks;
# 4. run all four on <span data-glue="real_ranks">2</span> real ranks, each equal to one
#    process, and look at their measured timelines;
# 5. count what each schedule costs in memory, per rank;
# 6. give chapter 05's planner all four schedules and see which one it picks for GPT-3;
# 7. along the way, solve two exercises in which you predict before the notebook prints.
#
# **Notation.** F is the forward pass of one stage on one micro-batch. As in Qi et al., **B**
# is the gradient of the stage's *input* (what the previous stage waits for) and **W** the
# gradient of its *weights*; chapter 03's backward pass is both, B + W, and keeps its label E
# in the charts (E1 = B1 + W1, micro-batches counted from 1 as in chapter 03). PyTorch's
# action codes, used in the code, write B as `I`: `1F0`, `1I0`, `1W0`, and `1B0` for the full
# backward. p is the number of ranks and m of micro-batches. A **V** placement cuts the model
# into 2p stages and gives rank r stages r and 2p - 1 - r: the data go down the ranks and come
# back up, so rank 0 holds the first stage and the last.

# %%
from parlab.experiments import split_backward_demo
from parlab.viz import show

demo = split_backward_demo()
print("the forward pass of one stage (Linear, then sigmoid) on 2 samples saves:")
for name, shape in demo.saved:
    print(f"  {name} {list(shape)}")
print("B needs:", ", ".join(f"{name} {list(shape)}" for name, shape in demo.b_needs))
print("W needs:", ", ".join(f"{name} {list(shape)}" for name, shape in demo.w_needs))
print("after B, the weights have no gradient yet:", demo.untouched)
print("B's input gradient equals autograd's full backward:", demo.input_error == 0)
print("after W, the weight gradients equal autograd's:", demo.weight_error == 0)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
from parlab.viz import glue

glue("kept_share", demo.kept_share, "g")

# %% [markdown]
# ## 1. Why W can wait
#
# The cell above took hidden layer 2 of chapter 03's network as one stage: `z = x Aᵀ + b`,
# then `y = σ(z)`. Its backward pass receives `dL/dy` from the next stage and computes:
#
# - **B**: `dL/dz = dL/dy · σ'(z)`, where `σ'(z) = y(1 - y)` needs the saved output y, and
#   then `dL/dx = dL/dz · A`, which needs the weight. `dL/dx` is the only thing the previous
#   stage waits for.
# - **W**: `dL/dA = dL/dzᵀ · x` and `dL/db = Σ dL/dz`. They need the stage's input x and the
#   `dL/dz` that B computed, nothing else, and nobody needs them before the optimizer step.
#
# So B runs as soon as the gradient arrives and sends `dL/dx` at once; W can run any time
# later. `SplitBackward` does exactly that: B is one `torch.autograd.grad` to the stage's
# input and to the output of every layer that holds weights, W one more call from those
# outputs to the weights. The cell checked it against autograd's ordinary backward: the
# same numbers, and no weight gradient before W.
#
# The price is memory. Between B and W a stage keeps x and `dL/dz`. The sigmoid's output
# can go, but `dL/dz` has its size, so for this layer W keeps
# <span data-glue="kept_share">1</span> times what the forward pass saved: nothing is
# freed before W. In a transformer layer much of what the forward pass saves serves only B
# (the attention probabilities, the inputs of the activation functions), so W keeps a
# smaller share. Section 5 counts both cases.
#
# ## 2. Four schedules, one time axis
#
# - **1F1B** (chapter 03): each stage alternates one forward with one full backward.
# - **ZB-H1** (Qi et al., 2024): 1F1B's order with every backward split, B at once and W
#   later; rank s keeps s W's pending, so each of its W's runs s backwards late and its last
#   s run at the end, where 1F1B idles.
# - **ZBV** (Qi et al.; PyTorch's `ScheduleZBVZeroBubble`): the V placement. The gradient
#   turns round on the last rank, which holds the middle two stages, so the last rank's
#   first backward starts right after its forward.
# - **DualPipeV** (DeepSeek's `dualpipev.py`; PyTorch's `ScheduleDualPipeV`): the same V,
#   and in its middle phase a rank runs a forward of one stage together with a full backward
#   of the other (**F&B**), so that on GPUs one pass's expert all-to-all hides behind the
#   other's arithmetic. CPU ranks have no all-to-all to hide and no second stream to overlap
#   on, so the simulator and our executor run an F&B pair as its forward, then its
#   backward. It needs at least 2p micro-batches.
#
# **Exercise 09.1 (predict first).** Take ZB-H1 on p = 4 ranks with m = 8 micro-batches,
# where one rank's stage takes F = 2 ms, B = 2 ms and W = 1 ms. How many ms does each rank
# idle per batch? The cell after the charts prints it.

# %%
from parlab.exercises import check

answer_09_1 = ...
check("09.1", answer_09_1)

# %% [markdown]
# The charts come from the event-driven simulator (`parlab.pipeline.timeline`): every
# action starts as soon as its rank is free and its input has arrived. All four describe
# the same model: F, B and W are given for one rank's share of the layers, one unit each
# here. A V schedule's stage holds half a rank's layers, so its F, B and W take half a
# unit (`Durations.split(2)`); a transfer is free in these charts. The sliders under the
# charts change the ranks, the micro-batches, and B and W in units of F: make W twice as
# long as F and watch ZB-H1's deferred W's overfill the gaps they were meant for, or take
# fewer micro-batches than DualPipeV needs.

# %%
from parlab.experiments import schedule_timelines, speedups
from parlab.viz.widgets import zero_bubble_explorer

timelines = schedule_timelines()
gains = speedups(timelines)
zero_bubble_explorer()

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
from parlab.experiments import ZB_MICROBATCHES, ZB_RANKS

glue("zb_ranks", ZB_RANKS)
glue("zb_m", ZB_MICROBATCHES)
glue("idle_ofob", timelines["1f1b"].idle[0], "g")
glue("idle_h1", timelines["zb-h1"].idle[0], "g")
glue("idle_zbv", timelines["zbv"].idle[0], "g")
glue("idle_dpv", timelines["dualpipev"].idle[0], "g")
glue("bubble_ofob", timelines["1f1b"].bubble_fraction, ".3f")
glue("bubble_h1", timelines["zb-h1"].bubble_fraction, ".3f")
glue("gain_h1", 100 * gains["zb-h1"], ".0f")
glue("gain_zbv", 100 * gains["zbv"], ".0f")

# %% [markdown]
# On <span data-glue="zb_ranks">4</span> ranks with <span data-glue="zb_m">8</span>
# micro-batches, 1F1B idles <span data-glue="idle_ofob">9</span> units per rank: (p - 1)
# times F + B + W, the time the first micro-batch takes to go down the pipeline and its
# gradient to come back, before the last rank's flush. ZB-H1 idles
# <span data-glue="idle_h1">3</span>, (p - 1)(F + B - W) as Qi et al. derive it: the
# gradient no longer waits for W on its way back, and the deferred W's fill part of what is
# left. Its bubble fraction falls from <span data-glue="bubble_ofob">0.273</span> to
# <span data-glue="bubble_h1">0.111</span>: in these units 1F1B's batch is
# <span data-glue="gain_h1">22</span> % longer than ZB-H1's, and
# <span data-glue="gain_zbv">29</span> % longer than ZBV's. The V schedules idle
# <span data-glue="idle_zbv">1.5</span> (ZBV) and <span data-glue="idle_dpv">1.5</span>
# (DualPipeV). With F = B = W, a ZBV rank is idle only while the first forward reaches it
# and after its last W: (p - 1) V stages' forwards in all, each half a rank's time.
# DualPipeV's idle time adds up to the same, though some of it falls between the pairs of
# its middle phase. With F&B run one pass after the other it is no faster than ZBV here;
# its pairs pay off where an overlap hides communication, which these ranks do not have.
#
# The cell below prints exercise 09.1's answer, with that exercise's times.

# %%
from parlab.pipeline import Durations, program, timeline

h1 = timeline(program("zb-h1", 4, 8), Durations(F=2, B=2, W=1))
print(f"ZB-H1, F = 2, B = 2, W = 1: each rank idles {h1.idle[0]:g} ms per batch "
      f"(1F1B: {timeline(program('1f1b', 4, 8), Durations(F=2, B=2, W=1)).idle[0]:g} ms)")

# %% [markdown]
# ## 3. Your machine's F, B and W, and the bubble
#
# The cell below times F, B and W of one rank's stage of a wider network of chapter 03's
# kind (<span data-glue="real_layers">8</span> layers of
# <span data-glue="real_width">128</span> sigmoid neurons) cut over
# <span data-glue="zb_ranks">4</span> ranks (two layers, one micro-batch, in this process),
# and simulates every schedule with those times: the bubble fraction against micro-batches
# on <span data-glue="zb_ranks">4</span> ranks, and against ranks with
# <span data-glue="sweep_m">16</span> micro-batches. The numbers are yours; they change from
# run to run.

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
from parlab.experiments import SWEEP_MICROBATCHES

glue("sweep_m", SWEEP_MICROBATCHES)

# %% tags=["nbval-ignore-output"]
from parlab.experiments import bubble_chart, measure_passes

measured = measure_passes()
print(f"measured per rank's stage: F = {measured.F:.3f} ms, B = {measured.B:.3f} ms, "
      f"W = {measured.W:.3f} ms")
mine = schedule_timelines(measured)
mine_gains = speedups(mine)
for name, t in mine.items():
    print(f"{name:>9}: idle per rank {t.idle[0]:.2f} ms, bubble fraction "
          f"{t.bubble_fraction:.3f}, simulated {mine_gains[name]:+.0%} against 1F1B")
show(bubble_chart(measured))


# %% [markdown]
# More micro-batches shrink every bubble, because the fill and the drain stay the same
# while the work grows; more ranks grow it, because the fill and drain grow with p. 1F1B
# idles most, the schedules that split the backward less; which of them idles least depends
# on how long W takes against F and B, which is why your machine's times matter: where W is longer than F or B, ZB-H1's deferred W's overfill the gaps they
# were meant for, and it idles (p - 1)(F + B - min(F, B, W)) instead.
#
# What the paper reports is another matter. Qi et al.'s paper (2024) reports up to 23 % more
# throughput than 1F1B at a similar memory limit, for their automatically searched schedule
# on clusters of GPUs with real communication. The simulated percentages printed above are
# an illustration of where such a gain comes from, for this small network on this machine,
# not a check of that number.

# %% [markdown]
# ## 4. On real ranks
#
# One launch trains all four schedules on <span data-glue="real_ranks">2</span> gloo ranks,
# one SGD step each, on the network whose passes section 3 timed
# (<span data-glue="real_samples">64</span> samples in <span data-glue="real_m">8</span>
# micro-batches): each rank builds the stages it holds
# (two in a V), runs its actions in the program's order, B and W as separate calls, and
# sends activations and input gradients with `dist.send` / `dist.recv`. Each is compared with
# one process training the whole network on the whole batch, and each rank's log with the
# simulator's order.

# %%
from parlab.comm import chrome_trace
from parlab.experiments import run_real

real = run_real()
for name, run in real.runs.items():
    print(f"{name:>9}: gradients equal one process's (1e-5): {real.errors[name] < 1e-5}; "
          f"each rank ran the simulator's order, W included: {real.same_order[name]}; "
          f"rank 0 ran {len(run.order(0)[0])} actions")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
from parlab.experiments import WIDE_NET

glue("real_ranks", next(iter(real.runs.values())).program.stages)
glue("real_layers", WIDE_NET.layers)
glue("real_width", WIDE_NET.widths[1])
glue("real_samples", WIDE_NET.samples)
glue("real_m", next(iter(real.runs.values())).program.microbatches)

# %% [markdown]
# The measured timelines of 1F1B and ZB-H1, on one axis of milliseconds (every schedule's
# is in `traces`: `show(measured_figure(traces))` draws all four): the upper lane of each
# rank is its computation (colours as in the charts above), the lower its sends and
# receives. These times change with every run and every machine. The executor keeps each
# rank in the order the simulator found, in steps with a communication phase between them
# (as chapter 03's does), so a rank may wait at a step's hand-over where the simulator
# would already have moved on; and on a few shared cores, handing a tensor to another
# process can take as long as computing it.

# %% tags=["nbval-ignore-output"]
from parlab.comm import trace_summary
from parlab.viz.plots import measured_figure

traces = {name: chrome_trace(run.spans[0]) for name, run in real.runs.items()}
for name, trace in traces.items():
    rows = trace_summary(trace)
    print(f"{name:>9}: " + "; ".join(f"{row['track']} computes {row['compute ms']:.1f} ms, "
                                     f"idle {row['idle ms']:.1f} ms" for row in rows))
show(measured_figure({name: traces[name] for name in ("1f1b", "zb-h1")}))

# %% [markdown]
# ## 5. Memory, per rank
#
# Idle time is half of the trade. Each (stage, micro-batch) pair holds its forward's
# activations until its backward has freed them: a full backward frees all of them, a
# split one frees part at B and the rest (what W needs) at W.
#
# **Exercise 09.2 (predict first).** DualPipeV on p = 4 ranks with m = 8 micro-batches,
# each rank holding two of the V's 8 stages, and nothing freed before W. At most how many
# (stage, micro-batch) pairs does the busiest rank hold at once? The table below gives the
# answer in other units.

# %%
answer_09_2 = ...
check("09.2", answer_09_2)

# %% [markdown]
# The table counts activations in units of one rank's stage on one micro-batch (a V stage
# holds half of that): first with W keeping the share that section 1 found for chapter 03's
# layer, then with W keeping nothing, the lower bound. The last columns give each rank's
# share of the model's parameters and how many ranks hold each stage.

# %%
import pandas as pd

from parlab.experiments import memory_table

for share in (demo.kept_share, 0):
    print(f"W keeps {share:g} of a forward's activations until it runs:")
    print(pd.DataFrame(memory_table(share)).to_string(index=False), end="\n\n")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
peaks = {row["schedule"]: row for row in memory_table(demo.kept_share)}
glue("mem_ofob_0", peaks["1f1b"]["rank 0"], "g")
glue("mem_ofob_last", peaks["1f1b"][f"rank {ZB_RANKS - 1}"], "g")
glue("mem_h1_last", peaks["zb-h1"][f"rank {ZB_RANKS - 1}"], "g")
glue("mem_dpv", peaks["dualpipev"]["rank 0"], "g")
glue("mem_zbv", peaks["zbv"]["rank 0"], "g")

# %% [markdown]
# - **1F1B** holds p - s micro-batches on rank s: <span data-glue="mem_ofob_0">4</span> on
#   rank 0 down to <span data-glue="mem_ofob_last">1</span> on the last.
# - **ZB-H1** keeps 1F1B's peak where it matters, on rank 0, which Qi et al. designed it
#   for. The later ranks, which hold back W's, hold more while W keeps activations alive:
#   the last rank <span data-glue="mem_h1_last">4</span> instead of 1F1B's
#   <span data-glue="mem_ofob_last">1</span>. Where W keeps nothing, ZB-H1's column equals
#   1F1B's.
# - **ZBV** holds <span data-glue="mem_zbv">4</span> on every rank, 1F1B's peak, now on all
#   ranks evenly.
# - **DualPipeV** holds <span data-glue="mem_dpv">4.5</span>: one V stage more than ZBV, the
#   forward of an F&B pair that runs before its backward frees a micro-batch. DeepSeek's
#   table writes this PP + 1 stages, with PP = 2p.
#
# Parameters do not change: every rank holds 1/p of the model, in one copy. The original,
# bidirectional DualPipe keeps two copies of every stage, one for each direction (its
# parameters count twice in DeepSeek's table); cutting it in half into a V is what brings
# it back to one.

# %% [markdown]
# ## 6. In chapter 05's planner
#
# Chapter 05's planner takes `schedule="zb-h1"`, `"zbv"` and `"dualpipev"` too. It knows one
# time per micro-batch and stage, so it takes B and W as long as F each (each is one matrix
# product per weight, as the forward is), and its bubble fractions are the simulator's with
# those times. Its memory count follows each schedule's placement, with W keeping a
# micro-batch's activations whole until it runs:
#
# - ZB-H1 holds up to min(p, m) micro-batches on every stage, where 1F1B's stage s holds
#   min(p - s, m).
# - ZBV and DualPipeV cut the layers into 2p chunks and give rank r chunks r and
#   2p - 1 - r, so rank 0 holds both the embeddings and the output layer. The estimate
#   prices each rank: its two chunks' parameters, and the most (chunk, micro-batch) pairs
#   it holds at once, each chunk weighted by its own activations (the tests hold these
#   counts to the simulator, and to what autograd saves in a real V split of a small GPT).
# - A V rank sends each micro-batch's activation and gradient twice, once per chunk, so the
#   planner counts twice the pipeline traffic. Layouts a V cannot run are skipped: more
#   chunks than layers, or DualPipeV with fewer than 2p micro-batches.
#
# GPT-3 on chapter 05's cluster, each schedule's fastest layout:

# %%
from parlab.experiments import plan_schedules

planned = plan_schedules("GPT-3 175B", 1024)
for name, row in planned.items():
    lay = row.layout
    print(f"{name:>9}: dp {lay.dp} x tp {lay.tp} x pp {lay.pp}, m={lay.microbatches}; busiest "
          f"GPU {lay.memory_per_gpu_bytes / 1e9:.1f} GB (rank 0 {row.rank_gb[0]:.1f} GB); "
          f"bubble {lay.bubble_fraction:.3f}, sends {lay.times['pipeline']:.2f} s, step "
          f"{lay.step_time_s:.3f} s")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
best = {name: row.layout for name, row in planned.items()}
ofob, h1, zbv, dpv = (best[n] for n in ("1f1b", "zb-h1", "zbv", "dualpipev"))
glue("plan_ofob_s", ofob.step_time_s, ".2f")
glue("plan_h1_s", h1.step_time_s, ".2f")
glue("plan_gain", 100 * (ofob.step_time_s / h1.step_time_s - 1), ".0f")
glue("plan_zbv_s", zbv.step_time_s, ".2f")
glue("plan_pp", zbv.pp, "d")
glue("plan_m", zbv.microbatches, "d")
glue("plan_h1_bubble", h1.times["bubble"], ".2f")
glue("plan_zbv_bubble", zbv.times["bubble"], ".2f")
glue("plan_h1_send", h1.times["pipeline"], ".2f")
glue("plan_zbv_send", zbv.times["pipeline"], ".2f")
glue("plan_zbv_once_s", zbv.step_time_s - (zbv.times["pipeline"] - h1.times["pipeline"]), ".2f")
glue("plan_zbv_rank0", planned["zbv"].rank_gb[0], ".1f")
glue("plan_zbv_rest", max(planned["zbv"].rank_gb[1:]), ".1f")
glue("plan_h1_last", planned["zb-h1"].rank_gb[-1], ".1f")
glue("plan_dpv_gb", dpv.memory_per_gpu_bytes / 1e9, ".1f")

# %% [markdown]
# All four pick the same degrees, pipeline depth <span data-glue="plan_pp">16</span> with
# <span data-glue="plan_m">192</span> micro-batches, and **ZB-H1 wins**: its step drops
# from 1F1B's <span data-glue="plan_ofob_s">10.33</span> s to
# <span data-glue="plan_h1_s">9.84</span> s, <span data-glue="plan_gain">5</span> % faster.
#
# **ZBV comes second**, at <span data-glue="plan_zbv_s">10.11</span> s. Its bubble is about
# half of ZB-H1's, <span data-glue="plan_zbv_bubble">0.13</span> s against
# <span data-glue="plan_h1_bubble">0.25</span> s: a rank still idles p - 1 passes, but of a
# chunk, half a stage. The V pays for it in sends: each micro-batch leaves a rank twice,
# once from each chunk, so the pipeline traffic doubles,
# <span data-glue="plan_zbv_send">0.77</span> s against
# <span data-glue="plan_h1_send">0.39</span> s, more than the bubble saves. Were
# the second send free (hidden behind computation, which the planner does not model), ZBV
# would take <span data-glue="plan_zbv_once_s">9.72</span> s and win.
#
# **Memory favours the V.** ZBV's busiest GPU is rank 0, the one with both ends of the model:
# <span data-glue="plan_zbv_rank0">60.2</span> GB against
# <span data-glue="plan_zbv_rest">58.4</span> GB on every other rank, for the embeddings and
# the output layer. That is still less than ZB-H1's busiest GPU, its last stage at
# <span data-glue="plan_h1_last">61.7</span> GB: there the output layer's activations stay
# for up to p micro-batches, while on the V's rank 0 the last chunk holds at most one at a
# time. **DualPipeV** takes ZBV's time exactly (without its F&B overlap, which the planner
# does not count, its bubble is ZBV's) and holds one (chunk, micro-batch) pair more per rank,
# <span data-glue="plan_dpv_gb">61.3</span> GB on rank 0; it runs only with at least 2p
# micro-batches. DeepSeek's bidirectional DualPipe, with two copies of the parameters, is
# not offered.
#
# The memory side weighs more on a smaller model. Plan Llama-3-8B on eight servers with
# 1F1B, then price the same layout under ZB-H1, whose later stages hold more activations:

# %%
from parlab.hybrid import Assumptions, evaluate, plan

fast = plan("Llama-3-8B", 64, schedule="1f1b")[0]
moved = evaluate("Llama-3-8B", fast.dp, fast.tp, fast.pp, fast.microbatches,
                 assumptions=Assumptions(schedule="zb-h1"))
print(f"1F1B's fastest: dp {fast.dp} x tp {fast.tp} x pp {fast.pp}, m={fast.microbatches}, "
      f"{fast.memory_per_gpu_bytes / 1e9:.1f} GB per GPU; the same layout under ZB-H1: "
      f"{moved.memory_per_gpu_bytes / 1e9:.1f} GB, fits in {fast.memory.capacity / 1e9:.0f} GB: "
      f"{moved.fits}")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("llama_ofob_gb", fast.memory_per_gpu_bytes / 1e9, ".1f")
glue("llama_h1_gb", moved.memory_per_gpu_bytes / 1e9, ".1f")

# %% [markdown]
# Under 1F1B the last stage holds one micro-batch and the first holds p; under ZB-H1 every
# stage holds up to p, so the layout that needed
# <span data-glue="llama_ofob_gb">78.4</span> GB per GPU now needs
# <span data-glue="llama_h1_gb">97.3</span> GB and no longer fits: ZB-H1's planner picks
# another layout.
#
# ## What's next
#
# The schedules here keep the pipeline busy; what they cannot hide is the communication
# between stages and, in DeepSeek's case, between experts. DualPipe's F&B pairs exist to
# overlap an expert all-to-all (chapter 07) with the other pass's arithmetic, which needs
# GPUs with separate streams for compute and communication to show.
