"""Bad input to the memory calculator is refused up front, with the argument and what is valid
(issue 18, 1b): estimate, min_gpus, activation_bytes, activations_per_layer and measure."""
import pytest
import torch

from parlab import memory
from parlab.models import TINY, BookMLP

MLP = BookMLP((4, 8, 2))


@pytest.mark.parametrize("max_tp, shown", [(0, "0"), (-8, "-8"), ("8", "'8'"), (2.0, "2.0"),
                                           (True, "True")])
def test_min_gpus_refuses_a_bad_max_tp(max_tp, shown):
    with pytest.raises(ValueError, match=f"max_tp must be a positive integer, got {shown}"):
        memory.min_gpus(TINY, (2, 16), max_tp=max_tp)


@pytest.mark.parametrize("gb", ["80", float("inf"), float("nan"), -1, 0, True, None])
@pytest.mark.parametrize("fn", [memory.estimate, memory.min_gpus, memory.measure])
def test_gpu_memory_gb_must_be_a_positive_finite_number(fn, gb):
    if gb is None:   # None: the gpu's capacity, the default one's here (issue 31)
        result = fn(TINY, (2, 16), gpu_memory_gb=gb)
        assert getattr(result, "breakdown", result).capacity == 80 * 10 ** 9
        return
    with pytest.raises(ValueError, match=r"gpu_memory_gb must be positive: a finite number"):
        fn(TINY, (2, 16), gpu_memory_gb=gb)


def test_a_fractional_gpu_size_is_fine():
    assert memory.estimate(TINY, (2, 16), gpu_memory_gb=0.5).capacity == 500_000_000


@pytest.mark.parametrize("shape", [None, "2,16", 2.0, (), {"batch": 2}, True])
@pytest.mark.parametrize("fn", [memory.estimate, memory.min_gpus, memory.measure])
def test_input_shape_must_be_a_tuple_of_ints(fn, shape):
    with pytest.raises(ValueError, match=r"input_shape must be the global batch as a tuple"):
        fn(TINY, shape)


@pytest.mark.parametrize("shape, message", [((2.0, 16), "batch must be a positive integer"),
                                            ((2, "16"), "seq must be a positive integer"),
                                            ((2,), r"a transformer's input_shape is \(batch, seq\)")])
def test_input_shape_entries_are_checked(shape, message):
    with pytest.raises(ValueError, match=message):
        memory.estimate(TINY, shape)


@pytest.mark.parametrize("value", [0, -2, 1.5, "2", True])
@pytest.mark.parametrize("fn", [memory.estimate, memory.min_gpus])
def test_microbatches_must_be_a_positive_int(fn, value):
    with pytest.raises(ValueError, match=f"microbatches must be a positive integer, got {value!r}"):
        fn(TINY, (2, 16), microbatches=value)


def test_min_gpus_says_when_the_batch_does_not_split_into_micro_batches():
    with pytest.raises(ValueError, match="batch=3 does not split into dp=1 x microbatches=2"):
        memory.min_gpus(TINY, (3, 16), microbatches=2)


@pytest.mark.parametrize("argument", ["dp", "tp", "pp"])
@pytest.mark.parametrize("value", [0, "2", 1.0, None])
def test_split_degrees_must_be_positive_ints(argument, value):
    with pytest.raises(ValueError, match=f"{argument} must be a positive integer"):
        memory.estimate(TINY, (2, 16), **{argument: value})


@pytest.mark.parametrize("kwargs, message", [
    (dict(optimizer=None), r"unknown optimizer None; choose one of \['sgd', 'momentum', 'adam'\]"),
    (dict(optimizer=["adam"]), "unknown optimizer"),
    (dict(precision=None), r"unknown precision None; choose one of \['fp32', 'fp16', 'bf16'\]"),
    (dict(schedule=None), r"unknown schedule None; choose one of \['1f1b', 'gpipe', 'zb-h1', 'zbv',"
         r" 'dualpipev'\]"),
    (dict(schedule=["gpipe"]), "unknown schedule"),
    (dict(model="GPT-5"), "unknown model 'GPT-5'; known:"),
])
def test_names_must_be_known_strings(kwargs, message):
    args = dict(model=TINY, input_shape=(2, 16)) | kwargs
    with pytest.raises(ValueError, match=message):
        memory.estimate(**args)
    with pytest.raises(ValueError, match=message):
        memory.min_gpus(**args)


@pytest.mark.parametrize("kwargs, message", [
    (dict(stage=2), r"stage must be an int in 0..1 \(pp=2\), got 2"),
    (dict(stage=-1), "stage must be an int in 0..1"),
    (dict(stage="0"), r"stage must be an int in 0..1 \(pp=2\), got '0'"),
    (dict(stage=True), "stage must be an int in 0..1"),
    (dict(batch=0), "batch must be a positive integer, got 0"),
    (dict(seq=0), "seq must be a positive integer, got 0"),
    (dict(seq=99), "exceeds tiny's context of 16"),
    (dict(precision="int8"), "unknown precision 'int8'"),
    (dict(tp=3), "tp=3 must divide n_heads=4"),
    (dict(pp=0), "pp must be a positive integer"),
])
def test_activation_bytes_refuses_bad_input(kwargs, message):
    args = dict(model=TINY, batch=2, seq=16, pp=2) | kwargs
    with pytest.raises(ValueError, match=message):
        memory.activation_bytes(**args)


@pytest.mark.parametrize("kwargs, message", [
    (dict(batch=-1), "batch must be a positive integer, got -1"),
    (dict(seq=None), "seq must be a positive integer, got None"),
    (dict(tp="2"), "tp must be a positive integer"),
    (dict(precision="fp64"), "unknown precision 'fp64'"),
])
def test_activations_per_layer_refuses_bad_input(kwargs, message):
    args = dict(model=TINY, batch=2, seq=16) | kwargs
    with pytest.raises(ValueError, match=message):
        memory.activations_per_layer(**args)


def test_an_mlp_ignores_seq_but_not_a_bad_one():
    assert memory.activation_bytes(MLP, 2) == memory.activation_bytes(MLP, 2, seq=1)
    with pytest.raises(ValueError, match="seq must be a positive integer, got 0"):
        memory.activation_bytes(MLP, 2, seq=0)


@pytest.mark.parametrize("kwargs, message", [
    (dict(device="gpu"), r"device must be 'cpu' or a CUDA device such as 'cuda'.*got 'gpu'"),
    (dict(device=None), "device must be 'cpu' or a CUDA device"),
    (dict(device="meta"), "device must be 'cpu' or a CUDA device"),
    (dict(seed="0"), "seed must be an int, got '0'"),
    (dict(seed=1.5), "seed must be an int"),
    (dict(optimizer="lion"), "unknown optimizer 'lion'"),
    (dict(microbatches=0), "microbatches must be a positive integer"),
])
def test_measure_refuses_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        memory.measure(TINY, (2, 16), **kwargs)


def test_measure_on_cuda_without_a_gpu_says_so():
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    with pytest.raises(ValueError, match="no CUDA GPU is available; use device='cpu'"):
        memory.measure(TINY, (2, 16), device="cuda")


def test_tp_problem_refuses_tp_below_one():
    with pytest.raises(ValueError, match="tp must be a positive integer .*got 0"):
        memory.tp_problem(TINY, 0)  # was ZeroDivisionError


def test_stage_ranges_checks_pp():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="pp must be a positive integer .*got 0"):
        memory.stage_ranges(model, 0)  # was one stage, silently
    with pytest.raises(ValueError, match="pp=3 stages for 2 children of the model"):
        memory.stage_ranges(model, 3)  # was empty stages, silently


@pytest.mark.parametrize("points, message", [(0, "points must be a positive integer"),
                                             (1, "points must be at least 2")])
def test_waste_curve_needs_two_points(points, message):
    run = memory.training_cost(8, 700, 30, 0.1)
    with pytest.raises(ValueError, match=message):  # was an empty curve / ZeroDivisionError
        memory.waste_curve(run, 10, points=points)
