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
# # 01 · What a GPU holds to train, and what a run costs
#
# The chapter opens with **Figure 8-1**, a list of what a GPU has to keep in memory while
# it trains a network, and then prices a two-month run on 50,000 GPUs. Both claims lead to
# the same place: one GPU is not enough, and losing a run's progress is expensive. This
# notebook puts numbers on both, computed rather than quoted.
#
# In this notebook you will:
#
# 1. train a small network for one step and list every tensor it keeps, named as in
#    Figure 8-1 (weights, weighted sums, activations, errors, local and remote gradients,
#    learning rate, weight adjustments), with its shape and bytes;
# 2. count GPT-3's 175 billion parameters from its configuration;
# 3. use a training-memory calculator (parameters, gradients, optimizer state, activations)
#    that is checked against a real training step, and see how many GPUs a model needs;
# 4. recompute the book's electricity bill, separate what a lost packet costs (a short wait)
#    from what a failed link or node costs (the run, unless there are checkpoints), and see
#    what failures cost with and without checkpoints;
# 5. solve four exercises; three of them ask you to predict a number before the notebook
#    prints it.
#
# Book figures: 8-1 and the power consumption example. Everything runs on a CPU in a few
# seconds.

# %% [markdown]
# ## 1. Figure 8-1 from a real training step
#
# `BookMLP` is a small fully connected network whose training step is written out by hand
# (its gradients equal those of PyTorch's autograd), so that nothing is hidden. For
# each layer it keeps:
#
# * the **weights W** and biases b;
# * the **weighted sums z** = (previous activations) × Wᵀ + b, and the **activations y** = f(z);
# * the **errors E** = ∂Loss/∂z, which travel backwards through the network;
# * the **local gradients** ∂Loss/∂W, computed from E and the previous layer's y;
# * the **remote gradients**: what peer GPUs computed for the same weights (data
#   parallelism, chapter 02);
# * the **learning rate** and the **weight adjustments Δw** = −lr × gradient.
#
# First, one GPU alone: a network with 4 inputs, two hidden layers of 5 neurons and 2
# outputs, trained on a batch of 8 samples.

# %%
from parlab import memory
from parlab.models import BookMLP, book_table, held_bytes
from parlab.viz import show
from parlab.experiments import book_step
from parlab.viz.plots import figure_8_1

alone = book_step(sizes=(4, 5, 5, 2), batch=8, with_peer=False)
print(book_table(alone))

# %% [markdown]
# The remote gradients are absent: there is no peer. The output layer is linear, so its
# activations *are* its weighted sums. They share one block of memory, and the table counts
# it once.
#
# The table's total is built from the book's list. The count below is independent: it walks
# every tensor the Python object holds, whatever its name. The two agree, so the list is
# complete.

# %%
rows = alone.memory_rows()
print("sum of the table:      ", sum(r.nbytes for r in rows), "bytes")
print("what the object holds: ", held_bytes(alone), "bytes")

# %% [markdown]
# Each row counts the tensor's own elements: `tensor_bytes` is the number of elements times
# the size of one. That is not always what a tensor keeps in memory. A slice such as `x[:4]`
# is a *view*: it owns no memory and keeps the whole storage of `x` alive.

# %%
import torch

from parlab.models import tensor_bytes

x = torch.zeros(8, 4)
print("x[:4]: its own bytes", tensor_bytes(x[:4]), "; the storage it keeps alive",
      x[:4].untyped_storage().nbytes())

# %% [markdown]
# ### Only W and b are parameters
#
# The book calls everything in Figure 8-1's list "model parameters". Only the weights and
# biases are. They are what training learns and keeps, what `model.parameters()` returns and
# what the optimizer updates. The weighted sums, activations and errors are recomputed for
# every batch; gradients and Δw exist only between the backward pass and the update; the
# learning rate is a hyper-parameter, a setting of the optimizer. The same network as a
# PyTorch module says so:

# %%
module = alone.to_torch()
n_parameters = sum(p.numel() for p in module.parameters())
w_and_b = sum(r.nbytes for r in rows if r.key in ("W", "b"))
print(f"model.parameters(): {n_parameters} numbers, {4 * n_parameters} bytes")
print(f"rows W and b of the table: {w_and_b} bytes of the {sum(r.nbytes for r in rows)} "
      f"the GPU holds ({100 * w_and_b / sum(r.nbytes for r in rows):.0f} %)")
sgd = torch.optim.SGD(module.parameters(), lr=0.1)
print("the learning rate is a setting of the optimizer:", sgd.param_groups[0]["lr"])

# %% [markdown]
# ### What the book adds: the datasets and the code
#
# The book adds that the training and test datasets and the model code have to be in GPU
# memory as well. During training none of the three is, in that sense:
#
# * **The training set** stays on disk or in the host's memory. A `DataLoader` reads it on
#   the CPU and copies one batch at a time to the GPU (usually the next one while the
#   current one trains). What the GPU holds of it are the table's rows *training data x* and
#   *targets*: one batch, not the set. A set small enough may be copied to the GPU whole to
#   save those copies, but that is a choice, not a need.
# * **The test set** takes no part in a training step. Evaluation runs between stretches of
#   training, batch by batch, under `torch.no_grad()`: the forward pass keeps nothing for a
#   backward pass, and there are no gradients.
# * **The code** runs on the CPU: the Python program only launches the GPU's kernels. What
#   the GPU does hold that is neither the model's tensors nor a batch is the CUDA context
#   (the kernels' machine code, loaded once), the libraries' workspaces and NCCL's buffers
#   for the exchanges. `memory.measure` counts tensors and leaves these out, so a plan has
#   to leave room for them.
#
# The same network, with a training set and a test set held the way a `DataLoader` holds
# them:

# %%
from parlab.experiments import datasets_and_batch

where = datasets_and_batch(sizes=(4, 5, 5, 2), batch=8)
print(f"training set, in host memory:      {where['train_bytes']:>8,} bytes")
print(f"test set, in host memory:          {where['test_bytes']:>8,} bytes")
print(f"one batch, handed to the step:     {where['batch_bytes']:>8,} bytes, shapes "
      f"{where['batch_shapes']} (the table's x and targets rows)")
print(f"kept for backward, training pass:  {where['saved_training']:>8,} bytes")
print(f"kept for backward, evaluation pass under no_grad: {where['saved_evaluation']:,} bytes")

# %% [markdown]
# ### A1, one of two data-parallel GPUs
#
# Now the same step as GPU A1 of a pair of data-parallel replicas. A1 trains on its own half
# of the batch (4 samples, its own copy, as on its own GPU); A2 computes its local gradients
# on the other half, and A1 receives them as its *remote* gradients, averages them with its
# own and updates. Figure 8-1 is the picture of this GPU: every item of the book's list is
# now present.
#
# **Exercise 01.1 (predict first).** From the lone GPU's table above: how many bytes will A1
# hold in all? Work it out before you run the cell after the next one.

# %%
from parlab.exercises import check

answer_01_1 = ...
check("01.1", answer_01_1)

# %%
from parlab.models import bytes_by_scaling

a1 = book_step(sizes=(4, 5, 5, 2), batch=8, with_peer=True)
print("remote gradient of layer 1 (dW):", tuple(a1.layers[0].remote_grad_W.shape))
print("total held by A1:", held_bytes(a1), "bytes =", sum(r.nbytes for r in a1.memory_rows()))
by_alone, by_a1 = bytes_by_scaling(alone), bytes_by_scaling(a1)
print(f"\n{'bytes that grow with':<22}{'one GPU alone':>14}{'A1 with a peer':>16}")
for kind in by_alone:
    print(f"{kind:<22}{by_alone[kind]:>14}{by_a1[kind]:>16}")
print(f"{'total':<22}{sum(by_alone.values()):>14}{sum(by_a1.values()):>16}")
show(figure_8_1(a1))

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
from parlab.viz import glue

glue("alone_total", sum(by_alone.values()))
glue("a1_total", sum(by_a1.values()))
glue("a1_batch_saving", by_alone["batch"] - by_a1["batch"])
glue("a1_remote_cost", by_a1["parameters"] - by_alone["parameters"])

# %% [markdown]
# A1 holds <span data-glue="a1_total">1724</span> bytes, the lone GPU
# <span data-glue="alone_total">2096</span>: less, although A1 keeps one item more. Two
# things change. The rows with one line per sample (the data x and its targets, z, y and E)
# halve with A1's half of the batch, which saves
# <span data-glue="a1_batch_saving">640</span> bytes. The remote gradients add one more copy
# of every weight's gradient, <span data-glue="a1_remote_cost">268</span> bytes. Which one
# wins depends on how many samples each GPU trains on against how many weights it holds:

# %%
for batch in (2, 4, 8, 16):
    lone = held_bytes(book_step(sizes=(4, 5, 5, 2), batch=batch, with_peer=False))
    pair = held_bytes(book_step(sizes=(4, 5, 5, 2), batch=batch, with_peer=True))
    print(f"batch {batch:>2}: one GPU alone {lone:>5} B, A1 with a peer {pair:>5} B "
          f"({'less' if pair < lone else 'more'})")

# %% [markdown]
# PyTorch's autograd keeps less than this list. It throws z away where y is enough (ReLU's
# derivative can be read from its output), it never stores E or Δw (they are temporary
# while the backward pass runs), and its gradients replace the separate local and remote
# copies. Here is the same network trained by autograd with plain SGD, measured:

# %%
print(memory.measure(BookMLP((4, 5, 5, 2)), (8,), optimizer="sgd").table())

# %% [markdown]
# ## 2. GPT-3 175B, counted from its configuration
#
# The chapter gives about 605 million parameters per self-attention layer, 1.2 billion per
# feed-forward layer, about 173 billion for the 96 blocks and about 175 billion in all.
# `count_parameters` derives these from six numbers: d_model, layers, heads, d_ff, vocabulary
# and context.
#
# * attention: W_Q, W_K, W_V and the output projection, each d × d plus a bias: 4d² + 4d;
# * feed-forward: d × d_ff and d_ff × d plus biases: 2·d·d_ff + d_ff + d (8d² + 5d for
#   d_ff = 4d);
# * two LayerNorms per block (4d), token and position embeddings, a final LayerNorm; the
#   output layer shares the token embedding matrix (tied), as in GPT-2 and GPT-3.

# %%
from parlab.experiments import book_rounding
from parlab.models import GPT3_175B, TINY, build_model, count_parameters

print(GPT3_175B)
counts = count_parameters(GPT3_175B)
for part in ("attention", "feed_forward", "layer_norms", "block", "blocks", "token_embedding",
             "position_embedding", "final_norm", "total"):
    print(f"{part:<20}{counts[part]:>18,}")
rounding = book_rounding(GPT3_175B)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("gpt3_attention_m", counts["attention"] / 1e6, ".2f")
glue("gpt3_attention_rounded_m", counts["attention"] / 1e6, ".0f")
glue("gpt3_blocks_b", counts["blocks"] / 1e9, ".0f")
glue("gpt3_block_rounded_b", rounding["block_rounded"] / 1e9, ".1f")
glue("gpt3_blocks_from_rounded_b", rounding["blocks_from_rounded"] / 1e9, ".1f")
glue("gpt3_total_b", counts["total"] / 1e9, ".1f")

# %% [markdown]
# A remark on rounding: an attention layer holds
# <span data-glue="gpt3_attention_m">604.03</span> million parameters, which round to
# <span data-glue="gpt3_attention_rounded_m">604</span> million, so the book's "about 605
# million" is rounded up, not to the nearest million. Its "about 173 billion" for the 96
# blocks comes out nearer <span data-glue="gpt3_blocks_b">174</span> billion; the book's
# figure is what one block rounded first to
# <span data-glue="gpt3_block_rounded_b">1.8</span> billion gives when multiplied by 96:
# <span data-glue="gpt3_blocks_from_rounded_b">172.8</span> billion. The total lands at
# <span data-glue="gpt3_total_b">174.6</span> billion, "about 175 billion".
#
# The same formula describes a real PyTorch model. `build_model` makes a GPT-style decoder
# from any configuration, and for a tiny one the formula and the module agree to the last
# parameter:

# %%
tiny = build_model(TINY)
print(TINY)
print("formula:", count_parameters(TINY)["total"], " module:",
      sum(p.numel() for p in tiny.parameters()))

# %% [markdown]
# ## 3. The training-memory calculator
#
# Besides the weights, training keeps their **gradients**, the optimizer's **state** (none
# for SGD, one buffer for momentum, two for Adam), in mixed precision an **fp32 master copy**
# of the weights, and the **activations** that the backward pass will need. Bytes per
# parameter, from `memory.model_state_bytes` for one parameter:

# %%
print(memory.bytes_per_parameter_table())

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("bf16_adam_bytes", memory.model_state_bytes(1, "adam", "bf16").total)

# %% [markdown]
# (fp16 mixed precision keeps the same bytes as bf16.) Activations grow with the batch and
# the sequence length (and with its square inside
# attention). `memory.estimate` adds all of it up for one GPU:

# %%
from parlab.models import GPT2_SMALL

print(memory.estimate(GPT2_SMALL, (8, 1024), optimizer="adam", precision="fp32").table())

# %% [markdown]
# ### Predicted, then measured
#
# A calculator is only worth something if it is right. `memory.measure` takes the same
# arguments, runs real training steps and counts what the second step kept: the storages
# of the weights, gradients and optimizer state, and every tensor autograd saved for the
# backward pass (seen through `torch.autograd.graph.saved_tensors_hooks`). On a GPU it also
# reads `torch.cuda.max_memory_allocated`.

# %%
small = TINY.replace(name="small", d_model=64, n_layers=3, n_heads=4, d_ff=256, vocab=256,
                     context=64)
print(f"{'model':<28}{'optimizer':<10}{'precision':<10}{'predicted':>11}{'measured':>11}"
      f"{'error':>9}")
for model, shape in ((BookMLP((64, 256, 256, 10)), (32,)), (small, (4, 64))):
    for optimizer, precision in (("sgd", "fp32"), ("adam", "fp32"), ("adam", "bf16")):
        p = memory.estimate(model, shape, optimizer, precision)
        m = memory.measure(model, shape, optimizer, precision)
        name = getattr(model, "name", "BookMLP (64, 256, 256, 10)")
        print(f"{name:<28}{optimizer:<10}{precision:<10}{p.total:>11,}{m.total:>11,}"
              f"{100 * (m.total - p.total) / m.total:>8.3f}%")

# %% [markdown]
# The estimate is short by a few bytes with Adam: PyTorch also keeps a 4-byte step counter
# per weight tensor, which the formula leaves out. Everything else matches, because the
# activation formula lists what autograd saves, operation by operation (see the docstring
# of `parlab.memory`). On a GPU the peak is higher: temporary buffers live for a moment
# inside each operation, and `measure` reports them as `other`.
#
# ### Against a GPU's 80 GB
#
# The bars below use the same calculator for the GPT-2 and smaller GPT-3 sizes in fp32
# with Adam, all on one GPU, for a batch of <span data-glue="sizes_batch">8</span> sequences of
# <span data-glue="sizes_seq">1,024</span> tokens. At this batch size
# one 80 GB GPU stops being enough somewhere between GPT-2 large and GPT-2 XL, and the
# activations are the largest part.

# %%
from parlab.experiments import model_sizes_figure

shape = (8, 1024)  # sequences x tokens
show(model_sizes_figure(shape))

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("sizes_batch", shape[0])
glue("sizes_seq", shape[1], ",")

# %% [markdown]
# For GPT-3 175B, `memory.min_gpus` searches the (data × tensor × pipeline) splits for the
# fewest GPUs whose busiest GPU still fits. The ideal number is the total divided by
# 80 GB, which no real split reaches. Tensor parallelism splits each layer's matrices
# (chapter 04), pipeline parallelism gives each GPU a range of layers (chapter 03).
#
# **Exercise 01.2 (predict first).** Before the search runs: leave the activations out and
# split the rest perfectly. How many 80 GB GPUs does GPT-3 175B need at least, in bf16 mixed
# precision with Adam?

# %%
answer_01_2 = ...
check("01.2", answer_01_2)

# %%
import math

from parlab.units import GB

plan = memory.min_gpus(GPT3_175B, (8, 2048), optimizer="adam", precision="bf16")
print(plan)
print(plan.breakdown.table())
whole = memory.estimate(GPT3_175B, (8, 2048), optimizer="adam", precision="bf16")  # one GPU
states = whole.total - whole.activations
print(f"\non one GPU: model states {states / GB:,.0f} GB + activations "
      f"{whole.activations / GB:,.0f} GB = {whole.total / GB:,.0f} GB")
print(f"split perfectly over {plan.breakdown.capacity / GB:.0f} GB GPUs: the states alone on "
      f"{math.ceil(states / plan.breakdown.capacity)}, with the activations on {plan.ideal}")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("states_gpus", math.ceil(states / plan.breakdown.capacity))
glue("states_gb", states / GB, ",.0f")
glue("whole_activations_gb", whole.activations / GB, ",.0f")
glue("ideal_gpus", plan.ideal)
glue("plan_gpus", plan.gpus)

# %% [markdown]
# Exercise 01.2's <span data-glue="states_gpus">35</span> GPUs hold the model states alone
# (<span data-glue="states_gb">2,794</span> GB); the search's "perfect even split" of
# <span data-glue="ideal_gpus">51</span> adds the activations of its batch,
# <span data-glue="whole_activations_gb">1,240</span> GB. No real split is that even: the
# search cuts whole layers into stages and the heads into powers of two, and it needs
# <span data-glue="plan_gpus">64</span> GPUs before its busiest one fits.

# %% [markdown]
# ### Why chapter 05 needs more GPUs per model copy
#
# The search above fits GPT-3 on <span data-glue="copy_few">64</span> GPUs. Chapter 05's
# planner puts GPT-3 on <span data-glue="copy_cluster">1,024</span> GPUs and finds nothing
# with fewer than <span data-glue="copy_planner">128</span> GPUs per copy of the model. Both
# numbers are right; they answer different questions. The search above trains
# <span data-glue="copy_few_batch">8</span> sequences as a single micro-batch: only one
# micro-batch is ever in the pipeline, so the first stage keeps the activations of one, but
# all but one stage wait at any moment. A real step of GPT-3 trains
# <span data-glue="copy_step_batch">1,536</span> sequences and cuts them into many
# micro-batches so that the stages work at once; under 1F1B (chapter 03) the first stage
# then keeps as many micro-batches as there are stages. `parlab.experiments.copy_sizes` changes one
# assumption at a time:

# %%
from parlab.experiments import copy_sizes, copy_table

cluster = 1024  # GPUs, as in chapter 05
sizes = copy_sizes("GPT-3 175B", small_batch=8, global_batch=1536, gpus=cluster)
print(copy_table(sizes))

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("copy_few", sizes[0].gpus)
glue("copy_few_batch", sizes[0].micro_batch)
glue("copy_step_batch", sizes[1].sequences, ",")
glue("copy_few_bubble", 100 * sizes[0].bubble, ".0f")
glue("copy_cluster", cluster, ",")
glue("copy_planner", sizes[4].gpus)
glue("copy_same_split_gb", sizes[1].memory.total / 1e9, ".0f")
glue("copy_fewest", sizes[2].gpus)
glue("copy_recompute", sizes[3].gpus)

# %% [markdown]
# The <span data-glue="copy_few">64</span>-GPU split holds GPT-3 only with a pipeline that is
# idle <span data-glue="copy_few_bubble">97</span> % of the time; given chapter 05's step, the
# same split needs <span data-glue="copy_same_split_gb">136</span> GB per GPU.
# Sized for that step, a copy needs <span data-glue="copy_fewest">72</span> GPUs, or
# <span data-glue="copy_recompute">40</span> if every block recomputes its activations in the
# backward pass (chapter 06). The planner adds two rules of its own: every stage holds the
# same number of layers, and the GPUs per copy divide the
# <span data-glue="copy_cluster">1,024</span> of the cluster. The first copy size that meets
# both and fits is the planner's <span data-glue="copy_planner">128</span>.

# %% [markdown]
# ### Try it
#
# Pick a model, precision, optimizer, batch, sequence length, GPU size and split. The static
# figure shows the default setting; with a live kernel, the controls below it redraw.

# %%
from parlab.viz.widgets import energy_explorer, memory_explorer

memory_explorer(model="GPT-3 175B", precision="bf16", optimizer="adam", batch=8, seq=2048,
                tp=8, pp=16)

# %% [markdown]
# ### Your own model
#
# The question that brings most readers here is about their own model. `memory.estimate`
# also takes any `torch.nn.Module` with an input shape, or an example input (token ids,
# several tensors). It runs one training step on *fake* tensors, which have shapes and
# dtypes but no memory, and counts what autograd saves for the backward pass. A model built
# on PyTorch's `meta` device allocates nothing either, so billions of parameters are
# estimated on a laptop in seconds.
#
# A published configuration first. `from_hf_config` reads a Hugging Face `config.json`
# (a dict, or the path to the file; the GPT-2 and Llama families, grouped-query attention,
# SwiGLU, RMSNorm, rotary positions, tied or untied embeddings). The fields of a few
# published ones are in `HF_PRESETS`; paste your own dict in their place. `memory.estimate`
# and `memory.min_gpus` take the config itself (or its name, or the dict, or the path) and
# count it in closed form, operation by operation as for our GPT, so tensor parallelism
# works too: each of the tp GPUs holds its share of every layer's heads and feed-forward
# width.

# %%
import time

import torch
import torch.nn.functional as F

from parlab.models import HF_PRESETS, from_hf_config

llama = from_hf_config(HF_PRESETS["Llama-3-8B"], name="Llama-3-8B")
print(llama)
print(f"{count_parameters(llama)['total']:,} parameters")
job = dict(input_shape=(8, 2048), optimizer="adam", precision="bf16")  # 8 sequences of 2048
n = 8  # GPUs to split over
for dp, tp, zero, recompute in ((1, 1, 0, None), (n, 1, 0, None), (n, 1, 3, "full"),
                                (1, n, 0, None)):
    b = memory.estimate(llama, **job, dp=dp, tp=tp, zero=zero, recompute=recompute)
    print(f"\ndata {dp} x tensor {tp}, ZeRO stage {zero}, recompute {recompute}: "
          f"fits on one 80 GB GPU? {b.fits}")
    print(b.table())
print()
print(memory.min_gpus(llama, **job))

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("llama_gpus", n)

# %% [markdown]
# On one GPU the model states alone (<span data-glue="bf16_adam_bytes">16</span> bytes per
# parameter) are more than 80 GB. Over <span data-glue="llama_gpus">8</span>
# data-parallel GPUs each one still holds them all; sharding them (ZeRO stage 3, chapter
# 06) and recomputing activations (also chapter 06) brings it under. Tensor parallelism
# over <span data-glue="llama_gpus">8</span> GPUs (chapter 04) divides the weights and most activations instead.
#
# The closed form is checked against a trace of the same model. Built on PyTorch's `meta`
# device it holds no memory, and the trace counts what autograd saves, knowing nothing of
# the formula. Given the same loss (cross-entropy) the two differ only by the token ids,
# which the trace leaves out because the input exists anyway.

# %%
on_meta = build_model(llama, device="meta")          # no memory: shapes only
ids = torch.zeros((8, 2048), dtype=torch.long, device="meta")


def next_token_loss(logits, ids):
    """Cross-entropy against the next token (ids shifted by one), as the closed form counts."""
    return F.cross_entropy(logits.flatten(0, 1), ids.roll(-1, dims=1).flatten())


start = time.perf_counter()
traced = memory.estimate(on_meta, example_input=ids, optimizer="adam", precision="bf16",
                         loss_fn=next_token_loss)
seconds = time.perf_counter() - start
closed = memory.estimate(llama, **job)
print(f"activations, closed form: {closed.activations:>15,} B")
print(f"activations, traced:      {traced.activations:>15,} B, + token ids "
      f"{ids.numel() * 8:,} B = {traced.activations + ids.numel() * 8:,} B")
states = [part for part in closed.parts() if part != "activations"]
print(f"parameters, gradients, optimizer state, master weights equal: "
      f"{all(getattr(closed, p) == getattr(traced, p) for p in states)}")
print(f"8 B parameters traced in under 30 s: {seconds < 30}")

# %% [markdown]
# Then a model defined right here, one this package knows nothing about: a small tagger
# with an embedding, a two-layer LSTM and a linear head. At this size it can also be
# *measured*: `memory.measure` with the same arguments runs real training steps and counts
# what they kept.

# %% tags=["nbval-ignore-output"]
# (the bf16 byte counts depend on the workspace of the oneDNN LSTM kernel that runs)
from torch import nn


class Tagger(nn.Module):
    def __init__(self, vocab=500, d=64, tags=12):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, d, num_layers=2, batch_first=True)
        self.head = nn.Linear(d, tags)

    def forward(self, ids):
        return self.head(self.lstm(self.embed(ids))[0])


torch.manual_seed(0)
tagger = Tagger()
words = torch.randint(0, 500, (16, 40))
print(f"{'optimizer':<10}{'precision':<10}{'estimated':>11}{'measured':>11}{'error':>9}")
errors = []
for optimizer, precision in (("sgd", "fp32"), ("adam", "fp32"), ("adam", "bf16")):
    p = memory.estimate(tagger, example_input=words, optimizer=optimizer, precision=precision)
    m = memory.measure(tagger, example_input=words, optimizer=optimizer, precision=precision)
    errors.append(100 * (m.total - p.total) / m.total)
    print(f"{optimizer:<10}{precision:<10}{p.total:>11,}{m.total:>11,}{errors[-1]:>8.3f}%")

# %%
print(f"estimate within 0.01 % of the measurement, all three: {max(map(abs, errors)) < 0.01}")

# %% [markdown]
# The two agree (Adam's 4-byte step counter per tensor again). The bf16 bytes themselves
# vary: in bf16 the CPU runs the LSTM through oneDNN, whose kernel keeps a workspace of its
# own size, and the estimate asks oneDNN for it. We have seen two sizes on one machine, in
# two kinds of process, and the estimate followed the measurement both times. So the table
# may differ on your machine; the agreement should not. The estimate was checked the same
# way on an MLP, a CNN with batch normalization and pooling, a Llama-style block, an LSTM
# and a GRU, in fp32 and bf16, with SGD and Adam.

# %% [markdown]
# ### Our count beside the textbook formula
#
# The formula most often quoted for the activations of one transformer layer comes from
# Korthikanti et al. (2022, "Reducing Activation Recomputation in Large Transformer Models",
# section 4.1): s·b·h·(34 + 5·a·s/h) bytes, for b sequences of s tokens, hidden size h and
# a attention heads, with 2-byte activations and 1-byte dropout masks. It is built the way
# ours is: for each operation, whatever its backward pass will need. `memory.compare_block`
# sets the two side by side, term by term, for one block; here one block of GPT-3 175B with
# one sequence of <span data-glue="korthikanti_seq">2,048</span> tokens in bf16.

# %%
from parlab.units import format_bytes

seq = 2048
table = memory.compare_block(GPT3_175B, batch=1, seq=seq, precision="bf16")
print(f"{'term':<36}{'Korthikanti':>13}{'ours':>13}   why they differ")
for term, row in table.iterrows():
    print(f"{term:<36}{row['Korthikanti']:>13,}{row['ours']:>13,}   {row['why they differ']}")
theirs, ours = table["Korthikanti"].sum(), table["ours"].sum()
no_dropout = sum(memory.korthikanti_terms(GPT3_175B, 1, seq, dropout=False).values())
dropout_rows = table[table["why they differ"].str.startswith("no dropout")]["Korthikanti"].sum()
print(f"\nKorthikanti et al.: {theirs:>15,} B = {format_bytes(theirs)} per block")
print(f"ours:               {ours:>15,} B = {format_bytes(ours)} per block")
print(f"ours / Korthikanti: {ours / theirs:.2f}; the dropout rows are "
      f"{100 * dropout_rows / theirs:.0f}% of the paper's total")
print(f"Korthikanti without dropout: {no_dropout:,} B, ours minus it: {ours - no_dropout:,} B")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("korthikanti_seq", seq, ",")

# %% [markdown]
# Read the rows from the top.
#
# * **The rows marked "same"** agree exactly. One tensor, the first LayerNorm's output,
#   serves as the input of the Q, K and V projections, and each of them keeps a reference
#   to it, not a copy. The score product keeps Q and K, the product with V keeps V, the
#   output projection keeps the heads put back together. In the MLP, fc1 keeps its input,
#   GELU keeps its input (fc1's output) and fc2 keeps GELU's output. Both counts keep GELU's
#   input *and* output, the two widest tensors of the MLP, because GELU's derivative
#   needs its input and fc2's weight gradient needs its input. The LayerNorms keep their
#   inputs; their outputs are the Q, K, V input and fc1's input already listed.
# * **Dropout** is the whole gap between the two totals, apart from two small rows. The
#   model Korthikanti et al. measure (Megatron's GPT) drops out attention probabilities,
#   the attention's output and the MLP's output. Each dropout keeps a 1-byte mask per
#   element. After the softmax the dropped-out probabilities are also a new tensor, which the
#   product with V keeps beside the softmax output, so a dropout there more than doubles
#   what the probabilities cost. Our GPT has no dropout: no masks, and the product with V
#   reads the softmax output that is kept anyway. The paper's formula with its dropout terms
#   taken out (`korthikanti_terms(..., dropout=False)`) is almost ours.
# * **What is left, the last two rows**, are buffers the paper leaves out as small. Each
#   LayerNorm keeps a mean and a reciprocal standard deviation per token. On the CPU they
#   are in the compute dtype, bf16 here; PyTorch's CUDA kernel keeps them in fp32, twice the
#   bytes. Our attention builds a T×T boolean causal mask in each layer, and `masked_fill`
#   keeps it for its backward pass: one byte per entry, whatever b and h are.
# * **The softmax output** is the largest row in both counts, and it grows with the square
#   of the sequence. Our attention is written out op by op (the same operations as the
#   "math" fallback of PyTorch's `F.scaled_dot_product_attention`) so that every saved tensor
#   is visible. A fused flash-attention kernel, which `scaled_dot_product_attention` picks on
#   a GPU and, in recent PyTorch, on the CPU too, never stores the b·h·T² probabilities. It
#   keeps Q, K, V, its output and one fp32 log-sum-exp per head and row, and rebuilds the
#   probabilities in its backward pass. That is selective recomputation (chapter 06) inside
#   one kernel.
#
# A formula for one block can be checked against a measurement. A GPT with two blocks and
# the same GPT with one block have the same embedding and head, so the difference between
# what autograd saves in their training steps (`memory.measure`) is one block, measured.
# The chapter's `small` model at its full context:

# %%
b, s = 4, 64
one, two = (memory.measure(small.replace(n_layers=n), (b, s), "sgd", "bf16").activations
            for n in (1, 2))
small_table = memory.compare_block(small, b, s, "bf16")
print(small, f"\nbatch {b}, sequence {s}, bf16, one block:")
for name, n in (("measured (2 blocks - 1 block)", two - one),
                ("ours", small_table["ours"].sum()),
                ("Korthikanti et al.", small_table["Korthikanti"].sum()),
                ("Korthikanti et al., no dropout",
                 sum(memory.korthikanti_terms(small, b, s, dropout=False).values()))):
    print(f"{name:<32}{n:>9,} B  {100 * (n - (two - one)) / (two - one):+7.2f}% vs measured")

# %% [markdown]
# Our count is the measurement, to the byte. The paper's formula is not wrong: it counts
# a model with dropout, and without its dropout terms it falls short only by the LayerNorm
# statistics and the causal mask. Before using a published activation formula for your
# model, check what your model's layers actually keep.

# %% [markdown]
# ## 4. The power bill, a lost packet, and a lost run
#
# The book's example: 50,000 GPUs at 350 W for 60 days, at $0.10 per kWh.

# %%
from parlab.memory import (
    expected_waste, failure_cost, rdma_retry_times, training_cost, young_interval
)

run = training_cost(gpus=50_000, watts_per_gpu=350, days=60, usd_per_kwh=0.10)
print(run)
print(f"power {run.power_mw} MW, energy {run.energy_mwh:,.0f} MWh, cost ${run.cost_usd:,.0f}")

# %% [markdown]
# The book goes on: a single packet lost during gradient synchronization pauses training,
# and without a snapshot the run restarts from the beginning. That merges two different
# events, and overstates the first.
#
# * **A lost packet is resent.** The RDMA transports of training clusters (InfiniBand's
#   reliable connection, RoCE) number their packets and acknowledge them. A gap makes the
#   receiver ask again at once; a missing acknowledgement makes the sender resend after a
#   timeout, 4.096 µs × 2^20 with NCCL's default `NCCL_IB_TIMEOUT=20`. The collective finishes
#   late, and since every GPU waits for it, the whole cluster waits. Frequent losses cost a
#   lot of throughput, which is why these fabrics are built not to drop packets (credit-based
#   flow control on InfiniBand, priority flow control on RoCE), but one loss is a delay.
# * **A transfer that never completes stops the run.** A link, NIC, GPU or host that fails
#   does not answer any resend: after `NCCL_IB_RETRY_CNT=7` unanswered resends the queue pair
#   gives up, NCCL reports the error (or a collective hangs until PyTorch's watchdog timeout),
#   and every rank stops. Chapter 02 shows one rank's failed transfer failing every rank, and a
#   checkpoint resuming the run.
#
# **Exercise 01.3 (predict first).** One lost packet, resent after one timeout, while all
# 50,000 GPUs wait. What does the wait cost in electricity, in USD?

# %%
answer_01_3 = ...
check("01.3", answer_01_3)

# %%
retry = rdma_retry_times()
wait_usd = run.usd_per_hour * retry.wait_s / 3600
print(f"one timeout: {retry.wait_s:.2f} s; the transport gives up after {retry.give_up_s:.1f} s")
print(f"the whole cluster waiting one timeout: ${wait_usd:,.2f}")
print(f"a failure at hour 1,439, no checkpoint:      ${failure_cost(run, 1439):>12,.0f}")
every = 2  # hours between checkpoints
print(f"a failure at hour 1,439, checkpoint every {every} h: "
      f"${failure_cost(run, 1439, every):>10,.0f}")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("checkpoint_every", every)
glue("packet_usd", wait_usd, ".2f")

# %% [markdown]
# A lost packet costs <span data-glue="packet_usd">2.09</span> dollars of waiting here. What
# the book's restart costs is a failure: on the last day without a checkpoint it throws the
# whole bill away, with a checkpoint every <span data-glue="checkpoint_every">2</span> hours at
# most <span data-glue="checkpoint_every">2</span> hours of it.

# %% [markdown]
# A job spread over 50,000 GPUs rarely fails only once: it stops whenever any one of its
# GPUs, links or hosts fails, so it fails tens of thousands of times more often than one GPU.
# `expected_waste` treats failures as random arrivals with a mean time between failures
# (MTBF) for the whole job, and counts the repeated work, restarts and time spent writing
# checkpoints. Checkpoint too often and the writes cost time; too rarely and
# each failure throws more work away. Young's rule, √(2 × write time × MTBF), finds the
# balance. Here the MTBF is <span data-glue="mtbf_hours">8</span> hours and a checkpoint takes
# <span data-glue="write_minutes">10</span> minutes to write:

# %%
mtbf, write = 8, 10  # hours between failures, minutes per checkpoint
best = young_interval(mtbf_hours=mtbf, checkpoint_minutes=write)
for interval in (None, mtbf, mtbf // 2, best, 0.5):
    w = expected_waste(run, mtbf_hours=mtbf, interval_hours=interval, checkpoint_minutes=write)
    label = "never" if interval is None else f"every {interval:g} h"
    if interval == best:
        label, at_best = f"every {best:.2f} h (Young)", w
    cost = "the run never finishes" if w.wasted_usd > 1e12 else f"${w.wasted_usd:>12,.0f}"
    print(f"checkpoint {label:<22} expected waste: {cost}")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("mtbf_hours", mtbf)
glue("write_minutes", write)
glue("young_hours", best, ".2f")
glue("young_waste_usd", at_best.wasted_usd, ",.0f")

# %% [markdown]
# Young's interval, <span data-glue="young_hours">1.63</span> hours (printed rounded; the
# waste is computed at the unrounded interval), costs the least of these:
# $<span data-glue="young_waste_usd">795,235</span>, the same figure the explorer below
# prints for its opening setting. Change the run and the failure rate there:

# %%
energy_explorer()

# %% [markdown]
# ## 5. Exercises
#
# Exercises 01.1 to 01.3 are in the text above, each before the cell that answers it. Replace
# each `...` with your answer and run the cell. The checker tells you whether you are right
# and why, without giving the answer away.
#
# **Exercise 01.4 (a small computation).** A job fails on average every 4 hours, and writing
# a checkpoint takes 6 minutes. By Young's rule, every how many hours should it write a
# checkpoint?

# %%
answer_01_4 = ...
check("01.4", answer_01_4)

# %% [markdown]
# ## What's next
#
# Chapter 02 runs the step of section 1 on real ranks: the data-parallel replicas A1 and A2
# of Figure 8-2 exchange their gradients over the network, and we count the bytes they send.
