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
# # 04 · Tensor parallelism: one layer, several GPUs
#
# Pipeline parallelism (chapter 03) gives each GPU whole layers. That stops working when a
# single layer is too big for one GPU, or too slow on one. Tensor parallelism cuts the
# matrices *inside* a layer, so several GPUs compute one layer together, and exchange
# pieces of their results as they go.
#
# In this notebook you will:
#
# 1. count GPT-3's parameters per layer and see how much memory each GPU keeps when the
#    layers are split 1, 2, 4 or 8 ways (the numbers behind Figure 8-15's discussion);
# 2. cut tensors by rows, columns, heads and token ranges, and print who owns what;
# 3. run the two ways of holding the word-embedding table: on one GPU with a broadcast (the
#    book's default) and split by vocabulary;
# 4. run the Megatron MLP and measure the slide deck's per-layer communication costs;
# 5. run self-attention across two GPUs three ways: as the book describes it (Figures 8-17
#    and 8-18), as Megatron-LM does it, and with PyTorch's own API; check each against the
#    single-GPU layer and count the bytes each one moves;
# 6. run the feed-forward layer of Figure 8-19 on six ranks, tensor parallel inside each
#    server and pipelined across, with every transfer labelled NVLink or rail switch;
# 7. solve four exercises.
#
# Every parallel run is compared, output and gradients, with the same layer on one device.
# Byte counts come from the **toy backend**, which runs each collective as logged
# point-to-point messages (the ring algorithms, unless said otherwise).

# %% [markdown]
# ## 1. How big is one layer? Counting GPT-3
#
# GPT-3 175B has `d_model = 12288`, 96 blocks, 96 heads and a feed-forward width of
# `4 x d_model`. A self-attention layer holds four `d x d` matrices (W_Q, W_K, W_V and the
# output projection W_O) plus their biases; a feed-forward layer holds two `d x 4d`
# matrices. `parlab.models` computes the counts from the configuration (and builds a real
# model whose parameters add up to the same total):

# %%
from parlab.tensor_parallel import counting

counts = counting.gpt3_counts()
for part in ("attention", "feed_forward", "block", "blocks", "token_embedding", "total"):
    book = counting.BOOK_SAYS.get(part)
    said = f"   the book: about {book / 1e9:g} B" if book else ""
    print(f"{part:<16} {counts[part]:>16,}{said}")

# %% [markdown]
# **Figure 8-15** is the stack these counts come from: embeddings, 96 identical decoder
# blocks (self-attention and a feed-forward layer, each behind a LayerNorm and around a
# residual connection), and the output projection back to the vocabulary. The labels below
# are computed from the same configuration:

# %%
from parlab.viz import show
from parlab.viz.plots import local_qkv_figure, transformer_figure

show(transformer_figure())

# %% [markdown]
# The book's "about 605 million" per attention layer is 4 d² = 604 M plus biases, and its
# "about 173 billion" for the blocks is 96 x 1.81 B = 174.0 B: rounding, not a different
# model. Even one block (1.8 B parameters, 3.6 GB in fp16) is a lot for one GPU once
# gradients and optimizer state join it, and the whole model is far beyond 80 GB.
#
# Splitting every layer `tp` ways divides most of that. Here are the parameter bytes one
# GPU keeps (from `parlab.memory`, Megatron's layout). Pick another model or
# precision below the figure:

# %%
from parlab.viz.widgets import shard_memory_explorer

for row in counting.parameter_memory(degrees=(1, 2, 4, 8)):
    print(f"tp={row['tp']}: {row['parameters']:>15,} parameters, {row['bytes'] / 1e9:6.1f} GB "
          f"in fp16; fits in 80 GB: {row['fits_80GB']}")
shard_memory_explorer()

# %% [markdown]
# Parameters alone still need 8 GPUs at fp16; training adds gradients, optimizer state and
# activations (chapter 01), which is why tensor parallelism is combined with pipeline and
# data parallelism (chapter 05).
#
# ### The embedding table
#
# The chapter keeps the word-embedding table on one GPU. Its size, next to one block:

# %%
table = counting.embedding_table(precision="fp16")
print(f"table: {table['vocab']:,} tokens x {table['d_model']:,} = {table['parameters']:,} "
      f"parameters = {table['bytes'] / 1e9:.2f} GB in fp16")
print(f"share of the model: {100 * table['share_of_model']:.2f} %; "
      f"one block: {table['one_block_bytes'] / 1e9:.2f} GB")
print(f"vectors looked up for one sequence of 2048 tokens: {table['vectors_bytes'] / 1e6:.1f} MB")

# %% [markdown]
# The book calls a typical embedding matrix "about 200 MB"; GPT-3's is larger (1.2 GB in
# fp16), but the argument holds: it is a third of one block and a third of a percent of
# the model, and a lookup only copies rows, which costs almost nothing. Split the table
# and every lookup becomes a collective. Section 3 measures both layouts.

# %% [markdown]
# ### Q, K and V on one GPU (Figure 8-16)
#
# Self-attention starts by multiplying each token's vector (its embedding plus its
# position, normalized) by three weight matrices: W_Q gives the token's *query*, W_K its
# *key*, W_V its *value*. Here are the real numbers for four tokens in a small model
# (`d_model` 8). The figure's Q, K and V are checked against the model's own projection
# layers when it is drawn. Everything sits on one GPU; section 5 splits these matrices.

# %%
show(local_qkv_figure())

# %% [markdown]
# ## 2. Cutting tensors: who owns which slice
#
# `parlab.tensor_parallel.shard_spec` decides who owns which slice of a tensor and returns a
# `ShardSpec` per rank that prints itself. The same specs cut the tensors, glue them back,
# and label the figures, so the picture, the code and the tests cannot disagree.
#
# A warning about names first. Megatron's *column*-parallel layer splits the columns of A
# in Y = X A. PyTorch stores `nn.Linear.weight` as Aᵀ, shape (out, in), so those columns
# are the **rows** of `weight`, one row per output feature. GPT-3's W_Q on 8 GPUs, by heads:

# %%
from parlab.tensor_parallel import describe, merge, shard_spec, split

gpus = [f"GPU{r}" for r in range(8)]
print(describe(shard_spec("W_Q", (12288, 12288), "heads", 8, n_heads=96, owners=gpus)[:3]))
print("...")
print(describe(shard_spec("E", (50257, 12288), "vocab", 8)[-2:]))

# %% [markdown]
# The vocabulary (50257 tokens) does not divide by 8, so the ranges are balanced: the first
# ranks get one more token id. Cutting and gluing back gives the original tensor:

# %%
import torch

t = torch.arange(24.0).view(4, 6)
specs = shard_spec("W", t.shape, "columns", 3)
pieces = split(t, specs)
print([tuple(p.shape) for p in pieces], "merged back equal:", torch.equal(merge(pieces, specs), t))

# %% [markdown]
# A split that cannot work is refused before any rank starts, with the value and the
# choices that would work:

# %%
for bad in (lambda: shard_spec("W_Q", (12288, 12288), "heads", 5, n_heads=96),
            lambda: shard_spec("W_out", (2, 4), "neurons", 4)):
    try:
        bad()
    except ValueError as err:
        print("ValueError:", err)

# %% [markdown]
# ## 3. The embedding table: one GPU, or split by vocabulary
#
# **The book's default** (`BroadcastEmbedding`): GPU A1 holds the whole table, looks the
# tokens up, and broadcasts the vectors to the other GPUs. In the backward pass the other
# GPUs' gradients for the vectors are summed back onto A1 (a *reduce*), which updates the
# table.
#
# **Vocabulary-parallel** (`VocabParallelEmbedding`, Megatron's name): each rank owns a
# range of token ids. It looks up the ids it owns and writes zeros for the rest; an
# all-reduce adds the ranks' answers, and since exactly one rank owns each id, the sum is
# the vector. The backward pass needs no traffic: each rank's rows get their own ids'
# gradients.
#
# Both on 3 ranks, with an 11-token vocabulary, against `nn.Embedding` on one device:

# %%
from parlab.tensor_parallel import run_embedding

embeddings = {kind: run_embedding(kind, vocab=11, world_size=3, backend="toy")
              for kind in ("broadcast", "vocab")}
for c in embeddings.values():
    print(c.summary())
    print(c.traffic_table(), "\n")

# %% [markdown]
# For the same 6 tokens, the broadcast puts 2 x the vectors on the wire (a chain: A1 to A2
# to A3) and the vocabulary split 4 x (an all-reduce is a reduce-scatter plus an
# all-gather). The broadcast's backward reduce is the price of keeping the table in one
# place; a vocabulary-parallel table is split across GPUs, which matters for memory only
# when the table is big compared with the rest of the model.

# %% [markdown]
# ## 4. The Megatron MLP, and the slides' cost per layer
#
# The slides split a linear layer Y = X A two ways:
#
# - **partition output** (`ColumnParallelLinear`): each GPU owns some columns of A, so it
#   computes some output features from the *whole* input;
# - **reduce output** (`RowParallelLinear`): each GPU owns some rows of A and the matching
#   input features, so it computes a *partial sum* of every output feature.
#
# Megatron-LM's MLP, Z = GeLU(X A) B, chains them: A column-parallel, B row-parallel. The
# slices of GeLU(X A) that a GPU computes are exactly the slices of B's input its rows of B
# need, so nothing moves between the two matrices. Each direction has one all-reduce: the
# forward pass adds the partial outputs of B; the backward pass adds the partial input
# gradients of A (the "identity / all-reduce" pair of `copy_to_region` and
# `reduce_from_region` in `parlab.tensor_parallel.mappings`).

# %%
from parlab.tensor_parallel import run_mlp

mlp = run_mlp(d_model=8, d_ff=32, batch=2, seq=4, backend="toy")
print(mlp.summary())
print(mlp.traffic_table())

# %% [markdown]
# X is 2 x 4 x 8 numbers = 256 bytes; a ring all-reduce on 2 GPUs puts 2 x 256 bytes on the
# wire, forward and backward.
#
# The slides compare three strategies for one layer with `C_in` inputs, `C_out` outputs and
# a batch of `B`: data parallelism exchanges the weight gradient (`C_in x C_out` numbers),
# partition-output the outputs (`B x C_out`), reduce-output `B x C_in`. The explorer runs
# one layer under each strategy on two toy ranks and shows, per strategy, the slide's count
# in bytes, the tensor of the collective that count describes (read from the log: the
# gradient all-reduce; the output all-gather; the all-gather of the input gradient), and
# everything the layer's forward and backward passes put on the wire.

# %%
from parlab.viz.widgets import strategy_explorer

strategy_explorer(batch=8, c_in=64, c_out=128)

# %% [markdown]
# The measured tensors equal the slide's counts. The third bar shows what the slide leaves
# out: in a training step each tensor-parallel layer also moves the *other* activation
# once (partition-output all-reduces the input gradient, `B x C_in`; reduce-output
# all-reduces its partial outputs, `B x C_out`), and the ring algorithms move a tensor
# more than once. The slide's lesson stands: data parallelism moves weights, tensor
# parallelism moves activations, and which is cheaper depends on the batch against the
# layer's width (exercise 04.4).

# %% [markdown]
# ## 5. Self-attention on two GPUs, three ways
#
# Figure 8-17 splits the query, key and value matrices between GPUs A1 and A2: A1 owns the
# first half of each matrix's output columns, A2 the second half. Here with `d_model = 8`
# and 2 heads (dashed):

# %%
from parlab.viz import show
from parlab.viz.plots import qkv_sharding_figure

show(qkv_sharding_figure(d_model=8, n_heads=2, ranks=2))

# %% [markdown]
# **The book's way** (Figure 8-18), made exact by `BookAttention`:
#
# 1. A1 looks up the embeddings X and broadcasts them to A2.
# 2. Each GPU computes its slices of Q, K and V.
# 3. Q and K are all-gathered, so each GPU has all of them; V stays local.
# 4. With the whole of Q and K a GPU can compute the attention probabilities
#    softmax(QKᵀ/√d_head) of any head; it multiplies those of the heads its V columns
#    belong to by its V slice, which gives *its columns* of the context vectors.
# 5. The book stops here. To finish the layer, the output projection W_O is split by rows
#    to match those context columns (a row-parallel layer): each GPU multiplies its context
#    columns by its rows of W_O, and an all-reduce adds the two partial outputs.
#
# Backward, as the chapter describes: Q and K are all-gathered again (only each GPU's own
# slices were kept, which saves memory), each GPU computes its *contribution* to the
# gradients of the whole Q and K (through its own V columns only), and an all-reduce sums
# the contributions before each GPU keeps its slice. A final reduce sums the two GPUs'
# gradients for X onto A1, where the embedding table lives.
#
# **Megatron-LM's way** (`MegatronAttention`) splits by whole heads. A head's scores need
# only that head's columns of Q and K, so a GPU that owns whole heads already has all it
# needs: nothing moves before attention, one all-reduce follows W_O, and one all-reduce
# sums X's gradient in the backward pass. (Megatron fuses W_Q, W_K, W_V into one
# column-parallel matrix, ordered so that each GPU's rows are its heads' Q, K and V.)
#
# **PyTorch's API** (`torch.distributed.tensor.parallel`) does the same as Megatron with
# `ColwiseParallel` on the three projections and `RowwiseParallel` on W_O, applied to an
# ordinary module by `parallelize_module`.
#
# All three on the same weights, batch 2, 4 tokens, `d_model = 8`, 2 heads, causal mask:

# %%
from parlab.tensor_parallel import collective_wire_bytes, run_attention

attention = {"book": run_attention("book", backend="toy"),
             "megatron": run_attention("megatron", backend="toy"),
             "pytorch": run_attention("pytorch", backend="toy")}
for c in attention.values():
    print(c.summary())

# %% [markdown]
# Outputs and gradients (every weight and bias, and the input) equal the single-GPU layer
# in all three. What each one moved, from the toy backend's log (PyTorch's DTensor runs
# its collectives on the toy backend like any other code):

# %%
for name in attention:
    print(f"--- {name}\n{attention[name].traffic_table()}")

# %% [markdown]
# PyTorch's API issues its collectives through its own functional layer;
# `FunctionalCollectives` reads them from PyTorch's dispatcher, which tells what each call
# was handed, and the ring formula turns that into bytes on the wire, the same as logged:

# %%
pytorch_calls = attention["pytorch"].info["collectives"]
print(pytorch_calls)
print("on the wire (ring, 2 GPUs):", collective_wire_bytes(pytorch_calls, 2))
print("logged by the toy backend:  ", attention["pytorch"].total_bytes())

# %% [markdown]
# The same as Megatron: one all-reduce of X's size each way. (That takes one detail:
# declaring the attention module's input replicated with `PrepareModuleInput`, so the three
# projections' input gradients are added up before a single all-reduce. Without it, each
# `ColwiseParallel` all-reduces its own, three all-reduces in the backward pass.)
#
# The book's forward and backward passes, step by step, with the bytes of each collective
# as the toy backend logged them:

# %%
from parlab.viz.plots import attention_bytes_figure, book_attention_figure

show(book_attention_figure(attention["book"]))

# %%
measured = {name: c.total_bytes() for name, c in attention.items()}
ratio = sum(measured["book"].values()) / sum(measured["megatron"].values())
print(f"the book's way moved {ratio:.3g} x the bytes of Megatron's")
show(attention_bytes_figure(measured, "one attention layer, 2 GPUs: bytes measured"))

# %% [markdown]
# **Why frameworks use Megatron's split.** Look at step 4 of the book's way on A1: its V
# columns are head 0's, so it needs head 0's probabilities, which need head 0's columns of
# Q and K, which A1 computed itself. The half of Q and K that the all-gather brought in is
# never used, and in the backward pass the "contributions" A1 adds to A2's slices of dQ and
# dK are zeros. Splitting by heads makes that visible and drops the gathers. With heads
# aligned to GPUs, the book's way moves the same output all-reduce as Megatron's, plus the
# broadcast, two all-gathers forward, two more backward, two all-reduces of Q and K's size,
# and the final reduce (the ratio printed above), and every extra collective is one more
# point where both GPUs wait for each other.
#
# What the book's way can do that Megatron's cannot: split *inside* a head. With a single
# head, Megatron's split is refused, and the book's way still gives the right layer,
# because the gathered Q and K contain the whole head:

# %%
one_head = run_attention("book", n_heads=1, backend="toy")
print(one_head.summary())
try:
    run_attention("megatron", n_heads=1)
except ValueError as err:
    print("ValueError:", err)

# %% [markdown]
# The chapter sums the Q and K gradient contributions with an all-reduce. Each GPU keeps
# only its own slice of the sum, so a reduce-scatter does the same job with half the bytes:

# %%
scattered = run_attention("book", backend="toy", grad_sync="reduce_scatter")
print(scattered.summary())
print("backward bytes, all-reduce:", attention["book"].total_bytes()["backward"],
      " reduce-scatter:", scattered.total_bytes()["backward"])

# %% [markdown]
# These byte counts follow formulas (`counting.attention_bytes`; the tests check them
# against the toy log), so they can be scaled to GPT-3: one attention layer, 2048 tokens,
# `d_model = 12288`, 8 GPUs, fp16. Change the sizes below the figure:

# %%
from parlab.viz.widgets import attention_explorer

attention_explorer()

# %% [markdown]
# ## 6. Figure 8-19: the feed-forward layer on six GPUs
#
# The figure's network has two hidden layers (6 and 4 neurons) and an output layer (2
# neurons). Each layer is a pipeline stage in its own server, and inside the server its
# neurons are split between the two GPUs, which talk over NVLink. The A GPUs of all three
# servers hang off rail switch 1, the B GPUs off rail switch 2. Ranks are numbered server
# by server, which gives exactly the figure's names:

# %%
from parlab.tensor_parallel import layout

for place in layout((4, 6, 4, 2), tensor=2):
    print(place)

# %% [markdown]
# Forward, per micro-batch (the book's context vectors C1, C2): each GPU computes its
# neurons from the stage's whole input, the two halves are all-gathered inside the server,
# and each GPU sends the assembled output to the next stage's GPU on its own rail (A1 to
# A2, B1 to B2), so no packet crosses the spine. Backward: the output error flows back;
# each GPU's neurons' errors give its weight gradients locally, and the error for the
# previous stage's outputs is a sum over *all* of this stage's neurons, half of which live
# on the partner GPU. So the partners all-reduce that sum over NVLink, then send it back
# along the rails. That all-reduce is the synchronization this network needs. The weight
# gradients need none: each weight lives on exactly one GPU. (With data-parallel copies of
# the pipeline, chapter 03, their gradients would be summed too.)
#
# Batch of 4 context vectors in 2 micro-batches, compared with the same network
# (`parlab.models.BookMLP`) on one device:

# %%
from parlab.tensor_parallel import run_ffn
from parlab.comm import figure_8_19

ffn = run_ffn(sizes=(4, 6, 4, 2), tensor=2, batch=4, micro_batches=2, backend="toy")
print(ffn.summary())
cluster = figure_8_19(nic_gbps=400)
print(cluster)
for phase, log in ffn.traffic.items():
    links = log.per_link_type(cluster)
    print(f"{phase:<8} bytes: NVLink {links['nvlink']:>4}, rail {links['rail']:>4}, "
          f"spine {links['spine']}")

# %% [markdown]
# Every collective stayed inside a server and every send stayed on one rail. The figure
# draws each link with its bytes:

# %%
from parlab.viz.plots import ffn_figure

show(ffn_figure(ffn))

# %% [markdown]
# How long would these transfers take on real links? `TrafficLog.time` applies the
# alpha-beta model of `parlab.comm` (NVLink at 450 GB/s, NICs at 100 or 400 Gb/s, plus a
# latency per message; the messages of one step of a collective run at the same time,
# steps one after another). Each type of link is timed on its own here:

# %%
from parlab.comm import TrafficLog

for gbps in (100, 400):
    c = figure_8_19(nic_gbps=gbps)
    for phase, log in ffn.traffic.items():
        per = {kind: TrafficLog(t for t in log.records if c.link_type(t.src, t.dst) == kind)
               for kind in ("nvlink", "rail")}
        times = {kind: part.time(c) * 1e6 for kind, part in per.items()}
        print(f"NICs {gbps} Gb/s, {phase:<8}: NVLink transfers {times['nvlink']:5.1f} us, "
              f"rail transfers {times['rail']:5.1f} us")
    ratio = c.links["nvlink"].bandwidth / c.links["rail"].bandwidth
    print(f"NVLink bandwidth / NIC bandwidth: {ratio:g}")

# %% [markdown]
# Messages of a few dozen bytes cost their latency and nothing else, so the NIC speed
# changes nothing: what counts is how many messages follow one another. The NVLink side
# has more of them (every micro-batch's all-gather and, backward, the two steps of each
# all-reduce) at a lower latency than a hop through a rail switch. With GPT-3's widths the
# bytes take over, and then NVLink's bandwidth (the ratio printed above) is why the chapter
# keeps the chatty tensor-parallel traffic inside the server.
#
# A layout that does not fit the layers is refused with the reason, before any rank
# starts:

# %%
for tensor in (4, 6):
    try:
        run_ffn(sizes=(4, 6, 4, 2), tensor=tensor)
    except ValueError as err:
        print(f"tensor={tensor}: {err}")

# %% [markdown]
# ## 7. Exercises
#
# Replace each `...` with your answer and run the cell. The checker says whether you are
# right and why, without giving the answer away.
#
# **Exercise 04.1.** GPT-3 175B with tensor-parallel degree 8: how many parameters of one
# attention layer's four weight matrices (W_Q, W_K, W_V, W_O; no biases) does one GPU hold?

# %%
from parlab.exercises import check

answer_04_1 = ...
check("04.1", answer_04_1)

# %% [markdown]
# **Exercise 04.2.** The book's attention forward pass on 2 ranks uses `broadcast`,
# `all_gather` and `all_reduce`. Which of them does Megatron's split not need? Answer a
# set of names, such as `{"all_reduce"}`.

# %%
answer_04_2 = ...
check("04.2", answer_04_2)

# %% [markdown]
# **Exercise 04.3.** Figure 8-19 with 4 inputs and layers of 6, 4 and 2 neurons, a batch
# of 4 context vectors in fp32: how many bytes cross the rail switches in the forward pass?
# (Work it out, then compare with section 6.)

# %%
answer_04_3 = ...
check("04.3", answer_04_3)

# %% [markdown]
# **Exercise 04.4.** A layer with `C_in = 1024` and `C_out = 4096`: what is the largest
# batch B for which partition-output (`B x C_out` numbers) moves no more than data
# parallelism (`C_in x C_out`)?

# %%
answer_04_4 = ...
check("04.4", answer_04_4)

# %% [markdown]
# ## What's next
#
# Chapter 05 combines the strategies: data x tensor x pipeline parallelism on a
# rail-optimized cluster, tensor parallelism inside a server (where NVLink is), pipeline and
# data parallelism across the rails, and a planner that picks the split for a model.
