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
# # 07 · Beyond the book: mixture of experts and expert parallelism
#
# Many of the largest open models released since 2024 do not run every weight for every
# token. In each block, the one feed-forward layer is replaced by several, the **experts**,
# and a small **router** picks a few of them for each token. The model holds the parameters of all the
# experts but spends the compute of only a few: Mixtral, DeepSeek-V3, Qwen3-MoE and gpt-oss
# are built this way.
#
# Experts bring a parallelism of their own. Put different experts on different GPUs, and
# every token must travel to the GPUs of the experts it chose and its results must travel
# back: two **all-to-all** exchanges per layer (each rank sends a different piece to every
# other rank), where the earlier chapters had all-reduces and point-to-point sends.
#
# In this notebook you will:
#
# 1. write out one MoE layer: the router, the top-k choice, the experts, the weighted sum;
# 2. follow a few tokens through it, and see capacity drop some of them;
# 3. trade dropped tokens against padding with the capacity factor;
# 4. split the experts over <span data-glue="ranks">4</span> real ranks, check the result
#    against one process, and look at every byte of the two all-to-alls;
# 5. even out a lopsided router, Switch's way and DeepSeek-V3's way;
# 6. combine expert parallelism with data parallelism;
# 7. count Mixtral-8x7B, explore the dispatch, and solve four exercises.

# %%
import torch

from parlab.experiments import EXAMPLE, RANKS, TOKENS
from parlab.models import MoE, MoEConfig, route
from parlab.viz import show

print(EXAMPLE)
print(f"{RANKS} ranks, {TOKENS} tokens each")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
from parlab.viz import glue

glue("ranks", RANKS)
glue("tokens", TOKENS)
glue("experts", EXAMPLE.n_experts)
glue("top_k", EXAMPLE.top_k)
glue("d_model", EXAMPLE.d_model)

# %% [markdown]
# ## 1. One MoE layer, written out
#
# The example layer has <span data-glue="experts">4</span> experts, each a SwiGLU MLP like
# a Llama block's (model width <span data-glue="d_model">8</span>). For a token x, it:
#
# 1. **routes**: a linear map scores every expert, `logits = x W_r`, and the token keeps
#    its top <span data-glue="top_k">2</span>;
# 2. **keeps what fits**: each (token, chosen expert) pair is an **assignment**, two per
#    token here; each expert takes at most `capacity` assignments (section 2);
# 3. **computes and combines**: `y = Σ_j gate_j · expert_j(x)` over the kept choices.
#
# The routers you meet in published models differ only in step 1. On the same four logits:

# %%
logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
for router, k in (("switch", 1), ("topk", 2), ("deepseek", 2)):
    r = route(logits, k, router)
    print(f"{router:>8}: experts {r.experts[0].tolist()}  gates "
          f"{[round(g, 3) for g in r.gates[0].tolist()]}")

# %% [markdown]
# - **Switch** (`"switch"`) keeps one expert and scales its output by that expert's softmax
#   probability, so the gate is below 1.
# - **GShard, Mixtral, Qwen3** (`"topk"`) keep the top k and rescale their probabilities to
#   sum to 1.
# - **DeepSeek-V3** (`"deepseek"`) scores each expert with a sigmoid instead of a softmax,
#   then normalizes over the chosen. It also adds a per-expert bias, but only when choosing
#   (section 5).
#
# ## 2. A few tokens through the layer
#
# Capacity is counted over each rank's own tokens: `capacity = ceil(k × T × factor / E)`,
# here with T = <span data-glue="tokens">8</span> tokens, k =
# <span data-glue="top_k">2</span>, E = <span data-glue="experts">4</span>. The factor is 1.0
# in the example: each expert may take an even share of the assignments, no more.
#
# **Exercise 07.1 (predict first).** With a capacity factor of 1.25 instead, how many
# assignments could one expert take from one rank?

# %%
from parlab.exercises import check

check("07.1", ...)

# %% [markdown]
# One rank's <span data-glue="tokens">8</span> tokens, routed. First choices are served
# before second choices, then in token order, so a token can lose its first choice and keep
# its second:

# %%
from parlab.experiments import routing_table
from parlab.models import expert_capacity

print("capacity per expert and rank:",
      expert_capacity(TOKENS, EXAMPLE.n_experts, EXAMPLE.top_k, EXAMPLE.capacity_factor))
table = routing_table()
print(table.to_string(index=False))
print("dropped assignments:", int((~table[["kept 1", "kept 2"]]).sum().sum()))

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
lost_first = table[~table["kept 1"]]
glue("lost_first_token", int(lost_first.token.iloc[0]))
glue("lost_first_expert", int(lost_first["choice 1"].iloc[0]))
glue("capacity", expert_capacity(TOKENS, EXAMPLE.n_experts, EXAMPLE.top_k,
                                 EXAMPLE.capacity_factor))

# %% [markdown]
# Token <span data-glue="lost_first_token">7</span> chose expert
# <span data-glue="lost_first_expert">2</span> first, but <span data-glue="capacity">4</span>
# earlier first choices had filled it. A dropped assignment contributes nothing to the token's output. In a real
# model the residual connection around the layer still carries the token forward.
#
# ## 3. The capacity factor: dropped tokens or padded buffers
#
# A larger capacity drops fewer assignments. But some dispatch layouts (GShard, Switch) send
# every expert a buffer of exactly `capacity` rows, so the unused rows travel and are
# computed on as padding. Over all <span data-glue="ranks">4</span> ranks, for an even router
# and for a skewed one (expert 0's router row raised and expert 3's sunk, so that on these
# tokens it picks only experts 0 and 2):

# %%
from parlab.experiments import capacity_sweep
from parlab.viz.plots import capacity_figure

even_sweep, skewed_sweep = capacity_sweep(), capacity_sweep(skewed=True)
print(even_sweep.to_string(index=False))
print(skewed_sweep.to_string(index=False))
show(capacity_figure(even_sweep, skewed_sweep))

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
by_factor = even_sweep.set_index("capacity factor")
glue("drop_1", 100 * by_factor.loc[1.0, "dropped"], ".1f")
glue("drop_15", 100 * by_factor.loc[1.5, "dropped"], ".1f")
glue("pad_15", 100 * by_factor.loc[1.5, "padding"], ".1f")
skewed_by_factor = skewed_sweep.set_index("capacity factor")
glue("skew_drop_1", 100 * skewed_by_factor.loc[1.0, "dropped"], ".0f")
glue("skew_drop_15", 100 * skewed_by_factor.loc[1.5, "dropped"], ".0f")
glue("skew_pad_2", 100 * skewed_by_factor.loc[2.0, "padding"], ".0f")
glue("skew_no_drop", skewed_sweep[skewed_sweep.dropped == 0]["capacity factor"].min())

# %% [markdown]
# With the even router, a factor of 1.0 drops <span data-glue="drop_1">10.9</span> % of the
# assignments and 1.5 drops <span data-glue="drop_15">1.6</span> %. At 1.5,
# <span data-glue="pad_15">34.4</span> % of the fixed buffers' rows are padding. The
# skewed router drops <span data-glue="skew_drop_1">50</span> % at 1.0 and
# <span data-glue="skew_drop_15">25</span> %
# at 1.5, and nothing only from <span data-glue="skew_no_drop">2.0</span>, where
# <span data-glue="skew_pad_2">50</span> % of the buffer rows travel empty: with half the
# experts unused, capacity can trade drops for padding but cannot remove both. Section 5
# fixes the router instead.
#
# ## 4. Experts on real ranks
#
# Now the experts are split: rank r holds expert r. Each rank routes its own
# <span data-glue="tokens">8</span> tokens, sends every kept assignment to the expert's rank
# (**dispatch**, one all-to-all, after a small one of counts so that each rank knows how many
# rows to expect; the fixed-capacity layout needs no counts), runs its expert on what
# arrives, and sends the outputs back (**combine**, a second all-to-all). The backward pass runs both exchanges again, in
# reverse. `run_expert_layer` does one forward and backward pass on the logging toy backend
# and compares the output, the input gradient and every parameter gradient with one process
# running the whole layer.
#
# **Exercise 07.2 (predict first).** If the load is even, how many bytes does one rank send
# in one dispatch (fp32, so 4 bytes per value)?

# %%
check("07.2", ...)

# %%
from parlab.experiments import run_expert_layer
from parlab.viz.plots import dispatch_matrix_figure

even = run_expert_layer()
skewed = run_expert_layer(skewed=True)
for result in (even, skewed):
    print(f"skewed={result.skewed}: equal to one process (to 1e-6): {result.max_error < 1e-6}; "
          f"load per expert {result.load}; dropped {result.dropped}")
show(dispatch_matrix_figure(even, skewed))

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
sent = [sum(row) - row[s] for s, row in enumerate(even.matrix)]
glue("closed_form", even.closed_form, ".0f")
glue("sent_min", min(sent))
glue("sent_max", max(sent))
glue("skew_idle", sum(1 for load in skewed.load if load == 0))

# %% [markdown]
# Each cell of the matrix is the toy backend's log of one message. With the even router, each
# rank sent <span data-glue="sent_min">288</span> to <span data-glue="sent_max">352</span>
# bytes. The closed form for a perfectly even load, `k·T·d·4·(n−1)/n`, is
# <span data-glue="closed_form">384</span>. The exact counts follow from the routing, and
# `routed_bytes` computes them from each rank's choices. With the skewed router,
# <span data-glue="skew_idle">2</span> experts get no tokens, so their ranks receive
# nothing: the all-to-all carries splits of zero rows. The fixed-capacity layout sends every
# rank the same buffer whatever the routing, padding included:

# %%
padded = run_expert_layer(skewed=True, layout="capacity")
padded_sent = [sum(row) - row[s] for s, row in enumerate(padded.matrix)]
print("skewed router, fixed-capacity buffers: bytes each rank sends", padded_sent)
print("equal to one process (to 1e-6):", padded.max_error < 1e-6)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
skew_sent = [sum(row) - row[s] for s, row in enumerate(skewed.matrix)]
glue("padded_sent", padded_sent[0])
glue("skew_sent_min", min(skew_sent))
glue("skew_sent_max", max(skew_sent))

# %% [markdown]
# Every rank sends <span data-glue="padded_sent">384</span> bytes, where exact splits sent
# <span data-glue="skew_sent_min">128</span> to <span data-glue="skew_sent_max">256</span>:
# the buffers cost the same for any routing, and no count exchange is needed first.
#
# The count assumes the naive dispatch: a token travels once per chosen expert, even when
# both its experts live on the same rank. Sending it once per destination rank saves the
# duplicates. DeepSeek-V3 goes further and sends each token to at most four nodes. And if
# the experts were split the other way, each expert's matrices cut over the ranks as in
# chapter 04, no token would move, but every layer would all-reduce its whole output:

# %%
from parlab.expert_parallel import routed_bytes, tensor_parallel_expert_bytes

# 2 ranks: experts 0-1 on rank 0, 2-3 on rank 1; tokens 0 and 1 each chose two of one rank
twice = torch.tensor([[2, 3], [0, 1], [2, 0]])
ones = torch.ones_like(twice, dtype=torch.bool)
print("naive, bytes to each rank:        ", routed_bytes(twice, ones, 4, 2, 8))
print("once per rank, bytes to each rank:", routed_bytes(twice, ones, 4, 2, 8, once_per_rank=True))
# the same 4 GPUs and the same 32 tokens: expert-parallel ranks each route their own 8;
# tensor-parallel ranks all work on all 32, each with a quarter of every expert
tp = tensor_parallel_expert_bytes(RANKS * TOKENS, EXAMPLE.d_model, RANKS)  # one all-reduce
for step in ("forward", "backward"):
    print(f"{step:>8}, bytes per rank: expert-parallel {max(even.sent[step])} (measured, "
          f"busiest rank), tensor-parallel experts {tp:.0f}")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
step_sent = [f + b for f, b in zip(even.sent["forward"], even.sent["backward"])]
glue("ep_over_tp", max(step_sent) / (2 * tp), ".2g")

# %% [markdown]
# (The byte lists count the entry of the rank itself too, which stays home.) Every
# collective of the layer is counted on both sides. Expert parallelism's forward pass is the
# all-to-all of counts, the dispatch and the combine; its backward pass runs dispatch and
# combine again, reversed (the toy log measures all of it). Tensor-parallel experts (each
# expert's gate and up projections split by columns, its down projection by rows, as in
# chapter 04) all-reduce the layer's output in the forward pass and the gradient of its
# input in the backward pass, one ring all-reduce of every token's d floats each. Over a
# training step, for the same work on the same GPUs, the busiest expert-parallel rank sends
# <span data-glue="ep_over_tp">0.45</span> times the bytes of a tensor-parallel one. Per
# rank and per token of its own, in each pass, dispatch and combine send `2k·d·(n−1)/n`
# values and the tensor-parallel all-reduce `2(n−1)·d`: a ratio of k/n for an even load
# without drops (here the load is uneven, some assignments were dropped, and the counts add
# a few bytes), so
# expert parallelism moves less whenever a token picks fewer experts than there are ranks
# (with fixed-capacity buffers, when the capacity factor times k is below n). If the layers
# around the experts are data parallel, the tensor-parallel experts need an all-gather and
# a reduce-scatter instead of the all-reduce, the same bytes. Tensor parallelism also cuts
# already narrow expert matrices into thinner ones, which GPUs run less efficiently. So
# training frameworks usually split the experts whole and keep the all-to-all inside a node
# where they can (inference engines often shard experts tensor-parallel instead).
#
# ## 5. Evening out the load
#
# A skewed router overloads the ranks of the experts it prefers and leaves the ranks of the
# others idle (section 4's skewed matrix). Two fixes are common:
#
# - **Switch's auxiliary loss** adds `α · N · Σ_i f_i · P_i` to the training loss. Here f_i
#   is the share of assignments that went to expert i and P_i the router's mean probability
#   for it. The loss is smallest when both are even. Its gradient pushes the router away
#   from overloaded experts.
# - **DeepSeek-V3's bias** balances without an auxiliary loss (V3 keeps only a very small
#   one per sequence). After each step, each expert's bias goes up by γ if the expert was
#   underloaded and down by γ if overloaded. The bias only steers the choice; the gates
#   still come from the unbiased scores (V3 then scales them by a constant, left out here).
#
# On several ranks, counting f_i, P_i and the load over every rank's tokens, with one
# all-reduce (`load_balancing_loss(..., group=...)`, `update_router_bias(..., group=...)`),
# makes them equal to one process's (the tests check it; Switch itself counted per device).
# A router leaning towards expert 0 (its row raised a little), trained on a small task for
# <span data-glue="balance_steps">30</span> steps:

# %%
from parlab.experiments import balancing_runs
from parlab.viz.plots import balance_figure

balance = balancing_runs()
print(balance.iloc[[0, 10, 20, 29]].to_string(index=False))
show(balance_figure(balance))

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
last = balance.iloc[-1]
glue("balance_steps", len(balance))
glue("ratio_none", last["no balancing"], ".2f")
glue("ratio_aux", last["auxiliary loss"], ".2f")
glue("ratio_bias", last["bias update"], ".2f")

# %% [markdown]
# Left alone, the busiest expert keeps <span data-glue="ratio_none">2.00</span> times the
# mean load, the most top-<span data-glue="top_k">2</span> of
# <span data-glue="experts">4</span> allows (N/k: expert 0 is in every token's choices).
# The auxiliary loss brings it to <span data-glue="ratio_aux">1.03</span> and the bias rule
# to <span data-glue="ratio_bias">1.16</span>. Both strengths are set so that
# <span data-glue="balance_steps">30</span> steps show an effect: α = 1 where the Switch
# paper uses 0.01, γ = 0.01 where DeepSeek-V3 uses 0.001, over many more steps. The gap
# between the two lines reflects these settings, not a ranking of the methods.
#
# ## 6. Expert parallelism inside data parallelism
#
# In a real job the experts are not split over every GPU. The data-parallel ranks are cut
# into groups of `ep` ranks, each group splits the experts, and each expert has one copy
# per group. With 4 data-parallel ranks and ep = 2, the pairs {0, 1} and {2, 3} each hold
# all the experts between them, and each expert has two copies (on {0, 2} or on {1, 3}).
# The dense weights average their gradients over all four ranks. An expert's copies sum
# theirs and then divide by four as well, because each copy's gradient already covers the
# tokens of its whole pair. `run_expert_data` builds this from
# the two strategies' own functions: data parallelism's bucketed all-reduce, each on its
# process group, and `apply_expert_parallel`.

# %%
from parlab.hybrid import run_expert_data

composed = run_expert_data(dp=4, ep=2)
print("equal to one process after 3 SGD steps (to 1e-6):", composed.max_error < 1e-6)
print("assignments dropped over the 3 steps:", composed.dropped)
print("traffic by (collective, group):",
      sorted({(t.op, t.group) for t in composed.traffic.records}))

# %% [markdown]
# ## 7. At scale: Mixtral-8x7B
#
# `from_hf_config` reads Mixtral's published `config.json`
# (`parlab.models.HF_PRESETS["Mixtral-8x7B"]`): <span data-glue="mx_layers">32</span>
# blocks, each with <span data-glue="mx_experts">8</span> experts
# <span data-glue="mx_width">14,336</span> wide, of which a token uses
# <span data-glue="mx_k">2</span>.
#
# **Exercise 07.3 (predict first).** Mixtral-8x7B has 46.70 billion parameters. Each
# expert holds 3 × 4096 × 14336 weights (gate, up and down). How many billion parameters
# does one token use?

# %%
check("07.3", ...)

# %%
from parlab.models import count_parameters, get_config

mixtral = get_config("Mixtral-8x7B")
counts = count_parameters(mixtral)
print(f"total  {counts['total']:,}")
print(f"active {counts['active']:,} per token")
held_gb = {}
for ep in (1, 2, 4, 8):   # the routed experts divided over ep GPUs, everything else on each
    held = counts["total"] - counts["routed_experts"] * (1 - 1 / ep)
    held_gb[ep] = 2 * held / 1e9
    print(f"ep = {ep}: {held / 1e9:5.2f} B parameters per GPU, {held_gb[ep]:6.1f} GB in bf16")

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("mixtral_total", counts["total"] / 1e9, ".2f")
glue("mixtral_active", counts["active"] / 1e9, ".2f")
glue("mx_layers", mixtral.n_layers)
glue("mx_experts", mixtral.n_experts)
glue("mx_width", mixtral.d_ff, ",")
glue("mx_k", mixtral.experts_per_token)
glue("gb_ep1", held_gb[1], ".1f")
glue("gb_ep2", held_gb[2], ".1f")
glue("gb_ep8", held_gb[8], ".1f")

# %% [markdown]
# The same totals as Mistral's model card: <span data-glue="mixtral_total">46.70</span> B
# parameters, <span data-glue="mixtral_active">12.88</span> B of them used per token. In
# bf16 the weights alone take <span data-glue="gb_ep1">93.4</span> GB, more than an 80 GB
# GPU holds. Split by expert over two GPUs they take <span data-glue="gb_ep2">48.3</span> GB
# each, over eight <span data-glue="gb_ep8">14.5</span> GB, before gradients, optimizer
# state and activations (chapter 01).
#
# Two more published shapes, counted from their `config.json` the same way. Qwen3-30B-A3B
# has narrow experts (128 of them, 8 per token) and heads wider than d_model / heads.
# DeepSeek-V3 has 256 routed experts and a shared one in 58 of its 61 blocks, and a
# low-rank attention of its own (multi-head latent attention), counted here but not built:

# %%
print(f"{'model':>14} {'total B':>8} {'active B':>9}   bf16 weights per GPU, GB, at ep =")
print(f"{'':>14} {'':>8} {'':>9}   {'1':>7} {'8':>7} {'64':>7}")
big = {}
for name in ("Mixtral-8x7B", "Qwen3-30B-A3B", "DeepSeek-V3"):
    c = count_parameters(name)
    n_experts = get_config(name).n_experts
    per_gpu = [2 * (c["total"] - c["routed_experts"] * (1 - 1 / ep)) / 1e9 if ep <= n_experts
               else float("nan") for ep in (1, 8, 64)]
    big[name] = (c, per_gpu)
    print(f"{name:>14} {c['total'] / 1e9:8.2f} {c['active'] / 1e9:9.2f}   " +
          " ".join(f"{gb:7.1f}" for gb in per_gpu))

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["remove-cell"]
glue("ds_total", big["DeepSeek-V3"][0]["total"] / 1e9, ".0f")
glue("ds_active", big["DeepSeek-V3"][0]["active"] / 1e9, ".1f")
glue("ds_gb1", big["DeepSeek-V3"][1][0], ",.0f")
glue("ds_gb64", big["DeepSeek-V3"][1][2], ".1f")

# %% [markdown]
# DeepSeek-V3's <span data-glue="ds_total">671</span> B parameters (the technical report's
# number, without its multi-token-prediction module) take
# <span data-glue="ds_gb1">1,342</span> GB in bf16, and a token uses
# <span data-glue="ds_active">37.6</span> B of them. Its report trains with the experts
# split 64 ways across 8 nodes: each GPU then holds <span data-glue="ds_gb64">54.7</span> GB
# of weights, most of them the dense parts that every GPU keeps. Mixtral has 8 experts a
# layer, so it cannot be split 64 ways: the table shows nan there.
#
# ## 8. Explore
#
# The dispatch of section 4, routed in this process for any number of experts, top-k,
# capacity factor (0 keeps every token), ranks and router skew: what was dropped, how much
# a fixed-capacity buffer would pad, and who sends whom how many bytes. At its defaults it
# repeats section 4's even run; a skew above 0 draws positive tokens and raises expert 0's
# router row by that much.

# %%
from parlab.viz.widgets import expert_explorer

expert_explorer()

# %% [markdown]
# ## 9. One more exercise
#
# **Exercise 07.4 (predict, then run).** On 2 ranks (each holding two experts), predict
# with the closed form how many bytes rank 0 sends in one dispatch. Then run
# `result = run_expert_layer(ranks=2)` and answer with what rank 0 really sent,
# `sum(result.matrix[0])`. Why do the two differ?

# %%
check("07.4", ...)

# %% [markdown]
# ## What's next
#
# Expert parallelism composes with everything before it: tensor parallelism inside each
# expert, pipeline stages of MoE blocks, ZeRO over the dense weights. Each is its own
# function on its own process group, as section 6 combined two of them.
