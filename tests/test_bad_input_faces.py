"""Bad input to the subpackages' faces fails up front with the argument, its value and what is
valid (the error sweep after tests/test_bad_input.py): comm, models, pipeline, data_parallel,
hybrid, experiments. Nothing here starts a rank; the run_* cases fail before any would."""
import pytest

from parlab import comm, data_parallel, experiments, hybrid, models, pipeline


# --------------------------------------------------------------------------- comm

def test_allreduce_time_wants_a_linkspec_not_its_name():
    with pytest.raises(TypeError, match="link must be a LinkSpec .*got 'nvlink'"):
        comm.allreduce_time(1e6, 8, link="nvlink")  # was AttributeError: no attribute 'alpha'


def test_bus_bandwidth_refuses_zero_seconds():
    with pytest.raises(ValueError, match="seconds must be a positive number .*got 0"):
        comm.bus_bandwidth("all_reduce", 1e6, 0, 4)  # was ZeroDivisionError


def test_link_type_checks_gpus_per_server():
    with pytest.raises(ValueError, match="gpus_per_server must be an int from 1 to 26.*got 0"):
        comm.link_type(0, 1, 0)  # was ZeroDivisionError


def test_one_collective_checks_its_arguments_before_torch_distributed():
    with pytest.raises(ValueError, match=r"unknown collective 'allgather'; choose one of \["):
        comm.one_collective("allgather", 16)  # was "Default process group has not been ..."
    with pytest.raises(ValueError, match="elements must be a positive integer .*got 0"):
        comm.one_collective("all_gather", 0)


# --------------------------------------------------------------------------- models

def test_build_model_wants_a_torch_dtype():
    with pytest.raises(TypeError, match="dtype must be a torch.dtype .*got 'bf16'"):
        models.build_model(models.TINY, dtype="bf16")  # was torch's to() overload list


def test_block_matmuls_takes_a_name_and_names_an_unknown_one():
    assert models.block_matmuls("tiny") == models.block_matmuls(models.TINY)
    with pytest.raises(ValueError, match="unknown model 'nope'; known: "):
        models.block_matmuls("nope")  # was AttributeError: no attribute 'd_model'


def test_compute_bound_tokens_checks_its_sizes():
    with pytest.raises(ValueError, match="k must be a positive number, got 0"):
        models.compute_bound_tokens(0, 4096)  # was None, as if no token count sufficed


# --------------------------------------------------------------------------- pipeline

def test_stage_gpu_name_refuses_a_negative_rank():
    with pytest.raises(ValueError, match="rank must be a non-negative integer, got -1"):
        pipeline.stage_gpu_name(-1)  # was '@2'


def test_compare_names_an_unknown_model_up_front():
    with pytest.raises(ValueError, match="unknown model 'GPT3'; known: "):
        pipeline.compare(model="GPT3")  # was one error row per schedule, no exception


# --------------------------------------------------------------------------- data_parallel

def test_train_checks_the_batch_split_before_launching():
    with pytest.raises(ValueError, match="8 micro-batches do not split evenly over 3 ranks"):
        data_parallel.train(data_parallel.TrainSpec(), 3)  # was a RankError from every rank


# --------------------------------------------------------------------------- hybrid

def test_plan_names_an_unknown_keyword_and_the_valid_ones():
    with pytest.raises(TypeError, match=r"unknown keyword 'bogus'; the planner's assumptions "
                                        r"are \['global_batch', "):
        hybrid.plan("GPT-3 175B", 1024, bogus=1)  # was Assumptions.__init__() got ...
    with pytest.raises(TypeError, match="unknown keyword 'micro_batches'"):
        hybrid.evaluate("GPT-3 175B", 8, 8, 16, 8, micro_batches=2)


def test_explain_wants_a_layout():
    with pytest.raises(TypeError, match="lay must be a Layout .*got str"):
        hybrid.explain("x")  # was AttributeError: no attribute 'pp'


@pytest.mark.parametrize("kwargs,message", [
    ({"dp": 0}, "dp must be a positive integer, got 0"),  # was blamed on world_size
    ({"microbatches": 0}, "microbatches must be a positive integer, got 0"),
    ({"batch": 3}, "batch=3 does not split into dp=2 x microbatches=2"),  # was a RankError
    ({"pp": 3}, "pp=3 does not divide the 4 layers"),
])
def test_run_3d_checks_before_launching(kwargs, message):
    with pytest.raises(ValueError, match=message):
        hybrid.run_3d(**kwargs)


@pytest.mark.parametrize("kwargs,message", [
    ({"stage": 4}, r"stage must be one of \[0, 1, 2, 3\], got 4"),  # was a RankError
    ({"dp": 0}, "dp must be a positive integer, got 0"),          # was blamed on world_size
    ({"batch": 9}, "batch=9 does not split into dp=2 equal shares"),
])
def test_run_zero_tensor_checks_before_launching(kwargs, message):
    with pytest.raises(ValueError, match=message):
        hybrid.run_zero_tensor(**kwargs)


# --------------------------------------------------------------------------- experiments

def test_draw_collective_checks_ranks_and_elements():
    with pytest.raises(ValueError, match="ranks must be a positive integer .*got 0"):
        experiments.draw_collective(ranks=0)  # was blamed on world_size
    with pytest.raises(ValueError, match="elements must be a positive integer .*got 0"):
        experiments.draw_collective(elements=0)  # was a pandas KeyError


def test_chapter_one_steps_check_the_batch():
    with pytest.raises(ValueError, match="batch must be a positive integer, got 0"):
        experiments.book_step(batch=0)  # was a silent step on an empty batch
    with pytest.raises(ValueError, match="batch must be at least 2 with with_peer=True"):
        experiments.book_step(batch=1)
    with pytest.raises(ValueError, match="batch must be a positive integer, got 0"):
        experiments.datasets_and_batch(batch=0)  # was torch's batch_size message


def test_figure_8_2_runs_check_before_launching():
    with pytest.raises(ValueError, match="how must be 'all_gather' or 'all_reduce', got 'allg"):
        experiments.run_figure_8_2(how="allgather")  # was a RankError
    with pytest.raises(ValueError, match="how must be 'all_gather' or 'all_reduce', got 'x'"):
        experiments.book_step_explorer(how="x")  # was an ipywidgets TraitError
    with pytest.raises(ValueError, match=r"ranks must be one of \[1, 2, 4\], got 3"):
        experiments.book_step_explorer(ranks=3)
    with pytest.raises(ValueError, match="steps must be at most 10"):
        experiments.book_step_explorer(steps=11)


def test_small_experiment_helpers_check_their_numbers():
    with pytest.raises(ValueError, match="nbytes must be a positive number .*got -1"):
        experiments.two_gpu_links(-1)  # was a table of negative times
    with pytest.raises(ValueError, match="gpu_bytes must be a positive number .*got 0"):
        experiments.layer_memory(gpu_bytes=0)  # was a silent result
    with pytest.raises(ValueError, match=r"tokens must be .* from 0 to 15 .*got \(99,\)"):
        experiments.qkv_example(tokens=(99,))  # was torch's "index out of range in self"


@pytest.mark.parametrize("kwargs,message", [
    ({"tp": 0}, "tp must be a positive integer, got 0"),           # was ZeroDivisionError
    ({"depths": (0,)}, "pp must be a positive integer .*got 0"),   # was ZeroDivisionError
    ({"depths": (256,)}, r"tp=8 x pp=256 is more than gpus=1024"),  # was ZeroDivisionError
])
def test_depth_table_checks_its_degrees(kwargs, message):
    with pytest.raises(ValueError, match=message):
        experiments.depth_table(**kwargs)
