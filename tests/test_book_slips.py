"""The book's slips that chapters 03 and 04 name, each asserted against an independent reference:
the book's own step lists, closed-form counts, or sizes computed by hand here, never the
package's output fed back into itself."""
import math

import pytest

from parlab.pipeline import (
    Network, execute, one_action_per_slot, schedule, simulate, slot_count, work_percent
)
from parlab.experiments import BOOK_STEPS


# --------------------------------------------------------------------------- chapter 03

@pytest.fixture(scope="module")
def book():
    return simulate(schedule("book", stages=4, microbatches=4))


def _book_text_counts():
    """Actions and busy (GPU, step) slots as the chapter's own step lists give them."""
    actions = sum(len(step.compute) for step in BOOK_STEPS)
    busy = sum(len({entry.split()[0] for entry in step.compute}) for step in BOOK_STEPS)
    return actions, busy


def test_the_books_schedule_packs_32_actions_into_28_busy_slots(book):
    actions, busy = _book_text_counts()
    p, m = 4, 4
    assert actions == 2 * p * m == 32  # a forward and a backward per stage and micro-batch
    assert busy == 28
    count = slot_count(book)
    assert (count.actions, count.busy_slots, count.doubled_slots) == (actions, busy, 4)
    assert count.slots == p * 11 and count.steps == 11


def test_gpipe_and_1f1b_use_one_busy_slot_per_action():
    for name in ("gpipe", "1f1b"):
        count = slot_count(simulate(schedule(name, 4, 4)))
        assert count.actions == count.busy_slots == 32 and count.doubled_slots == 0


def test_active_percentages_hide_the_doubled_work(book):
    # per step, actions as a share of 4 GPUs, from the chapter's own lists
    expected = [100 * len(step.compute) / 4 for step in BOOK_STEPS]
    assert work_percent(book) == expected
    hidden = [i + 1 for i, (w, a) in enumerate(zip(work_percent(book), book.active_percent))
              if w != a]
    assert hidden == [5, 6, 7]  # B2 doubles in steps 5-7, B1 too in step 6
    assert work_percent(book)[5] == 100 and book.active_percent[5] == 50


@pytest.mark.parametrize("p,m", [(4, 4), (4, 8), (2, 4), (3, 7), (8, 16)])
def test_one_action_per_slot_takes_the_book_as_long_as_gpipe(p, m):
    serial = simulate(one_action_per_slot(schedule("book", p, m)))  # simulate checks it runs
    assert serial.steps == 2 * (m + p - 1)  # GPipe's and 1F1B's length
    assert math.isclose(serial.bubble_fraction, (p - 1) / (m + p - 1))
    count = slot_count(serial)
    assert count.actions == count.busy_slots == 2 * p * m and count.doubled_slots == 0


def test_one_action_per_slot_gives_14_steps_for_the_chapters_example():
    assert simulate(one_action_per_slot(schedule("book", 4, 4))).steps == 14


@pytest.mark.parametrize("name,v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)])
def test_one_action_per_slot_keeps_schedules_without_doubled_steps(name, v):
    sched = schedule(name, 4, 8, v)
    assert one_action_per_slot(sched).pipeline_order == sched.pipeline_order


def test_one_action_per_slot_refuses_what_is_not_a_schedule():
    with pytest.raises(ValueError, match="needs a Schedule"):
        one_action_per_slot({0: ["0F0"]})


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 4, 2), (2, 4, 2), (4, 12, 3), (8, 8, 2)])
def test_interleaving_multiplies_messages_by_pv_minus_1_over_p_minus_1(p, m, v):
    interleaved = len(simulate(schedule("interleaved", p, m, v)).transfers)
    plain = len(simulate(schedule("1f1b", p, m)).transfers)
    assert math.isclose(interleaved / plain, (p * v - 1) / (p - 1))
    assert interleaved / plain > v


def test_interleaving_messages_logged_by_real_ranks():
    p, m, v = 4, 4, 2
    run = execute(schedule("interleaved", p, m, v), Network(widths=(3,) + (4,) * 7 + (2,)),
                  backend="toy")
    assert run.traffic_matches
    messages = len(run.traffic.records)
    assert messages == 2 * m * (p * v - 1)  # every chunk boundary, each way, per micro-batch
    assert messages / (2 * m * (p - 1)) == pytest.approx(7 / 3)


# --------------------------------------------------------------------------- chapter 04

from parlab.experiments import (  # noqa: E402  (the chapter 04 half of this file)
    book_rounding, collective_calls, column_split_input, embedding_wire_bytes,
    ffn_backward_sums, ffn_widths, gradient_shard_bytes, layer_memory, run_attention,
    run_embedding, run_ffn, softmax_and_context, split_table_reasons
)

D, HEADS, BATCH, SEQ = 8, 2, 2, 5  # 5 tokens: no activation has the size of a weight


@pytest.fixture(scope="module")
def attention_runs():
    return {name: run_attention(name, d_model=D, n_heads=HEADS, batch=BATCH, seq=SEQ,
                                backend="toy") for name in ("book", "megatron")}


def test_backward_collectives_carry_activation_gradients_not_weight_shards(attention_runs):
    activation = BATCH * SEQ * D * 4          # X, Q, K and their gradients, fp32
    weight_shard = D * (D // 2) * 4           # W_Q's (or W_O's) half on one of 2 GPUs
    assert activation != weight_shard and activation != D * D * 4
    for name, c in attention_runs.items():
        calls = collective_calls(c.traffic["backward"])
        assert calls and all(call.payload == activation for call in calls), name
        assert sum(call.wire_bytes for call in calls) == c.total_bytes()["backward"]
        shards = gradient_shard_bytes(c)
        assert shards["q_proj.weight"] == shards["out_proj.weight"] == weight_shard
    megatron = collective_calls(attention_runs["megatron"].traffic["backward"])
    assert [c.op for c in megatron] == ["all_reduce"]  # Megatron's f: the input's gradient
    book_ops = [c.op for c in collective_calls(attention_runs["book"].traffic["backward"])]
    assert sorted(book_ops) == ["all_gather", "all_gather", "all_reduce", "all_reduce", "reduce"]


def test_ffn_backward_all_reduces_input_errors_once_per_micro_batch():
    sizes, batch, micro = (4, 6, 4, 2), 4, 2
    rows = ffn_backward_sums(run_ffn(sizes=sizes, tensor=2, batch=batch, micro_batches=micro,
                                     backend="toy"))
    assert [r["layer"] for r in rows] == ["H1", "H2", "Out"]
    for r, n_in, n_out in zip(rows, sizes, sizes[1:]):
        assert r["all_reduces"] == micro  # one per micro-batch, not one per step
        assert r["tensor_bytes"] == [batch // micro * n_in * 4]  # dLoss/d(stage input)
        assert r["weight_shard_bytes"] == n_out // 2 * n_in * 4


def test_one_gpt3_layer_fits_on_a_gpu_with_adam():
    d = 12288
    ffn = 2 * d * 4 * d + 4 * d + d  # fc1 and fc2 with biases
    lm = layer_memory("GPT-3 175B", gpu_bytes=80e9, optimizer="adam", precision="bf16")
    assert lm["ffn_parameters"] == ffn == 1_208_020_992
    assert lm["ffn_state_bytes"] == 16 * ffn  # 2 + 2 + 4 + 8 bytes per parameter
    assert lm["ffn_state_bytes"] / 1e9 == pytest.approx(19.3, abs=0.05)
    assert lm["ffn_fits"] and lm["block_state_bytes"] < 80e9
    assert lm["tp1"]["stages"] > lm["tp8"]["stages"]
    assert lm["tp1"]["bubble"] == pytest.approx((lm["tp1"]["stages"] - 1)
                                                / (8 + lm["tp1"]["stages"] - 1))


def test_605_m_and_173_b_are_not_roundings_of_the_counts():
    d, layers = 12288, 96
    attention = 4 * d * d + 4 * d
    block = attention + (8 * d * d + 5 * d) + 4 * d  # + two LayerNorms
    r = book_rounding()
    assert r["attention"] == attention and round(attention / 1e6) == 604 != 605
    assert r["blocks"] == layers * block and round(layers * block / 1e9) == 174 != 173
    assert round(layers * 1.8, 1) == 172.8 and round(layers * 1.8) == 173
    assert r["blocks_from_rounded"] == pytest.approx(172.8e9)


def test_a_column_split_weight_needs_the_whole_input():
    errors = column_split_input(d_model=8, tokens=4, parts=2)
    assert errors["whole_input"] < 1e-6 and errors["input_share"] > 1e-2
    with pytest.raises(ValueError, match="parts"):
        column_split_input(d_model=8, parts=3)


def test_softmax_gives_weights_and_the_context_is_weights_times_v():
    out = softmax_and_context(d_model=8, n_heads=2, batch=1, seq=4)
    assert out["softmax_shape"] == (1, 2, 4, 4)  # per head: tokens x tokens
    assert out["context_shape"] == (1, 4, 8)     # per token: d_model
    assert out["rows_sum_to_one"] and out["context_equals_layer"]


def test_a_transformer_ffn_has_one_hidden_layer_four_times_wider():
    w = ffn_widths("GPT-3 175B")
    assert w["transformer"] == (12288, 4 * 12288, 12288) and w["book_hidden_layers"] == 2


@pytest.mark.parametrize("n", [2, 3, 4])
def test_embedding_layouts_counted_like_for_like_match_the_ring_closed_forms(n):
    """Both layouts from the same per-rank gradients (each rank its own loss), every
    collective read from the toy log, against ring forms derived by hand: a broadcast is a
    chain of n-1 hops of S; a reduce is a reduce-scatter ((n-1) S) and then n-1 slices of
    S/n to the root; an all-reduce is a reduce-scatter and an all-gather, 2 (n-1) S."""
    runs = {kind: run_embedding(kind, vocab=11, world_size=n, backend="toy")
            for kind in ("broadcast", "vocab")}
    S = 2 * 3 * 4 * 4  # the looked-up vectors: batch 2 x seq 3 x d_model 4, fp32
    for c in runs.values():  # both sum the per-rank gradients: equal to one device
        assert c.max_error < 1e-5
    assert {kind: c.bytes_by_op() for kind, c in runs.items()} == {
        "broadcast": {"forward": {"broadcast": (n - 1) * S},
                      "backward": {"reduce": (n - 1) * S + (n - 1) * S / n}},
        "vocab": {"forward": {"all_reduce": 2 * (n - 1) * S},
                  "backward": {"all_reduce": 2 * (n - 1) * S}}}
    wire = embedding_wire_bytes(S, n)
    for kind, c in runs.items():  # the closed form against the log: embedding fwd, f bwd
        log = c.bytes_by_op()
        assert wire[kind]["embedding"] == sum(log["forward"].values())
        assert wire[kind]["f"] == sum(log["backward"].values())
    # the book's direction, whole and with f counted in the layer (broadcast vs all-reduce)
    assert wire["broadcast"]["total"] < wire["vocab"]["total"]
    assert wire["broadcast"]["embedding"] < wire["vocab"]["embedding"]


def test_embedding_layouts_at_gpt3_size_on_8_gpus():
    S = 2048 * 12288 * 2  # one sequence's vectors in fp16: 50,331,648 B
    wire = embedding_wire_bytes(S, 8)
    assert wire["broadcast"]["total"] == 7 * S + 7 * S + 7 * S // 8 == 748_683_264  # ~0.75 GB
    assert wire["vocab"]["total"] == 4 * 7 * S == 1_409_286_144                     # ~1.4 GB
    assert (wire["broadcast"]["embedding"], wire["vocab"]["embedding"]) == (
        352_321_536, 704_643_072)


def test_megatrons_reasons_to_split_the_table_by_hand():
    r = split_table_reasons("GPT-3 175B", tp=8)
    V, d, T = 50257, 12288, 2048
    block = 12 * d * d + 13 * d                   # 1,812,099,072 parameters
    assert r["table_state_bytes"] == 16 * V * d == 9_880_928_256   # mixed-precision Adam
    assert r["table_state_bytes_split"] == 16 * 6283 * d           # ceil(V / 8) rows
    assert r["block_state_bytes_per_gpu"] == 16 * block // 8 == 3_624_198_144
    assert r["head_forward_flops"] == 2 * T * d * V
    assert r["block_forward_flops_per_gpu"] == 2 * block * T // 8
    assert r["logits_bytes"] == T * V * 4 == 411_705_344
    assert r["gather_logits_wire_bytes"] == 7 * T * V * 4
    assert r["parallel_loss_wire_bytes"] == 3 * 2 * 7 * T * 4 == 344_064


def _forward_then_backward(with_backward):
    import torch
    import torch.distributed as dist
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    out = model(torch.randn(8, 4)[dist.get_rank()::dist.get_world_size()])
    if with_backward:
        out.pow(2).mean().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)


def test_data_parallel_forward_sends_nothing_and_the_sync_sends_the_gradients():
    from parlab.comm import run_with_traffic
    _, forward = run_with_traffic(_forward_then_backward, 2, False)
    _, step = run_with_traffic(_forward_then_backward, 2, True)
    assert len(forward) == 0
    gradient_bytes = 4 * (4 * 8 + 8 + 8 * 2 + 2)  # float32 weights and biases of both layers
    assert step.total_bytes() == 2 * gradient_bytes  # ring on 2 ranks: each sends its gradient


@pytest.mark.parametrize("n", [8, 16])
def test_tree_log2_messages_only_for_the_busiest_rank(n):
    from parlab.comm import one_collective, run_with_traffic
    _, tree = run_with_traffic(one_collective, n, "all_reduce", 4, algorithm="tree")
    sent = tree.per_rank()["messages sent"]
    assert sent.max() == math.log2(n)
    assert (sent == 1).sum() == n // 2  # the leaves: one message each
