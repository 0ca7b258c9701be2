"""Bad input gets a clear error up front (issue 18, section 1b).

Every public function checks its arguments before doing any work (and, for the runs,
before any rank starts): a ValueError (TypeError for a wrong type) whose message names
the argument, its value and what is valid; never a silent wrong result, a raw
ZeroDivisionError / IndexError / KeyError, or a message that blames another argument.
Grouped by subpackage: hybrid, tensor_parallel, pipeline. Nothing here launches a rank.
"""
import re

import pytest
import torch

from parlab.hybrid import bubble_fraction, cluster, evaluate, place, plan, table
from parlab.pipeline import Network, compare, execute, from_order, schedule, torch_pipelining
from parlab.hybrid import pipeline_data_parallel
from parlab.tensor_parallel import (
    SelfAttention, VocabParallelEmbedding, balanced_ranges, check_degree, counting, divisors,
    even_ranges, ffn_bytes, layout, merge, shard_spec
)
from parlab.experiments import run_attention, run_embedding, run_ffn, run_layer_strategy, run_mlp

GPT3 = "GPT-3 175B"


# --------------------------------------------------------------------------- hybrid

@pytest.mark.parametrize("pp,m,message", [
    (0, 0, "pp must be a positive integer, got 0"),          # was 1.0
    (-1, 1, "pp must be a positive integer, got -1"),        # was 2.0
    (1, 0, "microbatches must be a positive integer, got 0"),  # was ZeroDivisionError
    (True, 4, "pp must be a positive integer, got True"),
    (4, 2.5, r"microbatches must be a positive integer, got 2\.5"),
])
def test_bubble_fraction_rejects_counts_below_one(pp, m, message):
    with pytest.raises(ValueError, match=message):
        bubble_fraction(pp, m)


def test_bubble_fraction_unchanged_for_valid_input():
    assert bubble_fraction(4, 4) == 3 / 7 and bubble_fraction(1, 1) == 0.0


@pytest.mark.parametrize("kwargs,error,message", [
    ({"seq": 0}, ValueError, "seq must be a positive integer, got 0"),
    ({"seq": -2048}, ValueError, "seq must be a positive integer"),
    ({"microbatches": 8}, TypeError, r"microbatches must be a tuple .*got 8; write \(8,\)"),
    ({"microbatches": ()}, ValueError, r"microbatches must hold one or more positive integers"),
    ({"microbatches": (4, 0)}, ValueError, r"microbatches must hold .*got \(4, 0\)"),
    ({"gpus_per_server": 0}, ValueError, "gpus_per_server must be a positive integer, got 0"),
    ({"nic_gbps": 0}, ValueError,
     r"nic_gbps must be a positive number \(a NIC's speed in Gb/s\), got 0"),
    ({"precision": "fp8"}, ValueError, r"unknown precision 'fp8'; choose one of \['fp32'"),
    ({"optimizer": "lion"}, ValueError, "unknown optimizer 'lion'; choose one of"),
])
def test_plan_checks_its_keywords_before_searching(kwargs, error, message):
    with pytest.raises(error, match=message):
        plan(GPT3, 1024, **kwargs)


def test_plan_rejects_a_gpu_count_below_one():
    with pytest.raises(ValueError, match="gpus must be a positive integer, got 0"):
        plan(GPT3, 0)


def test_table_top_must_be_positive():
    with pytest.raises(ValueError, match="top must be a positive integer, got 0"):
        table([], top=0)
    assert table([]) == "(no layout fits)"  # an empty list of layouts still says so


@pytest.mark.parametrize("args,name", [((0, 8, 8, 4), "dp"), ((8, 0, 8, 4), "tp"),
                                       ((8, 8, -1, 4), "pp"), ((8, 8, 8, 0), "microbatches")])
def test_evaluate_blames_the_bad_degree_not_gpus(args, name):
    with pytest.raises(ValueError, match=f"^{name} must be a positive integer"):
        evaluate(GPT3, *args)


def test_placement_checks_gpus_per_server():
    with pytest.raises(ValueError, match="gpus_per_server must be a positive integer, got 0"):
        cluster(8, 0)
    with pytest.raises(ValueError, match="gpus_per_server must be a positive integer, got 0"):
        place(1, 1, 1, 0)
    with pytest.raises(ValueError, match="gpus must be a positive integer, got -8"):
        cluster(-8)


# --------------------------------------------------------------------------- tensor_parallel

@pytest.mark.parametrize("shape", [(8.7, 4), (8, -4), (0, 4), (), (True, 4)])
def test_shard_spec_rejects_shapes_that_are_not_positive_integers(shape):
    with pytest.raises(ValueError, match="shape must be one or more positive integers"):
        shard_spec("W", shape, "rows", 2)


@pytest.mark.parametrize("parts", [0, -8, 2.0, True])
def test_shard_spec_rejects_bad_degrees_by_name(parts):
    with pytest.raises(ValueError, match="parts must be a positive integer"):
        shard_spec("W", (8, 4), "rows", parts)


def test_shard_spec_checks_n_heads_and_dim():
    with pytest.raises(ValueError, match="n_heads must be a positive integer, got -2"):
        shard_spec("W", (8, 4), "heads", 2, n_heads=-2)
    with pytest.raises(TypeError, match="dim must be an integer, got 1.0"):
        shard_spec("W", (8, 4), "rows", 2, dim=1.0)


def test_divisors_and_ranges_reject_counts_below_one():
    with pytest.raises(ValueError, match="n must be a positive integer, got -4"):
        divisors(-4)
    with pytest.raises(ValueError, match="n must be a positive integer, got 0"):
        divisors(0)
    with pytest.raises(ValueError, match="the number of heads must be a positive integer, got -8"):
        check_degree(2, -8, "heads")
    with pytest.raises(ValueError, match="world_size must be a positive integer, got 0"):
        check_degree(0, 8, "heads", "world_size")
    with pytest.raises(ValueError, match="the number of rows must be a positive integer, got 0"):
        even_ranges(0, 2)
    with pytest.raises(ValueError, match="the number of token ids must be a positive integer"):
        balanced_ranges(-3, 2)
    assert divisors(1) == [1] and balanced_ranges(5, 2) == [(0, 3), (3, 5)]


def test_merge_of_nothing_is_a_clear_error():
    with pytest.raises(ValueError, match="pieces and specs are empty"):
        merge([], [])


def test_vocab_parallel_embedding_raises_index_error_like_nn_embedding():
    table = torch.nn.Embedding(10, 4)
    spec = shard_spec("E", (10, 4), "vocab", 2)[0]
    layer = VocabParallelEmbedding(spec.take(table.weight.data), spec)
    for bad in (10, -1, 99):  # 10 and 99: owned by no rank; -1: never valid
        with pytest.raises(IndexError, match=f"token id {bad} is out of range for a "
                                             f"vocabulary of 10 ids"):
            layer(torch.tensor([[0, 3], [bad, 9]]))
    with pytest.raises(IndexError):
        table(torch.tensor([10]))  # what nn.Embedding does


def test_ffn_bytes_refuses_the_splits_layout_refuses():
    for kwargs in ({"tensor": 4}, {"tensor": 6, "sizes": (4, 6, 4, 2)}, {"tensor": 0}):
        sizes = kwargs.pop("sizes", (4, 6, 4, 2))
        with pytest.raises(ValueError) as from_layout:
            layout(sizes, **kwargs)
        with pytest.raises(ValueError, match=re.escape(str(from_layout.value))):
            ffn_bytes(sizes, **kwargs)
    with pytest.raises(ValueError, match="tensor must be a positive integer, got 0"):
        ffn_bytes((4, 6, 4, 2), tensor=0)
    with pytest.raises(ValueError, match="batch must be a positive integer, got 0"):
        ffn_bytes((4, 6, 4, 2), batch=0)
    assert ffn_bytes((4, 6, 4, 2))["forward"]["rail"] == 2 * 4 * (6 + 4) * 4


def test_counting_names_bad_precisions_and_sizes():
    with pytest.raises(ValueError, match=r"unknown precision 'fp8'; choose one of \['fp32'"):
        counting.embedding_table(precision="fp8")
    with pytest.raises(ValueError, match="seq must be a positive integer, got 0"):
        counting.embedding_table(seq=0)
    with pytest.raises(ValueError, match="grad_sync must be 'all_reduce' or 'reduce_scatter'"):
        counting.attention_bytes("book", 1, 4, 8, grad_sync="all_gather")
    with pytest.raises(ValueError, match="c_out must be a positive integer, got -1"):
        counting.strategy_bytes("data", 4, 6, -1)


@pytest.mark.parametrize("args,message", [
    ((8, 0), "n_heads must be a positive integer, got 0"),
    ((0, 2), "d_model must be a positive integer, got 0"),
    ((8, 3), "n_heads=3 does not divide d_model=8"),
])
def test_self_attention_checks_its_sizes_when_built(args, message):
    with pytest.raises(ValueError, match=message):
        SelfAttention(*args)


@pytest.mark.parametrize("kwargs,message", [
    ({"n_heads": 0}, "n_heads must be a positive integer, got 0"),
    ({"batch": 0}, "batch must be a positive integer, got 0"),
    ({"seq": 0}, "seq must be a positive integer, got 0"),
    ({"d_model": -8}, "d_model must be a positive integer, got -8"),
    ({"world_size": 0}, "world_size must be a positive integer, got 0"),
    ({"grad_sync": "nope"}, "grad_sync must be 'all_reduce' or 'reduce_scatter'"),
])
def test_run_attention_checks_before_launching(kwargs, message):
    with pytest.raises(ValueError, match=message):  # a ValueError, not a RankError
        run_attention("book", **kwargs)


@pytest.mark.parametrize("kwargs,message", [
    ({"micro_batches": 0}, "micro_batches must be a positive integer, got 0"),
    ({"batch": 0}, "batch must be a positive integer, got 0"),
    ({"batch": 3}, "batch=3 does not split into micro_batches=2"),
    ({"tensor": 0}, "tensor must be a positive integer, got 0"),
    ({"activation": "swish"}, "unknown activation 'swish'"),
    ({"sizes": ()}, "sizes must be positive ints"),
])
def test_run_ffn_checks_before_launching(kwargs, message):
    with pytest.raises(ValueError, match=message):
        run_ffn(**kwargs)


def test_layer_runs_check_before_launching():
    with pytest.raises(ValueError, match="world_size must be a positive integer, got 0"):
        run_mlp(world_size=0)
    with pytest.raises(ValueError, match="seq must be a positive integer, got 0"):
        run_mlp(seq=0)
    with pytest.raises(ValueError, match="vocab must be a positive integer, got 0"):
        run_embedding("vocab", vocab=0)
    with pytest.raises(ValueError, match="world_size must be a positive integer, got -1"):
        run_embedding("broadcast", world_size=-1)
    with pytest.raises(ValueError, match="c_in must be a positive integer, got 0"):
        run_layer_strategy("reduce_output", c_in=0)


# --------------------------------------------------------------------------- pipeline

def test_from_order_says_what_the_dict_must_hold():
    with pytest.raises(ValueError, match=r"one row per rank.*got an empty dict"):
        from_order({})
    with pytest.raises(TypeError, match="pipeline_order must be a dict .*got list"):
        from_order([["0F0", "0B0"]])
    with pytest.raises(ValueError, match="at least one action"):
        from_order({0: [None, None]})


@pytest.mark.parametrize("chunks", [0, -1, 1.5, True])
def test_chunks_below_one_are_refused_everywhere(chunks):
    message = f"chunks must be a positive integer .*got {chunks!r}"
    with pytest.raises(ValueError, match=message):
        schedule("interleaved", 2, 4, chunks)
    with pytest.raises(ValueError, match=message):
        from_order({0: ["0F0", "0B0"]}, chunks=chunks)
    with pytest.raises(ValueError, match=message):
        compare(4, 8, chunks)  # before: a row with an error, the other rows silent


def test_compare_checks_its_arguments_up_front():
    with pytest.raises(ValueError, match="stages must be a positive integer"):
        compare(0)
    with pytest.raises(ValueError, match="microbatch_size must be a positive integer"):
        compare(microbatch_size=0)
    with pytest.raises(ValueError, match=r"names must be one or more of .*got \('zigzag',\)"):
        compare(names=("zigzag",))
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        compare(precision="fp8")
    assert compare(4, 9, 2)[-1].error  # a schedule that cannot run still gets an error row


def test_executor_inputs_are_checked_before_any_rank_starts():
    with pytest.raises(ValueError, match=r"widths must be .*got \(3, 0, 2\)"):
        Network(widths=(3, 0, 2))
    with pytest.raises(ValueError, match="samples must be a positive integer .*got 0"):
        Network(samples=0)
    with pytest.raises(TypeError, match="net must be a parlab.pipeline.Network, got int"):
        execute(schedule("gpipe", 2, 2), net=3)
    with pytest.raises(ValueError, match="stages must be a positive integer"):
        torch_pipelining(stages=0)
    with pytest.raises(ValueError, match="microbatches must be a positive integer"):
        torch_pipelining(microbatches=0)
    with pytest.raises(ValueError, match="replicas must be a positive integer"):
        pipeline_data_parallel(schedule("gpipe", 2, 2), replicas=0)


# --------------------------------------------------------------------------- memory (issue 27)

def _small_model():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def test_estimate_takes_a_pytorch_loss_module():
    """nn.CrossEntropyLoss() takes (output, target): the estimate makes up the target (class
    indices), so what a reader writes for training works here too."""
    from parlab.memory import estimate
    model = _small_model()
    plain = estimate(model, (32, 8), loss_fn=lambda output, x: output.sum())  # saves nothing
    cross = estimate(model, (32, 8), loss_fn=torch.nn.CrossEntropyLoss())
    mse = estimate(model, (32, 8), loss_fn=torch.nn.MSELoss())
    # by hand, for the fp32 (32, 4) output: cross-entropy saves its log-softmax (32 x 4 x 4 B),
    # the class-index target (32 x 8 B, int64) and nll_loss's total weight (4 B); MSE saves
    # the output and its target (2 x 32 x 4 x 4 B)
    assert cross.total - plain.total == 32 * 4 * 4 + 32 * 8 + 4
    assert mse.total - plain.total == 2 * 32 * 4 * 4


@pytest.mark.parametrize("loss_fn,message", [
    (lambda output: output.sum(),
     r"loss_fn=<function .*> failed on the model's output \(a torch.float32 tensor of shape "
     r"\(32, 4\)\) and inputs \(a torch.float32 tensor of shape \(32, 8\)\): TypeError: .* "
     r"\(loss_fn is called as loss_fn\(output, \*inputs\) and must return a scalar tensor\)"),
    (lambda output, x: output,
     r"loss_fn must return a scalar tensor .* it returned \(a torch.float32 tensor of shape \(32, 4\)\)"),
])
def test_estimate_says_how_loss_fn_is_called(loss_fn, message):
    from parlab.memory import estimate
    with pytest.raises(ValueError, match=message):
        estimate(_small_model(), (32, 8), loss_fn=loss_fn)


def test_gpu_count_in_words_is_singular_for_one():
    from parlab.memory import min_gpus
    text = str(min_gpus(_small_model(), (32, 8)))
    assert text.startswith("at least 1 GPU (") and "1 GPUs" not in text
