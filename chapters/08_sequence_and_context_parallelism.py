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
# Models now read whole books in one sequence: Llama 3 finished its training at 128K tokens.
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
# 3. run **ring attention** on <span data-glue="ranks">4</span> real ranks: keys and values
#    travel round a ring while the queries stay, and the result equals attention over the
#    whole sequence;
# 4. see why the first rank idles under a causal mask, and how the **zigzag** layout fixes
#    it;
# 5. compare ring attention with **all-gather** attention (Llama 3's method) and
#    **Ulysses** (DeepSpeed's), byte by byte;
# 6. split the rest of the block by sequence too, Megatron's **sequence parallelism**;
# 7. explore, and solve three exercises.

# %%
import torch

from parlab.context_parallel import positions, shard, unshard
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

# %% [markdown]
# ## 1. Where the memory goes
#
# Chapter 01's calculator counts what one block keeps for its backward pass. For a
# Llama-3-8B block (given the longer context of Llama-3.1-8B) and one sequence, in bf16:

# %%
from parlab.memory import block_activations
from parlab.models import get_config
from parlab.units import format_bytes

llama = get_config("Llama-3-8B").replace(name="Llama-3.1-8B", context=131072)
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
# GB, before any weight. Recomputation (chapter 06) trades some of it for
# time; splitting the sequence over p GPUs divides all of it by p.
#
# ## 2. Attention one piece at a time
#
# For one query, attention weighs every key by `exp(score)` and divides by the sum. Split
# the keys into blocks: each block gives its own weighted average `o_b` and the logarithm of
# its sum, `L_b = log Σ exp(score)`. Two blocks combine exactly: `L = log(exp(L_a) +
# exp(L_b))`, and the new average weighs each block's by `exp(L_b - L)`. One query, four
# keys, in two blocks of two:

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
# FlashAttention does this inside one GPU; ring attention does it across GPUs.
#
# ## 3. Ring attention, step by step
#
# Each of the <span data-glue="ranks">4</span> ranks holds
# <span data-glue="chunk">4</span> of the <span data-glue="seq">16</span> tokens: their
# queries, keys and values. At each step a rank attends its own queries to the key/value
# block it holds, merges the result, and passes the block to the next rank while receiving
# one from the previous rank. After p steps every rank has seen every block. In the picture
# each rank starts with its own block; the colours follow a block round the ring.
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
# ring attention's forward pass? The next section prints it.

# %%
from parlab.exercises import check

check("08.1", ...)

# %% [markdown]
# ## 4. Three ways, run for real
#
# One launch runs three methods on the toy backend, each on a process group named after it,
# and compares each with `scaled_dot_product_attention` over the whole sequence in one
# process: the output and the gradients of Q, K and V. The tokens are cut in the zigzag
# layout of section 5. The methods:
#
# - **ring**: section 3. The backward pass sends the blocks round again, each with the
#   gradients of its keys and values collected so far, which end at their owner;
# - **all-gather** (Llama 3): every rank gathers every key and value, then attends its own
#   queries to all of them; the backward pass reduce-scatters their gradients;
# - **Ulysses** (DeepSpeed): an all-to-all turns "some tokens, all heads" into "all tokens,
#   some heads", each rank computes ordinary attention for its heads, and a second
#   all-to-all turns the output back.
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
# All three agree with one process to rounding. Per rank, with `b` the bytes of one rank's
# K shard (V's is the same) and p ranks:
#
# | method | forward | backward | what each rank holds | limit |
# |---|---|---|---|---|
# | ring | (p-1)·2b | (2p-1)·2b | one extra K,V block in flight | none |
# | all-gather | (p-1)·2b | (p-1)·2b | every K and V of the sequence | memory for the whole K, V |
# | Ulysses | (p-1)/p·(2b_q + 2b) | the same | all tokens of H/p heads | p divides the key/value heads |
#
# Here: ring <span data-glue="ring_fwd">3,072</span> B forward and
# <span data-glue="ring_bwd">7,168</span> B backward, all-gather
# <span data-glue="gather_bwd">3,072</span> B backward, Ulysses
# <span data-glue="ulysses_fwd">1,536</span> B each way. Ring and all-gather send about two
# whole sequences' worth of K and V per rank, whatever p is: that grows with the sequence.
# Ulysses sends a fixed share of each rank's own tokens, so its bytes per rank stay constant
# when the sequence and the GPUs grow together. Its limit: each rank needs whole heads, so p
# can be at most the number of key/value heads (<span data-glue="llama_kv">8</span> for
# Llama-3-8B); with grouped-query
# attention that limit is lower than the number of query heads.
#
# ## 5. Balancing a causal mask
#
# Under a causal mask, the contiguous layout gives late ranks far more work. Two fixes
# keep every token's global position (the mask, the rotary position and the loss all use
# it) and change only which tokens a rank holds:
#
# - **zigzag**: cut the sequence into 2p chunks; rank r takes chunk r and chunk 2p-1-r, one
#   early and one late (Llama 3 used two chunks per GPU this way);
# - **striped**: rank r takes tokens r, r+p, r+2p, ...
#
# Work is counted here in unmasked (query, key) pairs, and in the floating-point operations
# PyTorch's `FlopCounterMode` counts in our ring attention's forward pass, both in units of
# one S/p x S/p block. Wall time would not show it: the ranks share a few CPU cores.

# %%
from parlab.experiments import causal_work_chart
from parlab.context_parallel import LAYOUTS

for layout in LAYOUTS:
    mine = positions(seq, 0, CONTEXT_RANKS, layout).tolist()
    print(f"{layout:>10}: rank 0 holds positions {mine}")
show(causal_work_chart())

# %% [markdown]
# Counting a diagonal block as half, the contiguous layout gives rank r `r + 1/2` blocks of
# unmasked pairs: the last rank has `2p - 1` times the first. Zigzag gives every rank the
# same. Our ring attention computes only the rectangle of queries and keys that see each
# other, so under zigzag every step but the first costs half a block and the ranks' FLOPs
# are equal too. Striped balances the pairs but leaves no rectangle to cut: each step
# computes nearly a whole block, half of it masked (a kernel that skips masked entries
# inside a block would recover that).
#
# **Exercise 08.2 (predict first).** On 8 ranks, contiguous layout, a long sequence: how
# many times the first rank's unmasked pairs does the last rank have?

# %%
check("08.2", ...)

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
# One block (d_model 64, 8 heads) on <span data-glue="ranks">4</span> toy ranks, each way,
# against one process:

# %%
from parlab.experiments import run_sequence_parallel

sp = run_sequence_parallel()
for kind, name in (("tp", "tensor parallel"), ("sp", "sequence parallel")):
    print(f"{name:>17}: equal to one process (1e-5): {sp.max_error[kind] < 1e-5}; activations "
          f"kept per rank {sp.saved_bytes[kind][0]:,} B; rank 0 sent {sp.sent[kind]}")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
extra_gather = sum(sp.sent["sp"].values()) - sum(sp.sent["tp"].values())
glue("sp_saved_pct", 100 * (1 - sp.saved_bytes["sp"][0] / sp.saved_bytes["tp"][0]), ".0f")
glue("sp_extra", extra_gather, ",")

# %% [markdown]
# Sequence parallelism keeps <span data-glue="sp_saved_pct">25</span> % less per rank here.
# A test holds the count exactly: with sequence parallelism every one of Korthikanti's terms
# (without dropout, which our GPT does not have) is divided by t, plus the causal mask and
# the LayerNorms' statistics; tensor parallelism alone keeps the LayerNorm regions whole.
# It sends <span data-glue="sp_extra">24,576</span> B more, all in the backward pass: like
# Megatron, each column-parallel layer keeps only its own tokens and all-gathers them again
# to form its weight gradient. The paper's formula for a layer with dropout, per GPU, is
# `sbh(34 + 5as/h)/t` with both methods against `sbh(10 + 24/t + 5as/(ht))` with tensor
# parallelism alone.
#
# ## 7. Explore
#
# The closed forms for Llama-3-8B's attention (<span data-glue="explorer_heads">32</span>
# query heads, <span data-glue="llama_kv">8</span> key/value heads of width
# <span data-glue="explorer_width">128</span>, bf16, one layer), for a sequence of up to
# 512K tokens: each rank's bytes per pass for
# each method, the causal imbalance of each layout, and for ring attention its steps.

# %%
from parlab.viz.widgets import context_explorer

context_explorer()

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
from parlab.viz.widgets.context import D_HEAD, HEADS

glue("explorer_heads", HEADS)
glue("explorer_width", D_HEAD)

# %% [markdown]
# ## 8. One more exercise
#
# **Exercise 08.3 (predict, then run).** On 2 ranks instead of 4, predict how many bytes
# one rank sends in Ulysses' forward pass. Then run
# `result = compare_methods(("ulysses",), world=2)[0]` and answer with
# `result.sent["forward"][0]`.

# %%
check("08.3", ...)

# %% [markdown]
# ## What's next
#
# Each method here is a function on a process group, so it composes with the others:
# context parallelism inside each tensor-parallel group, Ulysses within a server and ring
# attention across servers (Megatron-Core's `a2a+p2p`), all of it inside data and pipeline
# parallelism. Chapter 01's calculator does not yet take a context-parallel degree; that
# comes with the planner.
