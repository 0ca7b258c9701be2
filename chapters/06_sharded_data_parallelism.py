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
# # 06 · Beyond the book: sharded data parallelism (ZeRO, FSDP) and recomputation
#
# The book's chapter introduces four ways to split training: data, model, pipeline and
# tensor parallelism (its model parallelism puts different layers on different GPUs, the
# split that chapter 03's pipeline keeps busy). Open a training stack today and the first
# thing you meet is one more, built on the first: **sharded data parallelism**. DeepSpeed
# calls it ZeRO (Rajbhandari et al., 2020), PyTorch calls it FSDP. It keeps data
# parallelism's simple recipe (every GPU runs the whole model on its own slice of the batch)
# but drops its most wasteful habit: every GPU keeping a full copy of the parameters, the
# gradients and the optimizer state.
#
# In this notebook you will:
#
# 1. count what a data-parallel GPU holds, and what each ZeRO stage removes;
# 2. cut a layer into equal shards, the unit that everything here moves;
# 3. run ZeRO stages 0 to 3, written by hand, on <span data-glue="stage_ranks">2 and 4</span>
#    real ranks, and check each against one process training alone, step by step;
# 4. measure the bytes each rank holds, against the ZeRO paper's formula;
# 5. log every byte each rank sends, against the closed forms, collective by collective;
# 6. run PyTorch's own FSDP (`fully_shard`) on the same problem and compare;
# 7. scale the numbers to billions of parameters and a thousand GPUs;
# 8. trade memory for compute with activation recomputation;
# 9. let chapter 05's planner shard the replicas of a 3D layout;
# 10. explore any preset, GPU count and stage, and solve five exercises.
#
# Everything runs on a CPU, with gloo and the logging toy backend, in about a minute.

# %%
import torch

from parlab import sharded
from parlab.launch import preload
from parlab.memory import model_state_bytes
from parlab.viz import show

_ = preload("torch.optim", "torch.distributed.fsdp")   # import once, not in every rank
per_parameter = model_state_bytes(1, "adam", "bf16")   # the bytes of one parameter

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
from parlab.viz import glue

glue("bf16_weight", per_parameter.parameters)
glue("bf16_gradient", per_parameter.gradients)
glue("bf16_k", per_parameter.master_weights + per_parameter.optimizer_state)
glue("bf16_total", per_parameter.total)

# %% [markdown]
# ## 1. What a data-parallel GPU holds
#
# Call the number of parameters Ψ. Trained in mixed precision with Adam, each parameter
# costs <span data-glue="bf16_weight">2</span> bytes of bf16 weight,
# <span data-glue="bf16_gradient">2</span> bytes of bf16 gradient, and K =
# <span data-glue="bf16_k">12</span> bytes the optimizer keeps in fp32: a master copy of the
# weight and Adam's two moments (chapter 01 lists the same parts). That is
# <span data-glue="bf16_total">16</span> Ψ bytes, and plain data parallelism keeps all
# <span data-glue="bf16_total">16</span> on every GPU. ZeRO splits them over the N
# data-parallel GPUs, one kind more per stage:
#
# | stage | split over the N GPUs | bytes per GPU |
# |---|---|---|
# | 0 (plain data parallelism) | nothing | `(2 + 2 + K) Ψ` |
# | 1 | optimizer state (with the master copy) | `2Ψ + 2Ψ + KΨ/N` |
# | 2 | and gradients | `2Ψ + (2 + K)Ψ/N` |
# | 3 | and parameters | `(2 + 2 + K)Ψ/N` |
#
# **Exercise 06.1 (predict first).** The ZeRO paper's worked example is a 7.5 B model on 64
# GPUs. Before you run the next cell, work out the GB per GPU under stage 2.

# %%
from parlab.exercises import check

check("06.1", ...)

# %% [markdown]
# `model_state_bytes` is the one formula behind every model-state number in this
# companion (chapter 01's calculator calls it too):

# %%
for stage in range(4):
    states = model_state_bytes(7_500_000_000, "adam", "bf16", dp=64, zero=stage)
    print(f"stage {stage}: {states.total / 1e9:6.2f} GB per GPU   " +
          ", ".join(f"{k.replace('_', ' ')} {v / 1e9:.3g}" for k, v in states.parts().items()))

# %% [markdown]
# The paper prints 120, 31.4, 16.6 and 1.9 GB: the same numbers, rounded. Stage 1 alone
# removes most of the memory, because the optimizer's K bytes are most of the
# <span data-glue="bf16_total">16</span>.
#
# ## 2. A layer cut into equal shards
#
# Sharding is bookkeeping first. A layer's weight and bias are laid end to end in one flat
# buffer, padded with zeros until it splits into N equal shards; rank r owns shard r.
# Equal shards are what the two collectives of this chapter need: an **all-gather** puts
# every rank's shard into everyone's full buffer, a **reduce-scatter** sums a full buffer
# over the ranks and hands each rank only its own slice of the sum. FSDP pads the same way.
# A `Linear(3, 3)` over <span data-glue="pad_ranks">5</span> ranks, whose parameters do not
# divide by <span data-glue="pad_ranks">5</span>, shows the padding:

# %%
layer, world = torch.nn.Linear(3, 3), 5
for rank in range(world):
    shard = sharded.FlatShard(layer, rank=rank, world_size=world, own_shard=True)
    print(f"rank {rank}: elements {rank * shard.shard_numel:2d} to "
          f"{(rank + 1) * shard.shard_numel - 1:2d}, of which real: {shard.values().numel()}")
print(f"{shard.numel} parameters padded to {shard.padded}")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("pad_ranks", world)

# %% [markdown]
# ## 3. ZeRO stages 0 to 3 on real ranks
#
# The problem: an MLP of <span data-glue="mlp_layers">3</span> `nn.Linear` layers
# (<span data-glue="mlp_sizes">16 → 32 → 32 → 8</span>, Tanh between), Adam,
# <span data-glue="mlp_steps">3</span> steps on fresh data, the batch of
# <span data-glue="mlp_samples">16</span> samples split evenly over the ranks. Each stage is
# written out by hand in `parlab.sharded.zero`:
#
# * **stage 0**: plain data parallelism; after backward, each layer's gradient is
#   all-reduced;
# * **stage 1**: each rank keeps Adam's state for its shard only. After backward the
#   gradient is reduce-scattered (each rank needs only its slice), each rank updates its
#   slice, and the new parameters are all-gathered;
# * **stage 2**: the same collectives, but each layer's reduce-scatter runs *during*
#   backward, as soon as that layer's gradient is complete, and its full gradient is freed at
#   once;
# * **stage 3**: the parameters are sharded too. A hook all-gathers a layer just before its
#   forward and frees it after; another gathers it again just before its backward; its
#   gradient is then reduce-scattered and the layer freed again.
#
# `stage_table` runs every stage on <span data-glue="stage_ranks">2 and 4</span> ranks with
# the toy backend (every message logged on its way through memory the ranks share), then
# PyTorch's FSDP2 on the same problem, and checks each run three ways. This is the one
# slow cell of the chapter.

# %% tags=["nbval-ignore-output"]
from parlab.experiments import stage_table

problem, world_sizes = sharded.ZeroSpec(), (2, 4)
table = stage_table(world_sizes=world_sizes, spec=problem, progress=True)

# %% [markdown]
# First, do they train the same model as one process? `max difference` is the largest
# gap, over all <span data-glue="mlp_steps">3</span> steps, between the parameters (and the
# loss) of the sharded run and those of one process training on the whole batch with
# `torch.optim.Adam`:

# %%
print(table[["run", "ranks", "max difference"]].to_string(index=False,
      formatters={"max difference": lambda v: "< 1e-6" if v < 1e-6 else f"{v:.1e}"}))

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("stage_ranks", " and ".join(str(n) for n in world_sizes))
glue("mlp_layers", len(problem.sizes) - 1)
glue("mlp_sizes", " → ".join(str(n) for n in problem.sizes))
glue("mlp_steps", problem.steps)
glue("mlp_samples", problem.samples)

# %% [markdown]
# All of them agree to float rounding. That is no accident: Adam (and SGD) act on each
# number separately, so updating each slice with the average gradient of that slice is the
# same arithmetic as updating the whole tensor; only the order in which the ranks' gradients
# are added differs. Every stage agrees the same way on gloo as on the toy backend.
#
# ## 4. What each rank holds
#
# After the last backward pass, each rank counted the bytes it held of each kind (distinct
# storages, so a view is not counted twice; a freed layer counts zero). The formula is
# `model_state_bytes` in fp32, where Adam has no master copy, so K =
# <span data-glue="fp32_k">8</span> here:

# %%
from parlab.viz.plots import zero_memory_figure

print(f"{problem.parameters:,} parameters, {4 * problem.parameters:,} bytes in fp32")
fp32 = model_state_bytes(1, "adam", "fp32")
print(table[["run", "ranks", "parameters", "gradients", "optimizer_state", "held",
             "formula"]].to_string(index=False))
show(zero_memory_figure(table))

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("fp32_k", fp32.master_weights + fp32.optimizer_state)

# %% [markdown]
# Every rank held exactly what the formula says, at every stage (black ticks). The layer
# sizes divide by <span data-glue="stage_ranks">2 and 4</span>, so there is no padding here;
# with padding, each rank holds up to one element more per layer.
#
# ## 5. What each rank sends
#
# **Exercise 06.2 (predict first).** Stage 3 gathers every layer twice and scatters its
# gradient once: as a multiple of the parameter bytes P, how much does each of 4 ranks
# send per step?

# %%
check("06.2", ...)

# %% [markdown]
# The toy backend logged every message of every run; here is what each rank sent per step,
# beside the closed form:

# %%
from parlab.viz.plots import zero3_timeline_figure, zero_traffic_figure

print(table[["run", "ranks", "sent per step", "closed form"]].to_string(index=False))
show(zero_traffic_figure(table))
sent = {(r.run, r.ranks): r["sent per step"] for _, r in table.iterrows()}

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("zero3_ratio", sent[("ZeRO-3", 4)] / sent[("ZeRO-0", 4)], ".2f")

# %% [markdown]
# Stages 1 and 2 send exactly what stage 0 sends. A ring all-reduce is a reduce-scatter
# followed by an all-gather; stages 1 and 2 just run the two halves at different moments,
# with the update in between. Stage 3 adds a second all-gather, so it sends
# <span data-glue="zero3_ratio">1.50</span> times as much. FSDP2 sends the same bytes as
# our stage 3.
#
# The order of one ZeRO-3 step, on <span data-glue="timeline_ranks">2</span> ranks,
# collective by collective (the log's call numbers matched with what each rank was doing):

# %%
spec, timeline_ranks = sharded.ZeroSpec(steps=1), 2
one_step = sharded.train_zero(3, timeline_ranks, spec, backend="toy").collectives()
print(one_step.to_string(index=False))
show(zero3_timeline_figure(one_step, len(spec.sizes) - 1))

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("timeline_ranks", timeline_ranks)

# %% [markdown]
# The forward pass gathers the layers in order, first to last. The backward pass starts from
# the last layer: gather, compute the gradients, reduce-scatter them, free the layer, and move
# on. At any moment only one layer is whole, which is why stage 3 can hold models far
# larger than one GPU. The last layer is gathered twice in a row; frameworks keep the last
# layer after forward to save that gather.
#
# ## 6. PyTorch's FSDP on the same problem
#
# `torch.distributed.fsdp.fully_shard` (FSDP2) on each `Linear`, then on the model, is
# stage 3 with one unit per layer. Each parameter becomes a `DTensor` split along its first
# dimension. It ran in the table above on the toy backend, so its own collectives are in
# the log. Its rows, beside our stage 3:

# %%
print(table[table.stage == 3][["run", "ranks", "max difference", "held", "sent per step"]]
      .to_string(index=False, formatters={"max difference": lambda v: "< 1e-6" if v < 1e-6
                                          else f"{v:.1e}"}))

# %% [markdown]
# The same parameters, the same bytes held, the same bytes sent. Two details differ: FSDP
# splits each weight along its rows rather than each layer's flat buffer (the bytes per rank
# are the same), and in backward it **prefetches**: it issues the next layer's all-gather
# before the current layer's reduce-scatter, so the gather can overlap the computation.
#
# ## 7. Billions of parameters, a thousand GPUs
#
# The same formulas for the paper's 7.5 B model, bf16 with Adam, as the data-parallel GPUs
# grow. Left, the model states per GPU; right, the seconds per step spent sending (ring
# collectives on a <span data-glue="scaling_gbps">400</span> Gb/s NIC) against the compute of
# each GPU's share of a fixed global batch of
# <span data-glue="global_sequences">2,048</span> sequences of
# <span data-glue="global_seq_tokens">2,048</span> tokens (about
# <span data-glue="global_tokens_m">4.2</span> M tokens):

# %%
from parlab.viz.plots import zero_scaling_figure

gbps = 400
scaling = sharded.zero_scaling(7.5e9, gbps=gbps)
print(scaling[scaling.gpus.isin([8, 64, 1024])].round(3).to_string(index=False))
fine = sharded.zero_scaling(7.5e9, gpus=range(8, 2049, 8), gbps=gbps)
for stage, rows in fine.groupby("stage"):
    slower = rows[rows["comm s"] > rows["compute s"]].gpus
    print(f"stage {stage}: sending outlasts computing from {slower.min()} GPUs on")
show(zero_scaling_figure(scaling, 7.5e9))
sent_gb = scaling.pivot(index="gpus", columns="stage", values="GB sent per GPU")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("scaling_gbps", gbps)
glue("global_sequences", sharded.GLOBAL_BATCH[0], ",")
glue("global_seq_tokens", sharded.GLOBAL_BATCH[1], ",")
glue("global_tokens_m", sharded.GLOBAL_TOKENS / 1e6, ".1f")
glue("scaling_zero3_ratio", (sent_gb[3] / sent_gb[0]).max(), ".1f")

# %% [markdown]
# * Stages 1 and 2 level off: the parts they do not split (bf16 parameters, and for stage 1
#   the gradients) stay on every GPU. Only stage 3 keeps falling as `1/N`.
# * The bytes each GPU sends barely change with N (the factor `(N−1)/N` tends to `1`), but
#   each GPU's share of the compute shrinks as `1/N`. From the GPU counts printed above on, a
#   step spends more time sending than computing unless the two overlap; stage 3, sending
#   <span data-glue="scaling_zero3_ratio">1.5</span> times as much per GPU, crosses over with
#   fewer GPUs.
#
# **Exercise 06.3 (a small computation).** A 70 B model, bf16 with Adam, ZeRO stage 3, on
# 80 GB GPUs: counting model states only, what is the fewest data-parallel GPUs on which it
# fits?

# %%
check("06.3", ...)

# %% [markdown]
# ## 8. Recomputation: memory for compute
#
# ZeRO removes the copies of the model states. The other big consumer, activations, is
# untouched: each GPU still keeps what autograd saved for its own samples. **Activation
# recomputation** (or checkpointing) keeps only each layer's input during the forward pass
# and re-runs the layer's forward during the backward pass to get the rest back.
#
# **Exercise 06.4 (predict first).** Forward costs 2 FLOPs per parameter per token and
# backward 4. By what factor does full recomputation multiply a step's FLOPs?

# %%
check("06.4", ...)

# %% [markdown]
# Now measure it. `measure_recompute` runs one forward and backward pass of chapter 01's tiny
# GPT (<span data-glue="tiny_blocks">2</span> blocks, <span data-glue="tiny_batch">4</span>
# sequences of <span data-glue="tiny_tokens">16</span> tokens, fp32) three times: as it is,
# with every block wrapped in `torch.utils.checkpoint` (full), and with only each block's
# attention core wrapped (selective, below). Bytes come from a tracker of every storage an op
# creates and frees (autograd's saved-tensor hooks see nothing inside a checkpoint), FLOPs
# from PyTorch's `FlopCounterMode`:

# %%
from parlab.memory import estimate, measure_recompute, recompute_flops
from parlab.models import build_model, get_config

tiny, (b, t) = get_config("tiny"), (4, 16)
g = torch.Generator().manual_seed(0)
tokens, targets = (torch.randint(0, tiny.vocab, (b, t), generator=g) for _ in range(2))
model = build_model(tiny, seed=0)
runs = {r: measure_recompute(model, tokens, targets, recompute=r)
        for r in (None, "selective", "full")}
for r, m in runs.items():
    predicted = estimate(tiny, (b, t), "sgd", recompute=r).activations
    print(f"recompute={str(r):9s}: kept {m.activations:>7,} B + token ids {m.input_bytes:,} B "
          f"+ one block rebuilt {m.recomputed:>7,} B = {m.held:>7,} B; estimate "
          f"{predicted:>7,} B (short by {m.held - predicted} B, the loss: {m.loss_bytes} B); "
          f"peak {m.peak:>7,} B; FLOPs {m.flops:>10,}")
same = all(torch.equal(runs[None].grads[k], runs[r].grads[k])
           for k in runs[None].grads for r in ("selective", "full"))
d = tiny.d_model
print(f"gradients identical: {same}; full: FLOPs ratio {runs['full'].flops / runs[None].flops:.3f}, "
      f"extra FLOPs = the blocks' forward FLOPs: "
      f"{runs['full'].flops - runs[None].flops == runs[None].layer_forward_flops}")
print(f"selective: extra FLOPs {runs['selective'].flops - runs[None].flops:,} = "
      f"QK^T and PV again, 4·b·T²·d per block: {4 * b * t * t * d * tiny.n_layers:,}")
none, selective = runs[None], runs["selective"]
print(f"selective: kept {none.activations - selective.activations:,} B less, "
      f"peak {none.peak - selective.peak:,} B lower")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("tiny_blocks", tiny.n_layers)
glue("tiny_batch", b)
glue("tiny_tokens", t)
glue("full_flops_ratio", runs["full"].flops / runs[None].flops, ".3f")
glue("loss_bytes", runs[None].loss_bytes)
glue("sel_dropped", none.activations - selective.activations, ",")
glue("sel_rebuilt", selective.recomputed, ",")
glue("sel_held_none", none.held, ",")
glue("sel_held", selective.held, ",")
glue("sel_peak_none", none.peak, ",")
glue("sel_peak", selective.peak, ",")

# %% [markdown]
# With full recomputation each block keeps only its input; during backward one block at a
# time is rebuilt, so the peak falls by less than the kept activations do. The FLOPs grow by
# exactly the blocks' forward work; the ratio, <span data-glue="full_flops_ratio">1.299</span>,
# is a little under `4/3` because the output layer is not recomputed. Chapter 01's
# calculator, given `recompute=`, predicts those bytes to within the loss, a
# <span data-glue="loss_bytes">4</span>-byte scalar that is alive but never saved for
# backward.
#
# *Selective* recomputation re-runs only each block's attention core, softmax(QK^T/√d)·V:
# its extra FLOPs are exactly the two matrix products again. The checkpoint keeps the core's
# inputs Q, K and V as the projections made them (as many bytes as the head copies the core
# no longer keeps), and the core, rebuilt during the backward pass, holds its probabilities
# and mask again plus fresh copies of the Q, K and V heads that its matrix products make.
# The calculator counts exactly these, so its selective estimate also matches the
# measurement to within the loss. Here, at <span data-glue="tiny_tokens">16</span> tokens,
# the probabilities it drops (`b·h·T²` per block) are small: the blocks keep
# <span data-glue="sel_dropped">33,280</span> B less, but rebuilding one core makes
# <span data-glue="sel_rebuilt">41,216</span> B, so the bytes the estimate counts (kept plus
# one block rebuilt) *grow*, from <span data-glue="sel_held_none">340,104</span> to
# <span data-glue="sel_held">348,040</span> B. Only the measured peak falls, from
# <span data-glue="sel_peak_none">388,232</span> to <span data-glue="sel_peak">354,952</span>
# B, by exactly what the blocks no longer keep: the peak comes early in the backward pass,
# before any core is rebuilt. The probabilities grow with the square of the sequence, so at
# longer sequences selective recomputation pays.
#
# At scale the effect is large. GPT-3 6.7B, one sequence of
# <span data-glue="big_tokens">2,048</span> tokens, bf16: activations
# per GPU with no recomputation, with *selective* recomputation (Korthikanti et al., 2022:
# recompute only the attention core, whose `b·h·T²` softmax probabilities dominate at long
# sequences) and with full recomputation, and the compute each adds:

# %%
big, big_tokens = get_config("GPT-3 6.7B"), 2048
for r in (None, "selective", "full"):
    act = estimate(big, (1, big_tokens), "adam", "bf16", recompute=r).activations
    extra = recompute_flops(big, big_tokens, recompute=r).fraction
    print(f"recompute={str(r):9s} activations {act / 1e9:6.2f} GB, extra compute {100 * extra:5.1f} %")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("big_tokens", big_tokens, ",")

# %% [markdown]
# ## 9. ZeRO inside 3D parallelism
#
# Sharding the model states is not a rival to chapter 05's data, tensor and pipeline
# split: it applies to the data-parallel replicas of any layout. Chapter 05's planner takes
# the stage as `zero=`. GPT-3 175B on <span data-glue="plan_gpus">1,024</span> H100s, the
# fastest layout that fits for each stage:

# %%
from parlab.hybrid import plan

plan_gpus = 1024
for stage in range(4):
    layouts = plan("GPT-3 175B", plan_gpus, zero=stage)
    print(f"stage {stage}: {len(layouts):2d} layouts fit; fastest: {str(layouts[0]).strip()}")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("plan_gpus", plan_gpus, ",")

# %% [markdown]
# With the model states sharded, layouts with fewer pipeline stages and more replicas fit,
# and the planner can trade a little data-parallel traffic for a smaller bubble. Stage 3's
# extra all-gather shows up as a longer data-parallel exchange.
#
# ## 10. Explore
#
# Any preset, any number of data-parallel GPUs, any stage, with or without recomputation:
# bars for the four stages per GPU (model states and activations, one sequence per GPU, of
# the length printed above the bars), and what the chosen stage sends per step against the
# compute it has to hide behind (recomputation included).

# %%
from parlab.viz.widgets import zero_explorer

zero_explorer()

# %% [markdown]
# ## 11. Exercises
#
# **Exercise 06.5 (write code).** A ring all-reduce is a reduce-scatter followed by an
# all-gather. Write `all_reduce_in_halves(t)` that sums a 1-D tensor `t` in place over all
# ranks using only `dist.reduce_scatter_tensor` and `dist.all_gather_into_tensor`. The
# checker runs it on two world sizes with the toy backend and compares both the sum and the
# bytes on the wire with a ring all-reduce's.

# %%
import torch.distributed as dist


def all_reduce_in_halves(t):
    ...  # your code here


check("06.5", ...)  # when your function is ready: check("06.5", all_reduce_in_halves)

# %% [markdown]
# ## What's next
#
# ZeRO and FSDP combine with the rest of the chapter: inside a pipeline stage and a tensor
# split, the data-parallel replicas can shard their model states too. Chapter 05's planner
# counts memory with the same `model_state_bytes`, and `parlab.memory.estimate` takes
# `zero=` for any split.
