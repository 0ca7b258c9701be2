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
# # 08 · Beyond the book: long sequences split across GPUs
#
# Models now read whole books in one sequence: Llama 3 finished its pre-training with a
# context of 128K tokens (Dubey et al., 2024).
# The earlier chapters split the batch, the layers and each layer's weights, but every GPU
# still saw whole sequences. As a sequence grows, what a GPU keeps for the backward pass
# grows with it, and one sequence can outgrow a GPU on its own. The fix is to split the
# sequence itself. Attention is the hard part: every token looks at the tokens before it,
# which now live on other GPUs.
#
# In this notebook you will:
#
# 1. see where the memory goes as the sequence grows;
# 2. merge attention computed piece by piece, by hand (the online softmax);
# 3. follow **ring attention** on <span data-glue="ranks">4</span> ranks: keys and values
#    travel round a ring while the queries stay;
# 4. see why the first rank idles under a causal mask, and how the **zigzag** layout fixes
#    it;
# 5. run ring attention, **all-gather** attention (Llama 3's method) and **Ulysses**
#    (DeepSpeed's) on real ranks, each equal to attention over the whole sequence, and
#    compare them byte by byte;
# 6. split the rest of the block by sequence too, Megatron's **sequence parallelism**, and
#    see the memory per GPU of each method as the sequence grows to 128K tokens;
# 7. explore, and solve three exercises.
#
# Notation: a sequence of S tokens on p ranks, H query heads and H_kv key/value heads
# (fewer with grouped-query attention), t the tensor-parallel degree of chapter 04. A word
# of warning: "sequence parallelism" names two things in the literature. Here, as in
# Megatron, it is section 6's split of the layers around attention; splitting attention
# itself by sequence (sections 3 to 5) is **context parallelism**, which some papers,
# DeepSpeed-Ulysses among them, also call sequence parallelism.

# %%
import torch

from parlab.experiments import CONTEXT_RANKS, CONTEXT_SHAPE
from parlab.viz import show

batch, heads, seq, d_head = CONTEXT_SHAPE
print(f"example: {batch} sequence of {seq} tokens, {heads} heads of width {d_head}, float64, "
      f"on {CONTEXT_RANKS} ranks")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
from parlab.viz import glue

glue("ranks", CONTEXT_RANKS)
glue("seq", seq)
glue("heads", heads)
glue("d_head", d_head)
glue("chunk", seq // CONTEXT_RANKS)
glue("diag_pairs", (seq // CONTEXT_RANKS) * (seq // CONTEXT_RANKS + 1) // 2)
glue("block_pairs", (seq // CONTEXT_RANKS) ** 2)

# %% [markdown]
# ## 1. Where the memory goes
#
# Chapter 01's calculator counts what one block keeps for its backward pass. For a
# Llama-3-8B block (given the longer context of Llama-3.1-8B) and one sequence, in bf16:

# %%
from parlab.experiments import LLAMA_31_8B as llama
from parlab.memory import block_activations
from parlab.units import format_bytes

for tokens in (8192, 32768, 131072):
    per_block = sum(block_activations(llama, 1, tokens, "bf16").values())
    print(f"{tokens:>7,} tokens: {format_bytes(per_block)} per block, "
          f"{format_bytes(per_block * llama.n_layers)} for all {llama.n_layers} blocks")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
from parlab.hardware import GPU_MEMORY_GB

long_block = sum(block_activations(llama, 1, 131072, "bf16").values())
glue("long_all_gb", long_block * llama.n_layers / 1e9, ".0f")
glue("gpu_gb", GPU_MEMORY_GB, ".0f")
glue("long_gpus", long_block * llama.n_layers / 1e9 / GPU_MEMORY_GB, ".0f")
glue("llama_kv", llama.n_kv_heads)

# %% [markdown]
# Every term grows in proportion to the sequence: this block uses a fused attention kernel,
# which keeps one number per query instead of the whole table of scores (chapter 01). At
# 128K tokens the activations alone take <span data-glue="long_all_gb">896</span> GB, the
# memory of <span data-glue="long_gpus">11</span> GPUs of <span data-glue="gpu_gb">80</span>
# GB, before any weight. Recomputation (chapter 06) trades some of it for time; splitting
# the sequence over p GPUs gives each GPU S/p tokens, so nearly every term is divided by p
# (what a method gathers for attention, below, is the exception). The weights stay whole
# on every GPU of the split, so their gradients are summed over those GPUs, as data
# parallelism sums them (Megatron folds the two into one all-reduce), and the labels of
# the loss are cut the same way as the tokens.
#
# ## 2. Attention one piece at a time
#
# For one query, attention weighs every key by `exp(score)` and divides by the sum. Split
# the keys into blocks: each block gives its own weighted average `o_b` and the logarithm of
# its sum, `L_b = log Σ exp(score)`. Two blocks combine exactly: `L = log(exp(L_a) +
# exp(L_b))`, and the new average weighs each block's by `exp(L_b - L)` (`L` is called
# `lse` in the code). This is the online softmax (Milakov and Gimelshein, 2018) that
# FlashAttention (Dao et al., 2022) uses inside one GPU. One query, four keys, in two blocks
# of two:

# %%
from parlab.context_parallel import block_forward, merge

q = torch.tensor([[[[1.0, 0.0]]]], dtype=torch.float64)
k = torch.tensor([[[[1.0, 0.0], [0.0, 1.0], [2.0, 0.0], [-1.0, 0.0]]]], dtype=torch.float64)
v = torch.tensor([[[[1.0], [2.0], [3.0], [4.0]]]], dtype=torch.float64)
pos = torch.arange(4)
first = block_forward(q, k[..., :2, :], v[..., :2, :], pos[3:], pos[:2], False, 1.0)
second = block_forward(q, k[..., 2:, :], v[..., 2:, :], pos[3:], pos[2:], False, 1.0)
merged, lse = merge(*first, *second)
whole = torch.softmax(q @ k.transpose(-2, -1), -1) @ v
for name, (o, l) in (("keys 0-1", first), ("keys 2-3", second), ("merged", (merged, lse))):
    print(f"{name}: o = {o.item():.4f}, L = {l.item():.4f}")
print(f"all four keys at once: o = {whole.item():.4f}")

# %% [markdown]
# The merge needs only each block's average and its `L`, never the other block's keys. So a
# GPU can meet the keys one block at a time and still end with exact softmax attention.
# Ring attention (Liu et al., 2023; Li et al., 2021 before it) does it across GPUs.
#
# ## 3. Ring attention, step by step
#
# Each of the <span data-glue="ranks">4</span> ranks holds
# <span data-glue="chunk">4</span> of the <span data-glue="seq">16</span> tokens: their
# queries, keys and values. At each step a rank attends its own queries to the key/value
# block it holds and merges the result; at each step but the last it also passes the block
# on to the next rank while receiving one from the previous rank: p - 1 transfers, and
# after p steps every rank has seen every block. The transfer is started before the
# block's arithmetic, so that on real hardware it hides behind it when blocks are large
# enough. In the picture each rank starts with its own block; the colours follow a block
# round the ring.
#
# With a causal mask a query sees only earlier tokens, so a block that lies wholly in a
# rank's future is skipped: with the sequence cut in order (the **contiguous** layout),
# rank 0 computes one block and rank 3 four.

# %%
from parlab.experiments import ring_steps

show(ring_steps("contiguous"))

# %% [markdown]
# **Exercise 08.1 (predict first).** In the example (float64, <span data-glue="heads">4</span>
# heads of width <span data-glue="d_head">4</span>), how many bytes does one rank send in
# ring attention's forward pass? Section 5 measures it.

# %%
from parlab.exercises import check

check("08.1", ...)

# %% [markdown]
# **Exercise 08.2 (predict first).** On 8 ranks, contiguous layout, causal, a long
# sequence: how many times the first rank's unmasked (query, key) pairs does the last rank
# have? (Only about half of a block on the diagonal is unmasked.)

# %%
check("08.2", ...)

# %% [markdown]
# ## 4. Balancing a causal mask
#
# Under a causal mask, the contiguous layout gives late ranks far more work. Two fixes
# change only which tokens a rank holds, and keep every token's global position (the mask
# and the rotary embedding use it, and the labels must be cut the same way):
#
# - **zigzag**: cut the sequence into 2p chunks; rank r takes chunk r and chunk 2p-1-r, one
#   early and one late (Llama 3 used two chunks per GPU this way);
# - **striped**: rank r takes tokens r, r+p, r+2p, ... (Brandon et al., 2023).
#
# Work is counted here in unmasked (query, key) pairs, and in the floating-point operations
# PyTorch's `FlopCounterMode` counts in our ring attention's forward pass, both in units of
# one S/p x S/p block. Wall time would not show it: the ranks share a few CPU cores.

# %%
from parlab.context_parallel import LAYOUTS, positions
from parlab.experiments import causal_work_chart

for layout in LAYOUTS:
    mine = positions(seq, 0, CONTEXT_RANKS, layout).tolist()
    print(f"{layout:>10}: rank 0 holds positions {mine}")
show(causal_work_chart())

# %% [markdown]
# Counting a diagonal block as half, the contiguous layout gives rank r `r + 1/2` blocks of
# unmasked pairs: the last rank has `2p - 1` times the first. Zigzag gives every rank the
# same. Our ring attention computes only the rectangle of queries and keys that see each
# other, so under zigzag every step but the first costs half a block and the ranks' FLOPs
# are equal too. Striped comes close to balanced, but leaves no rectangle to cut: each step
# computes most of a block, about half of it masked (a kernel that skips masked entries
# inside a block would recover that). With only <span data-glue="chunk">4</span> tokens a
# block, a diagonal block still holds <span data-glue="diag_pairs">10</span> of its
# <span data-glue="block_pairs">16</span> pairs, and striped's offsets of one token
# matter; as S/p grows the contiguous ratio tends to `2p - 1` (the explorer of section 7
# prints it for long sequences) and striped's to 1.
#
# ## 5. Three ways, run for real
#
# One launch runs three methods on the toy backend, each on a process group named after it,
# and compares each with `scaled_dot_product_attention` over the whole sequence in one
# process: the output and the gradients of Q, K and V. The tokens are cut in order. The
# methods:
#
# - **ring**: section 3. The backward pass sends the blocks round again, each with the
#   gradients of its keys and values collected so far, which end at their owner;
# - **all-gather** (Llama 3): every rank gathers every key and value, then attends its own
#   queries to all of them; the backward pass reduce-scatters their gradients. Llama 3 chose
#   it because with grouped-query attention keys and values are small, and any mask (one
#   document per sequence, say) is easy;
# - **Ulysses** (DeepSpeed, Jacobs et al., 2023): an all-to-all turns "some tokens, all
#   heads" into "all tokens, some heads", each rank computes ordinary attention for its
#   heads, and a second all-to-all turns the output back.
#
# The bytes are each rank's, measured from the toy log (the forward pass alone, then the
# backward pass by difference), beside each method's closed form.

# %%
import pandas as pd

from parlab.experiments import compare_methods

methods = compare_methods()
print(pd.DataFrame([m.row() for m in methods]).to_string(index=False))

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
by_method = {m.method: m for m in methods}
glue("ring_fwd", by_method["ring"].closed_form["forward"], ",")
glue("ring_bwd", by_method["ring"].closed_form["backward"], ",")
glue("gather_bwd", by_method["all-gather"].closed_form["backward"], ",")
glue("ulysses_fwd", by_method["ulysses"].closed_form["forward"], ",")

# %% [markdown]
# All three agree with one process to rounding. Per rank, with `m_kv` the bytes of one
# rank's K shard (V's is the same) and `m_q` of its Q shard:
#
# | method | forward | backward | what each rank holds | limit |
# |---|---|---|---|---|
# | ring | (p-1)·2m_kv | (2p-1)·2m_kv | one more K,V block in flight | each block's arithmetic must hide its transfer |
# | all-gather | (p-1)·2m_kv | (p-1)·2m_kv | every K and V of the sequence | memory for the whole K, V |
# | Ulysses | (p-1)/p·(2m_q + 2m_kv) | the same | all tokens of H/p heads | p divides H_kv |
#
# Here: ring <span data-glue="ring_fwd">3,072</span> B forward and
# <span data-glue="ring_bwd">7,168</span> B backward, all-gather
# <span data-glue="gather_bwd">3,072</span> B backward, Ulysses
# <span data-glue="ulysses_fwd">1,536</span> B each way. In each pass, ring and all-gather
# send (p-1)/p of the whole sequence's keys and values per rank (ring's backward pass about
# twice that): this grows with the sequence, whatever p is. Ulysses sends a fixed share of
# each rank's own tokens, so its bytes per rank stay constant when the sequence and the GPUs
# grow together. But it moves the queries and outputs too: with grouped-query attention,
# whose keys and values are few, that can cost more than the ring (compare them for
# Llama-3-8B in the explorer of section 7). And its limit: each rank needs whole heads, so
# p can be at most H_kv (<span data-glue="llama_kv">8</span> for Llama-3-8B). Ring's
# point-to-point transfers can hide behind the block arithmetic; Ulysses' all-to-alls
# cannot, since attention needs their result first.

# %% [markdown]
# ## 6. The rest of the block: sequence parallelism
#
# Chapter 04's tensor parallelism splits attention and the MLP by heads and columns, but
# the LayerNorms and the residual additions between them see whole tokens on every GPU:
# those activations are replicated t times. Megatron's **sequence parallelism** (Korthikanti
# et al., 2022) splits them by sequence instead. Where tensor parallelism all-reduces after
# a row-parallel layer, it reduce-scatters (each GPU keeps the finished rows of its own
# tokens); before a column-parallel layer it all-gathers the tokens. A ring all-reduce is a
# reduce-scatter followed by an all-gather, so the forward pass sends the same bytes.
#
# One block (d_model <span data-glue="sp_width">64</span>,
# <span data-glue="sp_heads">8</span> heads, one sequence of
# <span data-glue="sp_seq">64</span> tokens, fp32) on <span data-glue="ranks">4</span> toy
# ranks, each way, against one process:

# %%
from parlab.experiments import run_sequence_parallel

sp = run_sequence_parallel()
for kind, name in (("tp", "tensor parallel"), ("sp", "sequence parallel")):
    print(f"{name:>17}: equal to one process (1e-5): {sp.max_error[kind] < 1e-5}; activations "
          f"kept per rank {sp.saved_bytes[kind][0]:,} B; rank 0 sent {sp.sent[kind]}")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
from parlab.experiments import SP_CONFIG

glue("sp_width", SP_CONFIG.d_model)
glue("sp_heads", SP_CONFIG.n_heads)
glue("sp_seq", SP_CONFIG.context)
extra_gather = sum(sp.sent["sp"].values()) - sum(sp.sent["tp"].values())
glue("sp_saved_pct", 100 * (1 - sp.saved_bytes["sp"][0] / sp.saved_bytes["tp"][0]), ".0f")
glue("sp_extra", extra_gather, ",")

# %% [markdown]
# Sequence parallelism keeps <span data-glue="sp_saved_pct">33</span> % less per rank here.
# A test holds both counts exactly: with sequence parallelism every one of Korthikanti's
# terms (without dropout, which our GPT does not have) is divided by t, and beyond them each
# rank keeps the causal mask whole and the LayerNorms' statistics for its own tokens; with
# tensor parallelism alone the LayerNorm regions stay whole. It sends
# <span data-glue="sp_extra">24,576</span> B more, all in the backward pass: like Megatron,
# each column-parallel layer keeps only its own tokens and all-gathers them again to form
# its weight gradient. Not counted here: the LayerNorms' weights (and the row-parallel
# biases) saw only each rank's tokens, so their gradients are summed over the ranks before
# the optimizer step, a small all-reduce (`allreduce_sequence_parallel_grads`). The paper's
# formula for a layer with dropout, per GPU, for sequence length s, micro-batch b, width h
# and a heads in 16-bit activations, is `sbh(34 + 5as/h)/t` with both methods against
# `sbh(10 + 24/t + 5as/(ht))` with tensor parallelism alone.
#
# ### Memory per GPU, as the sequence grows
#
# Chapter 01's calculator takes all of this: `estimate(..., cp=, cp_method=,
# sequence_parallel=)`. Each method's count is what each rank really keeps: a test puts
# ring, all-gather and Ulysses attention into a GPT and a Llama with
# `apply_context_parallel` and holds the count, byte for byte, to the tensors autograd
# saves on two and four ranks, for one block and for the whole step with its loss. For
# Llama-3.1-8B on one server, and for the layouts Llama 3 published for its largest model
# (Dubey et al., 2024, Table 4: tensor 8 and pipeline 16, with context parallelism 16 for
# the 128K stage), in bf16 with Adam:

# %%
from parlab.experiments import memory_by_sequence_chart

show(memory_by_sequence_chart())

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
from parlab.experiments import memory_by_sequence

memory = memory_by_sequence()
small, big = memory.values()
glue("mem_tp8", small["tp 8"][-1].total / 1e9, ".0f")
glue("mem_sp8", small["tp 8 + sequence parallel"][-1].total / 1e9, ".0f")
glue("mem_cp8", small["cp 8, ring"][-1].total / 1e9, ".0f")
glue("mem_ag8", small["cp 8, all-gather (ours keeps a mask)"][-1].total / 1e9, ".0f")
glue("mem_8k_sp", big["tp 8 + sequence parallel, pp 16"][-1].total / 1e9, ",.0f")
glue("mem_cp16", big["+ cp 16 ring (128K stage)"][-1].total / 1e9, ".0f")
glue("mem_cp16_act", big["+ cp 16 ring (128K stage)"][-1].activations / 1e9, ".0f")
glue("mem_cp16_8k", big["+ cp 16 ring (128K stage)"][0].total / 1e9, ".0f")

# %% [markdown]
# At 128K tokens the smaller model needs <span data-glue="mem_tp8">379</span> GB per GPU with
# tensor parallelism alone, <span data-glue="mem_sp8">138</span> GB with sequence
# parallelism, and <span data-glue="mem_cp8">159</span> GB with ring attention over the
# server's GPUs (its weights and Adam state are then copied on every GPU, ZeRO-1 shards only the
# optimizer state): one server is not enough at that length, whatever the method. Ring and
# Ulysses keep nearly the same bytes; our all-gather keeps
# <span data-glue="mem_ag8">307</span> GB, because it builds a mask of which keys each query
# may see, T/p by T booleans that become a T/p by T tensor attention keeps for its backward
# pass. Llama 3's kernel needs no such mask, so read that curve as the cost of our simple
# version, not of the method. For the largest model, the 8K stage's layout at 128K tokens
# would need <span data-glue="mem_8k_sp">1,742</span> GB per GPU even with sequence
# parallelism; context parallelism brings it to
# <span data-glue="mem_cp16">118</span> GB, of which
# <span data-glue="mem_cp16_act">104</span> GB are the activations of the 16 micro-batches
# the first stage holds in flight. That is still more than 80 GB: the paper does not say
# how it fits the rest (its own pipeline schedule, and whatever it recomputes, are not
# modelled here), so take this as the calculator's count for these layouts, not as
# Meta's measurement. The 128K layout at 8K tokens would need only
# <span data-glue="mem_cp16_8k">21</span> GB, which is why the short stage used no context
# parallelism.
#
# ## 7. Explore
#
# The closed forms for Llama-3-8B's attention (<span data-glue="explorer_heads">32</span>
# query heads, <span data-glue="llama_kv">8</span> key/value heads of width
# <span data-glue="explorer_width">128</span>, bf16, one layer), for a sequence of up to
# 512K tokens: each rank's bytes per pass for each method, the causal imbalance of each
# layout, and for ring attention its steps. It opens on the zigzag layout, whose ring steps
# section 3 did not draw (it drew the contiguous one's). Try Ulysses against the ring at the
# default number of ranks, then at twice as many: with few key/value heads, the ring sends
# less until p grows.

# %%
from parlab.viz.widgets import context_explorer

context_explorer(layout="zigzag")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
from parlab.viz.widgets.context import D_HEAD, HEADS

glue("explorer_heads", HEADS)
glue("explorer_width", D_HEAD)

# %% [markdown]
# ## 8. One more exercise
#
# **Exercise 08.3 (predict, then run).** On 2 ranks instead of 4, how many bytes does one
# rank send in Ulysses' forward pass? Answer with your prediction; then confirm it with
# `result = compare_methods(("ulysses",), world=2)[0]` and `result.sent["forward"][0]`.

# %%
check("08.3", ...)

# %% [markdown]
# ## What's next
#
# Each method here is a function on a process group, so it composes with the others: context
# parallelism alongside tensor parallelism, each on its own group of ranks; Ulysses within a
# server and ring attention across servers (Megatron-Core's `a2a+p2p`); all of it inside
# data and pipeline parallelism. Chapter 01's calculator does not yet take a
# context-parallel degree; that comes with the planner.
