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
# Pipeline parallelism (chapter 03) gives each GPU whole layers. Each layer is then computed
# by one GPU alone, and a big model needs a long pipeline. Tensor parallelism cuts the
# matrices *inside* a layer, so several GPUs compute one layer together, and exchange
# pieces of their results as they go. (The chapter's reason, that a single layer often
# does not fit on one GPU, does not hold for GPT-3; section 1 checks it and gives the
# reasons that do.)
#
# In this notebook you will:
#
# 1. count GPT-3's parameters per layer and see how much memory each GPU keeps as the
#    layers are split more and more ways (the numbers behind Figure 8-15's discussion);
# 2. cut tensors by rows, columns, heads and token ranges, and print who owns what;
# 3. run the two ways of holding the word-embedding table: on one GPU with a broadcast (the
#    book's default) and split by vocabulary;
# 4. run the Megatron MLP, ours and with PyTorch's `ColwiseParallel`/`RowwiseParallel`, and
#    measure the slide deck's per-layer communication costs;
# 5. run self-attention across two GPUs three ways: as the book describes it (Figures 8-17
#    and 8-18), as Megatron-LM does it, and with PyTorch's own API; check each against the
#    single-GPU layer and count the bytes each one moves;
# 6. run the feed-forward layer of Figure 8-19 on six ranks, tensor parallel inside each
#    server and pipelined across, with every transfer labelled NVLink (the book's
#    High-speed Domain) or rail switch, and the two ways a message can change rails;
# 7. solve five exercises on the way: three ask you to predict a number before a cell
#    prints it, one to count, one to find a break-even by computing or running it yourself.
#
# Every parallel run is compared, output and gradients, with the same layer on one device.
# Byte counts come from the **toy backend**, which runs each collective as logged
# point-to-point messages (the ring algorithms, unless said otherwise).

# %% [markdown]
# ## 1. How big is one layer? Counting GPT-3
#
# A self-attention layer holds four `d x d` matrices (W_Q, W_K, W_V and the output
# projection W_O) plus their biases; a feed-forward layer holds two `d x d_ff` matrices.
# `parlab.models` computes the counts from GPT-3's configuration (and builds a real model
# whose parameters add up to the same total). Where the book's figures differ from them in
# the last digit (its 605 M and 173 B), that is rounding; chapter 01 remarks on it.

# %%
from parlab.experiments import BOOK_SAYS, gpt3_counts
from parlab.launch import preload
from parlab.models import get_config
from parlab.tensor_parallel import counting

_ = preload("torch.distributed.tensor.parallel", "parlab.tensor_parallel.debug")  # once, not per rank
gpt3 = get_config("GPT-3 175B")
print(f"GPT-3: d_model {gpt3.d_model}, {gpt3.n_layers} blocks, {gpt3.n_heads} heads, "
      f"d_ff {gpt3.d_ff} = {gpt3.d_ff // gpt3.d_model} x d_model, vocabulary {gpt3.vocab}\n")
counts = gpt3_counts()
for part in ("attention", "feed_forward", "block", "blocks", "token_embedding", "total"):
    book = BOOK_SAYS.get(part)
    said = f"   the book: about {book / 1e9:g} B" if book else ""
    print(f"{part:<16} {counts[part]:>16,}{said}")

# %% [markdown]
# **Exercise 04.1 (count).** Split every layer 8 ways (tensor-parallel degree 8). How many
# parameters of one attention layer's four weight matrices (W_Q, W_K, W_V, W_O; leave out
# the biases) does one GPU hold? Replace the `...` and run the cell; the checker says whether
# you are right, and why, without giving the number away.

# %%
from parlab.exercises import check

answer_04_1 = ...
check("04.1", answer_04_1)

# %% [markdown]
# **Figure 8-15** is the stack these counts come from: embeddings, the identical decoder
# blocks (self-attention and a feed-forward layer, each behind a LayerNorm and around a
# residual connection), and the output projection back to the vocabulary. The labels below
# are computed from the same configuration:

# %%
from parlab.models import count_parameters
from parlab.viz import show
from parlab.viz.plots import local_qkv_figure, transformer_figure

show(transformer_figure(gpt3, count_parameters(gpt3)))

# %% [markdown]
# ### Does one layer exceed a GPU? Not in GPT-3
#
# The chapter motivates tensor parallelism by saying that a single layer alone often
# exceeds one GPU's memory. For GPT-3 that is false. Its largest layer, the feed-forward
# layer, fits on an <span data-glue="gpu_gb">80</span> GB GPU with room to spare, even with
# everything Adam keeps for it in mixed precision (parameters, gradients, fp32 master
# weights and two moments, from `parlab.memory.model_state_bytes`), and so does a whole
# block:

# %%
from parlab.experiments import layer_memory
from parlab.units import GB

lm = layer_memory(tp=8, microbatches=8)
print(f"feed-forward layer: {lm['ffn_parameters']:,} parameters, "
      f"{lm['ffn_state_bytes'] / 1e9:.1f} GB with Adam; fits in {lm['gpu_bytes'] / 1e9:g} GB: "
      f"{lm['ffn_fits']}")
print(f"attention layer: {lm['attention_state_bytes'] / 1e9:.1f} GB; "
      f"one block: {lm['block_state_bytes'] / 1e9:.1f} GB\n")
for tp in (1, lm["tp"]):
    row = lm[f"tp{tp}"]
    print(f"tp={tp}: per GPU, one block's activations for one sequence of {lm['context']} "
          f"tokens {row['block_activation_bytes'] / 1e9:.2f} GB, its forward matmuls "
          f"{row['block_forward_flops'] / 1e12:.2f} TFLOP")
    print(f"      blocks whose model states fit on one GPU: {row['blocks_per_gpu']}, so at "
          f"least {row['stages']} pipeline stages; GPipe's bubble with "
          f"{lm['microbatches']} micro-batches: {row['bubble']:.3f}")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
from parlab.viz import glue

glue("gpu_gb", lm["gpu_bytes"] / GB, "g")
glue("tp_gpt3", lm["tp"])

# %% [markdown]
# The reasons for tensor parallelism are the other lines:
#
# - **Activations.** One sequence leaves the bytes printed above on every block, and a
#   pipeline stage keeps several micro-batches' worth until their backward passes
#   (chapter 03). Tensor parallelism splits most of them.
# - **Compute per layer.** Only tensor parallelism makes one layer faster: each GPU does its
#   share of every matrix multiplication. When each token must pass through every layer
#   in turn (inference, one token at a time), that is the only way to cut the latency.
# - **Fewer pipeline stages.** With pipeline parallelism alone, the model states need a
#   long pipeline, whose bubble eats most of the time. Splitting every layer lets each
#   GPU hold many more blocks, so the same model needs far fewer stages.
#
# Splitting every layer `tp` ways divides most of the model. Here are the parameter bytes one
# GPU keeps (from `parlab.memory`, Megatron's layout). Pick another model or
# precision below the figure:

# %%
from parlab.viz.widgets import shard_memory_explorer

rows = counting.parameter_memory(degrees=(1, 2, 4, 8))
for row in rows:
    print(f"tp={row['tp']}: {row['parameters']:>15,} parameters, {row['bytes'] / 1e9:6.1f} GB "
          f"in fp16; fits in 80 GB: {row['fits_80GB']}")
print("smallest degree whose parameters fit:", min(r["tp"] for r in rows if r["fits_80GB"]))
shard_memory_explorer()

# %% [markdown]
# That is for the parameters alone; training adds gradients, optimizer state and
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
      f"one block: {table['one_block_bytes'] / 1e9:.2f} GB; "
      f"table / block: {table['bytes'] / table['one_block_bytes']:.2f}")
print(f"vectors looked up for one sequence of {gpt3.context} tokens: "
      f"{table['vectors_bytes'] / 1e6:.1f} MB")

# %% [markdown]
# The book calls a typical embedding matrix "about 200 MB"; GPT-3's is larger (printed
# above), but the memory argument holds: the table is a fraction of one block and a
# fraction of a percent of the model, and a lookup only copies rows. The book gives a
# second reason, that splitting the table would bring high communication costs. Section 3
# measures both layouts, counted like for like, and finds the direction right; it also gives
# the reasons Megatron-LM splits the table all the same.

# %% [markdown]
# ### Q, K and V on one GPU (Figure 8-16)
#
# Self-attention starts by multiplying each token's vector (its embedding plus its
# position, normalized) by three weight matrices: W_Q gives the token's *query*, W_K its
# *key*, W_V its *value*. Here are the real numbers for
# <span data-glue="qkv_tokens">4</span> tokens in a small model (`d_model`
# <span data-glue="qkv_d_model">8</span>). The figure's Q, K and V are checked against the
# model's own projection layers when it is drawn. Everything sits on one GPU; section 5
# splits these matrices.

# %%
from parlab.experiments import qkv_example

show(local_qkv_figure(qkv_example()))
n_tokens, width = qkv_example()["X"].shape

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("qkv_tokens", n_tokens)
glue("qkv_d_model", width)

# %% [markdown]
# **The book's names, and this notebook's.** Figures 8-16 to 8-19 and the text around them
# name their matrices with letters: the embeddings are Eepv in Figure 8-16 and Eevp in
# Figure 8-17 (one matrix, spelled two ways), the output of the first hidden layer of
# Figure 8-19 is ynA1+B1. This map takes each name to the one used here (the weights as the
# book draws them, inputs x outputs; `nn.Linear` stores their transposes) and gives its
# size in Figure 8-16's example above (section 5's runs take two such sequences) and in
# section 6's feed-forward run.

# %%
from parlab.experiments import book_names_table

print(book_names_table())

# %% [markdown]
# ## 2. Cutting tensors: who owns which slice
#
# `parlab.tensor_parallel.shard_spec` decides who owns which slice of a tensor and returns a
# `ShardSpec` per rank that prints itself. The same specs cut the tensors, glue them back,
# and label the figures, so the picture and the code cannot disagree.
#
# A warning about names first. Megatron's *column*-parallel layer splits the columns of A
# in Y = X A. PyTorch stores `nn.Linear.weight` as Aᵀ, shape (out, in), so those columns
# are the **rows** of `weight`, one row per output feature. GPT-3's W_Q on
# <span data-glue="tp_gpt3">8</span> GPUs, by heads:

# %%
from parlab.tensor_parallel import describe, merge, shard_spec, split

tp = lm["tp"]
gpus = [f"GPU{r}" for r in range(tp)]
print(describe(shard_spec("W_Q", (gpt3.d_model, gpt3.d_model), "heads", tp, n_heads=gpt3.n_heads,
                          owners=gpus)[:3]))
print("...")
print(describe(shard_spec("E", (gpt3.vocab, gpt3.d_model), "vocab", tp)[-2:]))

# %% [markdown]
# The vocabulary does not divide by <span data-glue="tp_gpt3">8</span>, so the ranges are
# balanced: the first ranks get one more token id than the last ones. Cutting and gluing
# back gives the original tensor:

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
# the vector. Its own backward pass moves nothing: each rank takes its ids' rows out of the
# full gradient of the vectors.
#
# That full gradient has to come from somewhere. The layer after the embedding is tensor
# parallel (the Q, K, V projections of section 5), and each GPU's slice of it hands back a
# different, partial gradient of the vectors. Someone has to add them up. In the book's
# layout the reduce onto A1 does it; with the vocabulary split it is the all-reduce of the
# layer's input operator, Megatron's `f` (`copy_to_region`, section 4). So both runs below
# start from the same per-rank gradients: rank r's loss uses its own weights, as its slice
# of the projections would, and the vocabulary run passes its vectors through `f`.
#
# Both on <span data-glue="emb_ranks">3</span> ranks, with a vocabulary of
# <span data-glue="emb_vocab">11</span> tokens, against `nn.Embedding` on one device (the
# reference adds up every rank's loss):

# %%
from parlab.experiments import run_embedding

vocab, ranks = 11, 3
embeddings = {kind: run_embedding(kind, vocab=vocab, world_size=ranks, backend="toy")
              for kind in ("broadcast", "vocab")}
for c in embeddings.values():
    print(c.summary())
    print(c.traffic_table(), "\n")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("emb_vocab", vocab)
glue("emb_ranks", ranks)

# %% [markdown]
# **The book says that splitting the table brings high communication costs.** Split each
# run's log into its two collectives: the forward one belongs to the embedding (the
# broadcast, or the all-reduce that assembles the vectors, Megatron's `g`); the backward one
# is the sum of the per-rank gradients (`f`). Count them in units of the looked-up vectors
# (the output of the lookup), set the ring closed forms beside the log, then use the closed
# forms at GPT-3's size: one sequence's vectors on <span data-glue="tp_gpt3">8</span> GPUs.

# %%
from parlab.comm import ring_wire_bytes
from parlab.experiments import embedding_wire_bytes

vectors = embeddings["broadcast"].reference["output"].nbytes
small = embedding_wire_bytes(vectors, ranks)
print(f"looked-up vectors: {vectors} B; {ranks} ranks")
print(f"{'layout':<9} {'embedding (fwd)':>22} {'f (bwd)':>18} {'total':>7} {'x vectors':>9}"
      f"  closed form = log")
for kind, c in embeddings.items():
    log = c.bytes_by_op()
    fwd, bwd = (sum(log[phase].values()) for phase in ("forward", "backward"))
    op_fwd, op_bwd = small[kind]["ops"]
    print(f"{kind:<9} {op_fwd:>12} {fwd:>7g} B {op_bwd:>10} {bwd:>5g} B {fwd + bwd:>5g} B "
          f"{(fwd + bwd) / vectors:>9.3g}  "
          f"{(small[kind]['embedding'], small[kind]['f']) == (fwd, bwd)}")

at_scale = embedding_wire_bytes(table["vectors_bytes"], lm["tp"])
blocks = gpt3.n_layers * 4 * ring_wire_bytes("all_reduce", table["vectors_bytes"], lm["tp"])
print(f"\nGPT-3, one sequence ({table['vectors_bytes'] / 1e6:.1f} MB of vectors), "
      f"{lm['tp']} GPUs:")
for kind, w in at_scale.items():
    print(f"{kind:<9} embedding {w['embedding'] / 1e6:5.0f} MB + f {w['f'] / 1e6:5.0f} MB "
          f"= {w['total'] / 1e9:.2f} GB")
extra = at_scale["vocab"]["total"] - at_scale["broadcast"]["total"]
print(f"the {gpt3.n_layers} blocks' own all-reduces (4 per block): {blocks / 1e9:.1f} GB; "
      f"the vocabulary split adds {100 * extra / blocks:.2f} % to them")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("emb_book_gb", at_scale["broadcast"]["total"] / 1e9, ".2f")
glue("emb_vocab_gb", at_scale["vocab"]["total"] / 1e9, ".2f")
glue("emb_ratio", at_scale["vocab"]["total"] / at_scale["broadcast"]["total"], ".2f")
glue("emb_book_mb", at_scale["broadcast"]["embedding"] / 1e6, ".0f")
glue("emb_vocab_mb", at_scale["vocab"]["embedding"] / 1e6, ".0f")
glue("emb_share", 100 * extra / blocks, ".2f")

# %% [markdown]
# Counted like for like, **the book's direction is right**: the vocabulary split moves
# more, <span data-glue="emb_vocab_gb">1.41</span> GB against
# <span data-glue="emb_book_gb">0.75</span> GB per sequence at GPT-3's size
# (<span data-glue="emb_ratio">1.88</span> times as much), and the toy log agrees with the
# closed forms. The accounting, collective by collective:
#
# - forward, the embedding's own collective: a broadcast from A1 (each hop carries the
#   vectors once) against an all-reduce (a reduce-scatter and an all-gather, twice the
#   bytes);
# - backward, the sum of the ranks' partial gradients (`f`): a reduce onto A1, since only
#   the table there needs the sum, against an all-reduce, since every rank's rows need it.
#
# Megatron counts `f` in the layer that uses the vectors, not in the embedding. Counted that
# way, the embedding alone is a broadcast against an all-reduce,
# <span data-glue="emb_book_mb">352</span> MB against
# <span data-glue="emb_vocab_mb">705</span> MB: the same direction. What holds either way:
# both grow with the looked-up vectors (batch x tokens x `d_model`), not with the table, and
# the difference is small beside what the blocks move: the extra bytes of the vocabulary
# split are <span data-glue="emb_share">0.24</span> % of the blocks' own all-reduces. So the
# book's "high" overstates it, and the cost is not why the question matters.
#
# ### Why Megatron-LM splits the table anyway
#
# Megatron-LM splits the table for two other reasons. The first is memory: with its
# optimizer state, the whole table sits on A1 alone, a load no other GPU carries. The
# second is the output layer, which shares the table (GPT-style models tie the two: the
# logits are the final hidden state times the table's transpose). Its matrix multiply is as
# large as the table, and it needs the logits of every token over the whole vocabulary for
# the softmax. Split by vocabulary like the table, each GPU computes the logits of its own
# token ids, and the loss needs only three numbers per token from the other GPUs: the
# largest logit (to keep the exponentials in range), the target token's logit (from the GPU
# that owns it, zero elsewhere), and the sum of the exponentials. Megatron's parallel
# cross-entropy all-reduces just those, instead of gathering the logits. For GPT-3 on
# <span data-glue="tp_gpt3">8</span> GPUs, one sequence, with mixed-precision Adam:

# %%
from parlab.experiments import split_table_reasons

why = split_table_reasons(gpt3, tp=lm["tp"])
print(f"table with its optimizer state: {why['table_state_bytes'] / 1e9:.2f} GB on A1, or "
      f"{why['table_state_bytes_split'] / 1e9:.2f} GB per GPU split; one GPU's share of a "
      f"block: {why['block_state_bytes_per_gpu'] / 1e9:.2f} GB")
print(f"output layer's matrix multiply (forward): {why['head_forward_flops'] / 1e12:.2f} "
      f"TFLOP on one GPU, or {why['head_forward_flops'] / why['tp'] / 1e12:.2f} TFLOP per GPU "
      f"split; one GPU's share of a block: {why['block_forward_flops_per_gpu'] / 1e12:.2f} "
      f"TFLOP")
print(f"the loss: all-gather the fp32 logits ({why['logits_bytes'] / 1e6:.0f} MB): "
      f"{why['gather_logits_wire_bytes'] / 1e9:.2f} GB on the wire; parallel cross-entropy "
      f"(3 values per token): {why['parallel_loss_wire_bytes'] / 1e3:.0f} kB")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("why_table_blocks", why["table_state_bytes"] / why["block_state_bytes_per_gpu"], ".1f")
glue("why_head_blocks", why["head_forward_flops"] / why["block_forward_flops_per_gpu"],
     ".1f")

# %% [markdown]
# Kept whole, the table and its optimizer state weigh as much on A1 as
# <span data-glue="why_table_blocks">2.7</span> blocks' shares do on a GPU, and the tied
# output layer's multiply is <span data-glue="why_head_blocks">2.7</span> times one GPU's
# share of a block, done by one GPU while the others wait. Split by vocabulary, both shrink
# with the number of GPUs, and the parallel loss moves kilobytes. Those are the reasons to
# split the table: memory and the output layer, not the input lookup's traffic, which
# the split makes somewhat larger.

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
#
# **Exercise 04.2 (predict first).** The next cell runs this MLP with `d_model = 8` and
# `d_ff = 32` on 2 GPUs, for a batch of 2 sequences of 4 tokens in fp32, and prints what
# the toy backend logged. Before you run it: how many bytes does the forward pass put on the
# wire, both GPUs together?

# %%
answer_04_2 = ...
check("04.2", answer_04_2)

# %%
from parlab.experiments import run_mlp

mlp = run_mlp(d_model=8, d_ff=32, batch=2, seq=4, backend="toy")
print(mlp.summary())
print(mlp.traffic_table())

# %% [markdown]
# Each all-reduce carries a tensor of X's size. In the forward pass it sums B's partial
# outputs; in the backward pass, the partial gradients of X (an activation gradient, not a
# weight gradient: each GPU's weight gradients are its own). A ring all-reduce over n GPUs
# puts `2(n−1)` times the tensor's bytes on the wire, all GPUs together; on
# <span data-glue="mlp_ranks">2</span> GPUs, twice the tensor:

# %%
from parlab.comm import ring_wire_bytes

x_grad, ranks = mlp.reference["x.grad"], mlp.info["world_size"]
on_wire = ring_wire_bytes("all_reduce", x_grad.nbytes, ranks)
print(f"X: {tuple(x_grad.shape)} floats = {x_grad.nbytes} B; ring all-reduce on {ranks} GPUs: "
      f"{on_wire:g} B on the wire")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("mlp_ranks", ranks)

# %% [markdown]
# ### The same MLP with PyTorch's API
#
# PyTorch ships this split as a *plan* rather than as layers. `parallelize_module` takes an
# ordinary module, a DeviceMesh (the ranks, as a grid) and a dict from layer names to
# styles: `ColwiseParallel` for fc1 (Megatron's column-parallel A), `RowwiseParallel` for
# fc2 (the row-parallel B). It replaces each named layer's weight and bias by DTensors, each
# a local shard plus how it is placed on the mesh, and inserts the collectives where a
# layer's input or output changes placement. `parlab.tensor_parallel.dtensor_mlp` applies
#
# ```python
# parallelize_module(mlp, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
# ```
#
# to a copy of the same `parlab.models.MLP` (an `nn.Sequential` works too: name its layers
# `"0"` and `"2"`). Same weights, input and loss, on two toy ranks. Its gradients are read
# from the DTensor shards and glued back together before they are compared, and each rank's
# shards are the slices ours cut (dimension and range, on A1):

# %%
from parlab.experiments import calls_table, collective_calls

mlp_pytorch = run_mlp(d_model=8, d_ff=32, batch=2, seq=4, backend="toy", variant="pytorch")
print(mlp_pytorch.summary())
for name in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"):
    cuts = [run.info["specs"][0][name] for run in (mlp, mlp_pytorch)]
    said = ["whole" if c is None else f"dim {c.dim}, {c.start}:{c.stop} of {c.shape[c.dim]}"
            for c in cuts]
    print(f"{name:<11} ours: {said[0]:<18} PyTorch's: {said[1]}")

# %% [markdown]
# Which collectives each one issued, read back from the toy backend's log (the size of the
# tensor each carried, and its bytes on the wire), and what PyTorch's own `CommDebugMode`
# saw in the DTensor version (through `CommBytes`, as for attention in section 5):

# %%
for label, run in (("ours", mlp), ("PyTorch's", mlp_pytorch)):
    for phase in ("forward", "backward"):
        print(f"--- {label}, {phase}\n{calls_table(collective_calls(run.traffic[phase]))}")
same = all([(k.op, k.payload, k.wire_bytes) for k in collective_calls(mlp.traffic[phase])] ==
           [(k.op, k.payload, k.wire_bytes) for k in collective_calls(mlp_pytorch.traffic[phase])]
           for phase in ("forward", "backward"))
print("\nthe same collectives with the same bytes, pass by pass:", same)
print("CommDebugMode's record of PyTorch's (collective, tensor bytes):",
      mlp_pytorch.info["collectives"])
print(mlp_pytorch.info["comm_table"])

# %% [markdown]
# One all-reduce of X's size each way, in both. CommDebugMode files them under the layers
# that issue them: the forward one under fc2, where `RowwiseParallel` sums the partial
# outputs (Megatron's `g`); the backward one under fc1, where `ColwiseParallel` sums the
# partial gradients of its replicated input (Megatron's `f`). Unlike attention, the MLP
# needs no `PrepareModuleInput`: it has one column-parallel layer, so there is one input
# gradient to sum, not three. Ours and PyTorch's are the same algorithm; PyTorch's derives
# the collectives from the placements instead of having them written out.

# %% [markdown]
# The slides compare three strategies for one layer with `C_in` inputs, `C_out` outputs and
# a batch of `B`: data parallelism exchanges the weight gradient (`C_in x C_out` numbers),
# partition-output the outputs (`B x C_out`), reduce-output `B x C_in`. The explorer runs
# one layer under each strategy on two toy ranks and shows, per strategy, the slide's count
# in bytes, the tensor of the collective that count describes (read from the log: the
# gradient all-reduce; the output all-gather; the all-gather of the input gradient), and
# everything the layer's forward and backward passes put on the wire.

# %%
from parlab.experiments import strategy_explorer

strategy_explorer(batch=8, c_in=64, c_out=128)

# %% [markdown]
# The measured tensors equal the slide's counts. The third bar shows what the slide leaves
# out: in a training step each tensor-parallel layer also moves the *other* activation
# once (partition-output all-reduces the input gradient, `B x C_in`; reduce-output
# all-reduces its partial outputs, `B x C_out`), and the ring algorithms move a tensor
# more than once. The slide's lesson stands: data parallelism moves weights, tensor
# parallelism moves activations, and which is cheaper depends on the batch against the
# layer's width (exercise 04.5 counts where the line falls).

# %% [markdown]
# ## 5. Self-attention on two GPUs, three ways
#
# Figure 8-17 splits the query, key and value matrices between GPUs A1 and A2: A1 owns the
# first half of each matrix's output columns, A2 the second half. Here with `d_model = 8`
# and `n_heads = 2` (the heads dashed), the sizes this section uses throughout:

# %%
from parlab.experiments import qkv_shards
from parlab.viz.plots import qkv_sharding_figure

size = dict(d_model=8, n_heads=2, batch=2, seq=4)  # the small layer of this section
show(qkv_sharding_figure(qkv_shards(size["d_model"], ranks=2), n_heads=size["n_heads"]))

# %% [markdown]
# One slip and one ambiguity in the book around this figure. Its caption speaks of
# "Shared" Q, K and V matrices; *sharded* is meant, since each GPU holds a different part
# and nothing is shared. And its text says that the embeddings Eevp (X here) are "also
# distributed between GPU A1 and GPU A2". That word has two readings:
#
# 1. **split**, each GPU holding a share of X's features, as the weights are split (the
#    text's "corresponding fragment of Eevp" points this way);
# 2. **copied**, each GPU holding all of X, which is what Figure 8-18 does when it
#    broadcasts X from A1 to A2.
#
# With W_Q split by output features (columns), every one of A1's output features is a sum
# over *all* of X's features. A1's slice of Q under each reading, against the true slice:

# %%
from parlab.experiments import column_split_input

errors = column_split_input(d_model=size["d_model"], tokens=size["seq"], parts=2)
print(f"reading 1, A1 holds its share of X's features: off by up to {errors['input_share']:.2f}")
print(f"reading 2, A1 holds a copy of all of X: equal to the true slice (difference below "
      f"1e-6): {errors['whole_input'] < 1e-6}")

# %% [markdown]
# Read as a split, the sentence is wrong: A1 would compute a partial sum, not its slice.
# Read as a copy, it is right and says what Figure 8-18 draws: the book's run below
# broadcasts X to both GPUs, multiplies each copy by that GPU's shards, and equals the
# single-GPU layer. So the text and Figure 8-18 agree under the second reading, and only
# the words "corresponding fragment" make the first one tempting.

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
# The book says the softmax *produces* the context vector. It produces the attention
# weights: per head, one row per token, each row summing to 1. The context vectors are
# those weights times V, softmax(QKᵀ/√d_head) V, which is what step 4 computes. The shapes,
# for one sequence of the section's size (`seq = 4`, `d_model = 8`, `n_heads = 2`):

# %%
from parlab.experiments import softmax_and_context

print(softmax_and_context(d_model=size["d_model"], n_heads=size["n_heads"], seq=size["seq"]))

# %% [markdown]
# **Backward, and a slip in the chapter.** The chapter all-reduces the gradients of the
# sharded weight matrices (of the feed-forward layer, and of Q, K and V "before updating
# the weights"). For a sharded weight that is wrong. Only A1 holds its shard of W_Q, and
# only A1 computes that shard's gradient (Xᵀ times A1's slice of dL/dQ), so there is
# nothing on A2 to add to it. An all-reduce would add A2's gradient of a *different*
# shard. What the GPUs do have to add up are gradients of *activations*, and that is what
# `BookAttention` does:
#
# - dL/dQ and dL/dK: Q and K are all-gathered again (only each GPU's own slices were kept,
#   which saves memory), each GPU computes its *contribution* to the gradients of the whole
#   Q and K (through its own V columns only), and an all-reduce sums the contributions
#   before each GPU keeps its slice;
# - dL/dX: each GPU's projections give a partial gradient of the input they share, and a
#   reduce sums the two onto A1, where the embedding table lives. This is Megatron's `f`
#   operator of section 4 (identity forward, sum backward), with the broadcast in place of
#   the identity.
#
# The weight gradients stay on the GPU that computed them. The toy log below shows which
# tensors the collectives carry.
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
# All three on the same weights and the section's `size` (`batch = 2`, `seq = 4`,
# `d_model = 8`, `n_heads = 2`), with a causal mask:

# %%
from parlab.tensor_parallel import collective_wire_bytes
from parlab.experiments import run_attention

attention = {name: run_attention(name, **size, backend="toy")
             for name in ("book", "megatron", "pytorch")}
for c in attention.values():
    print(c.summary())

# %% [markdown]
# Outputs and gradients (every weight and bias, and the input) equal the single-GPU layer
# in all three. The book's run is the second reading of "distributed" at work: X is
# copied to both GPUs by the broadcast, and each copy meets that GPU's shards.
#
# **Exercise 04.3 (predict first).** The next cell prints what each split moved. Before you
# run it: how many bytes does the book's forward pass (steps 1 to 5 above) put on the
# wire, both GPUs together, with batch 2, 4 tokens, `d_model = 8` and fp32?

# %%
answer_04_3 = ...
check("04.3", answer_04_3)

# %% [markdown]
# What each one moved, from the toy backend's log (PyTorch's DTensor runs its collectives
# on the toy backend like any other code):

# %%
for name in attention:
    print(f"--- {name}\n{attention[name].traffic_table()}")

# %% [markdown]
# ### What the backward collectives carry
#
# The log says which tensors were summed or gathered, by their size. Here the input has as
# many elements as W_Q (batch x tokens = d_model), so run the book's and Megatron's layers
# once more with `seq = 5` instead of `seq = 4`: then no activation has the size of a weight
# or of a weight shard. Each backward collective, with the size of the tensor it carried (from
# its bytes on the wire and the ring formula), next to the activation size and the weight
# shards:

# %%
from parlab.experiments import gradient_shard_bytes

odd = dict(size, seq=5)
evidence = {name: run_attention(name, **odd, backend="toy") for name in ("book", "megatron")}
x_grad = evidence["book"].reference["x.grad"]
print(f"X, Q, K and their gradients: {tuple(x_grad.shape)} floats = {x_grad.nbytes} B")
print("weight-gradient shards on A1 (B):", gradient_shard_bytes(evidence["book"]))
for name, c in evidence.items():
    print(f"--- {name}, backward pass\n{calls_table(collective_calls(c.traffic['backward']))}")

# %% [markdown]
# Every collective of the backward pass carries a tensor of X's size: Q and K gathered
# again, their gradients summed, X's gradient reduced. None carries a weight shard. In
# Megatron's layer the only backward collective is the all-reduce of X's gradient, the `f`
# operator. The weight gradients need no collective at all within a tensor-parallel group;
# they are summed only across data-parallel replicas (chapters 02 and 03), where every
# replica holds the same shard.

# %% [markdown]
# PyTorch's API issues its collectives through its own functional layer, and PyTorch ships
# its own debugging view of them: `CommDebugMode` (`torch.distributed.tensor.debug`, the
# tool its tensor-parallel tutorials use). Held open over the forward and the backward
# pass, it catches each collective in PyTorch's dispatcher and counts it against the module
# that was running, in the forward or the backward pass. Its table for the DTensor
# attention on A1, at its lowest noise level (collectives only; higher levels add every
# DTensor operation with its shapes and placements):

# %%
print(attention["pytorch"].info["comm_table"])

# %% [markdown]
# `Global` counts everything inside the mode, `SelfAttention` the layer, and below it the
# four projections. The forward all-reduce belongs to `out_proj`: `RowwiseParallel` sums
# the partial outputs of W_O, Megatron's `g`. The backward one is filed under `q_proj`,
# but it is not q_proj's own: it sums the input gradients of all three projections at the
# layer's input (Megatron's `f`). CommDebugMode files a backward collective under the
# module whose backward pass began last, and q_proj's, the first projection of the forward
# pass, is the last to begin.
#
# CommDebugMode counts calls, not bytes. `CommBytes`, parlab's subclass of it, counts the
# same way and also keeps the size of the tensor each call was handed; the ring formula
# turns those into bytes on the wire. Both agree with the toy backend's log, which saw the
# same collectives as messages between the GPUs:

# %%
pytorch = attention["pytorch"]
pytorch_calls = pytorch.info["collectives"]
print(pytorch_calls)
for phase, counts in pytorch.info["comm_counts"].items():
    print(f"{phase:<8}  CommDebugMode counted {sum(counts.values())} collective(s); "
          f"the toy log shows {len(collective_calls(pytorch.traffic[phase]))}")
print("on the wire (ring, 2 GPUs):", collective_wire_bytes(pytorch_calls, 2))
print("logged by the toy backend:  ", pytorch.total_bytes())

# %% [markdown]
# The same as Megatron: one all-reduce of X's size each way. That takes one detail:
# declaring the attention module's input replicated with `PrepareModuleInput`, so the three
# projections' input gradients are added up before a single all-reduce. Without it, each
# `ColwiseParallel` all-reduces its own input gradient, as CommDebugMode's table shows,
# module by module:

# %%
unprepared = run_attention("pytorch", **size, backend="toy", prepare_input=False)
print(unprepared.summary())
print(unprepared.info["comm_table"])

# %% [markdown]
# The book's forward and backward passes, step by step and top to bottom in the order
# they can happen, with the bytes of each collective as the toy backend logged them. The
# backward pass must gather Q and K again before it can recompute the probabilities from
# them:

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
# broadcast, the all-gathers of Q and K (forward, and again backward), the all-reduces of
# their gradients, and the final reduce (the ratio printed above), and every extra
# collective is one more point where both GPUs wait for each other.
#
# What the book's way can do that Megatron's cannot: split *inside* a head. With a single
# head, Megatron's split is refused, and the book's way still gives the right layer,
# because the gathered Q and K contain the whole head:

# %%
one_head = run_attention("book", **dict(size, n_heads=1), backend="toy")
print(one_head.summary())
try:
    run_attention("megatron", **dict(size, n_heads=1))
except ValueError as err:
    print("ValueError:", err)

# %% [markdown]
# `BookAttention` sums the Q and K gradient contributions with an all-reduce, the
# collective the chapter names. Each GPU keeps only its own slice of the sum, so a
# reduce-scatter does the same job for fewer bytes:

# %%
scattered = run_attention("book", **size, backend="toy", grad_sync="reduce_scatter")
print(scattered.summary())
print("backward bytes, all-reduce:", attention["book"].total_bytes()["backward"],
      " reduce-scatter:", scattered.total_bytes()["backward"])
summed = (attention["book"].bytes_by_op()["backward"]["all_reduce"],
          scattered.bytes_by_op()["backward"]["reduce_scatter"])
print(f"summing dQ and dK alone: {summed[0]} B by all-reduce, {summed[1]} B by "
      f"reduce-scatter ({summed[1] / summed[0]:g} x)")

# %% [markdown]
# These byte counts follow formulas (`counting.attention_bytes`, equal to the toy
# backend's log), so they can be scaled to GPT-3: one attention layer,
# <span data-glue="gpt3_seq">2,048</span> tokens, `d_model = 12288`,
# <span data-glue="tp_gpt3">8</span> GPUs, fp16. Change the sizes below the figure:

# %%
from parlab.viz.widgets import attention_explorer

attention_explorer(seq=gpt3.context, d_model=gpt3.d_model, ranks=lm["tp"], precision="fp16")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("gpt3_seq", gpt3.context, ",")

# %% [markdown]
# ## 6. Figure 8-19: the feed-forward layer on six GPUs
#
# The book presents this network as the feed-forward layer of a transformer block, made of
# two hidden layers and an output layer. A transformer's feed-forward layer (Figure 8-15,
# and `parlab.models.MLP`) is d_model -> d_ff -> d_model: *one* hidden layer, four times
# wider than the model, and an output layer back to the model's width. The widths of both:

# %%
from parlab.experiments import ffn_widths

widths = ffn_widths()
print(f"Figure 8-19:            {' -> '.join(map(str, widths['book']))} "
      f"({widths['book_hidden_layers']} hidden layers)")
print(f"GPT-3's feed-forward:   {' -> '.join(map(str, widths['transformer']))} "
      f"({widths['transformer_hidden_layers']} hidden layer, d_ff / d_model = "
      f"{widths['d_ff_over_d_model']:g})")

# %% [markdown]
# So read Figure 8-19 as a small stand-in network, chosen so that each layer can be a
# pipeline stage of its own. In a real transformer the feed-forward layer's two matrices
# are the Megatron MLP of section 4 (column-parallel, then row-parallel) on the GPUs of
# one server, and pipeline stages hold whole blocks.
#
# In the figure, each layer is a pipeline stage in its own server, and inside the server
# its neurons are split between the two GPUs, which talk over NVLink: the book calls the
# NVLink-connected GPUs of a server the *High-speed Domain* (HsD). The A GPUs of all
# three servers hang off rail switch 1, the B GPUs off rail switch 2. Ranks are numbered
# server by server, which gives exactly the figure's names:

# %%
from parlab.tensor_parallel import layout

for place in layout((4, 6, 4, 2), tensor=2):
    print(place)

# %% [markdown]
# Forward, per micro-batch (the book's context vectors C1, C2): each GPU computes its
# neurons from the stage's whole input, the two halves are all-gathered over the HsD,
# and each GPU sends the assembled output to the next stage's GPU on its own rail (A1 to
# A2, B1 to B2), so no packet crosses the spine. Backward: the output error flows back;
# each GPU's neurons' errors give its weight gradients locally, and the error for the
# previous stage's outputs is a sum over *all* of this stage's neurons, half of which live
# on the partner GPU. So the partners all-reduce that sum over the HsD, then send it back
# along the rails. That all-reduce is the synchronization this network needs. The weight
# gradients need none: each weight lives on exactly one GPU. Here the chapter says
# otherwise: it all-reduces the feed-forward weights' gradients across the GPUs "before
# proceeding". That is the slip of section 5 again; the backward log below shows what the
# all-reduces carry. (With data-parallel copies of the pipeline, chapter 03, the copies'
# gradients of the same weights would be summed.)
#
# **Exercise 04.4 (predict first).** The next cell runs this network on a batch of 4
# context vectors in fp32, in 2 micro-batches, and prints the bytes per type of link.
# Before you run it: how many bytes cross the rail switches in the forward pass?

# %%
answer_04_4 = ...
check("04.4", answer_04_4)

# %% [markdown]
# The batch of <span data-glue="ffn_batch">4</span> context vectors in
# <span data-glue="ffn_micro">2</span> micro-batches, compared with the same network
# (`parlab.models.BookMLP`) on one device:

# %%
from parlab.experiments import run_ffn
from parlab.comm import figure_8_19

batch, micro_batches = 4, 2
ffn = run_ffn(sizes=(4, 6, 4, 2), tensor=2, batch=batch, micro_batches=micro_batches,
              backend="toy")
print(ffn.summary())
cluster = figure_8_19(nic_gbps=400)
print(cluster)
for phase, log in ffn.traffic.items():
    links = log.per_link_type(cluster)
    print(f"{phase:<8} bytes: NVLink {links['nvlink']:>4}, rail {links['rail']:>4}, "
          f"spine {links['spine']}")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("ffn_batch", batch)
glue("ffn_micro", micro_batches)

# %% [markdown]
# What the backward pass summed inside each server: the number of all-reduces, the size of
# the tensor each carried (read from the log), the size of the stage's input gradient for
# one micro-batch, and the size of one GPU's piece of the stage's weights:

# %%
from parlab.experiments import ffn_backward_sums

for row in ffn_backward_sums(ffn):
    print(f"{row['layer']:<3}: {row['all_reduces']} all-reduces ({row['micro_batches']} "
          f"micro-batches) of {row['tensor_bytes']} B; input gradient per micro-batch "
          f"{row['input_gradient_bytes']} B; weight shard {row['weight_shard_bytes']} B")

# %% [markdown]
# One all-reduce per micro-batch, each the size of the stage's input gradient: they sum
# errors, an activation gradient, as each micro-batch comes back. Where a weight shard has
# the same size, the count tells them apart: the weight gradients are added up over the
# micro-batches on each GPU and never leave it, so summing them would be one all-reduce per
# stage, after the last micro-batch.

# %% [markdown]
# Every collective stayed inside a server and every send stayed on one rail. The figure
# draws each link with its bytes:

# %%
from parlab.viz.plots import ffn_figure

show(ffn_figure(ffn))

# %% [markdown]
# How long would these transfers take on real links? `TrafficLog.time` applies the
# alpha-beta model of `parlab.comm` (NVLink at <span data-glue="ffn_nvlink_gbs">450</span>
# GB/s, NICs at the two speeds of the loop below, plus a latency per message; the messages
# of one step of a collective run at the same time, steps one after another). Each type of
# link is timed on its own here:

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

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("ffn_nvlink_gbs", cluster.links["nvlink"].bandwidth / GB, ".0f")

# %% [markdown]
# Messages this small (their bytes are printed above) cost their latency and nothing
# else, so the NIC speed changes nothing: what counts is how many messages follow one
# another. The NVLink side has more of them (every micro-batch's all-gather and, backward,
# the steps of each all-reduce) at a lower latency than a hop through a rail switch. With
# GPT-3's widths the bytes take over, and then NVLink's bandwidth (the ratio printed
# above) is why the chapter keeps the chatty tensor-parallel traffic inside the
# High-speed Domain.

# %% [markdown]
# ### Between rails: the spine, or a relay over the High-speed Domain
#
# No message of this run changed rails. When one has to (A1 to B2), the book gives two
# ways. The rail switches can be joined by spine switches: the message leaves by A1's NIC,
# crosses rail switch 1, a spine switch and rail switch 2. Or it can first go over the
# High-speed Domain to the GPU of A1's server on B2's rail, B1, which sends it along rail 2:
# NCCL does this and calls it PXN ("PCI x NVLink"). `Topology.route` gives both. To count
# them, take the run's messages between servers and address each to the other GPU of the
# receiving server (A1 to B2 instead of A2), so that all of them change rails:

# %%
from parlab.experiments import cross_rail_bytes

crossed = cross_rail_bytes(ffn, cluster)
for phase, row in crossed.items():
    print(f"{phase}: {row['messages']} messages, {row['bytes']} B")
    for via in ("spine", "relay"):
        w = row[via]
        print(f"  by the {via:<5}: NVLink {w['nvlink']:>3} B, rail {w['rail']:>3} B, spine "
              f"{w['spine']:>3} B; passes through a network switch: {w['switches']}")
fwd = crossed["forward"]

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("xr_messages", fwd["messages"])
glue("xr_bytes", fwd["bytes"])
glue("xr_spine_switches", fwd["spine"]["switches"] // fwd["messages"])
glue("xr_relay_switches", fwd["relay"]["switches"] // fwd["messages"])

# %% [markdown]
# By the spine, the forward pass's <span data-glue="xr_messages">8</span> messages put their
# <span data-glue="xr_bytes">320</span> B through the spine, each passing
# <span data-glue="xr_spine_switches">3</span> network switches. By the relay, the same
# <span data-glue="xr_bytes">320</span> B cross the High-speed Domain once and a rail once,
# and never the spine: each message passes
# <span data-glue="xr_relay_switches">1</span> network switch. The relay costs an extra
# copy of the bytes, on the link with the most bandwidth (the NVLink/NIC ratio printed
# above); it saves switch hops and keeps the traffic off the spine, which all the traffic
# between rails shares. (The time model here treats the spine as never congested, so that
# saving does not show in its times.) The book's forward pass already has the relay's
# shape: the all-gather puts H1's whole output on B1 over the High-speed Domain, and B1
# sends it along rail 2, so nothing needs to go from A1 to B2.
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
# Exercises 04.1 to 04.4 are in sections 1, 4, 5 and 6, each before the cell that prints
# its answer. One more, on a layer size this notebook never runs.
#
# **Exercise 04.5 (compute or run).** A linear layer with `C_in = 64` inputs and
# `C_out = 96` outputs, on 2 GPUs, in fp32. Count everything a training step puts on the
# wire (forward and backward, ring collectives): what is the largest batch B for which the
# slides' reduce-output split moves no more bytes than data parallelism? Work it out from
# the collectives each strategy runs (section 4), or measure: `run_layer_strategy` from
# `parlab.tensor_parallel` runs one strategy on toy ranks (`.total_bytes()` gives each
# pass), and the explorer of section 4 takes these sizes too.

# %%
answer_04_5 = ...
check("04.5", answer_04_5)

# %% [markdown]
# Worked solutions are in `pkg/parlab/exercises/ch04_solutions.py`. This notebook does not
# import it; open it once you have tried.

# %% [markdown]
# ## What's next
#
# Chapter 05 combines the strategies: data x tensor x pipeline parallelism on a
# rail-optimized cluster, tensor parallelism inside a server (where NVLink is), pipeline and
# data parallelism across the rails, and a planner that picks the split for a model.
