"""Data parallelism (chapter 02): every parallel run against one process on the whole batch."""
import pytest
import torch

from parlab import data_parallel as dp
from parlab.launch import RankError, run
from parlab.data_parallel import bucketing_table, gradient_bytes, layer_traffic, measure_traffic
from parlab.experiments import FIGURE_8_2, run_figure_8_2
from parlab.comm import allreduce_bytes_per_rank
from parlab.models import max_difference

BACKENDS = ["gloo", "toy"]
SPEC = dp.TrainSpec(steps=4, momentum=0.9, lr=0.05)
TOL = 1e-6


def assert_states_close(a: dict, b: dict, atol: float = TOL) -> None:
    """Every tensor of two state dicts equal to ``atol`` (0: bit for bit), by name."""
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=atol, rtol=0, msg=name)


def _identical(runs):
    return all(torch.equal(r.state[k], runs[0].state[k]) for r in runs[1:] for k in r.state)


# --------------------------------------------------------------------------- the batch


def test_split_batch_gives_consecutive_micro_batches():
    assert dp.split_batch(16, 8, 2) == [[(0, 2), (2, 4), (4, 6), (6, 8)],
                                        [(8, 10), (10, 12), (12, 14), (14, 16)]]
    assert dp.split_batch(6, 3, 3, uneven=False) == [[(0, 2)], [(2, 4)], [(4, 6)]]


def test_split_batch_rejects_bad_input_clearly():
    with pytest.raises(ValueError, match=r"7 micro-batches do not split evenly over 2 ranks.*"
                                         r"e\.g\. 8.*uneven=True"):
        dp.split_batch(14, 7, 2)
    with pytest.raises(ValueError, match="15 samples does not split into 8"):
        dp.split_batch(15, 8, 2)
    with pytest.raises(ValueError, match="cannot feed 4 ranks"):
        dp.split_batch(16, 2, 4)
    with pytest.raises(ValueError, match="world_size must be a positive integer"):
        dp.split_batch(16, 8, 0)
    uneven = dp.split_batch(15, 7, 2, uneven=True)
    assert [len(r) for r in uneven] == [4, 3] and uneven[-1][-1][1] == 15


# ------------------------------------------------------------------ buckets and the optimizer


def test_buckets_close_once_they_reach_the_cap_last_tensors_first():
    ts = [torch.zeros(10), torch.zeros(3), torch.zeros(3), torch.zeros(20)]  # 40, 12, 12, 80 B
    assert dp.make_buckets(ts) == [[3], [2], [1], [0]]
    # cap 60: 80 >= 60 closes [3]; 12 + 12 + 40 = 64 >= 60 closes [2, 1, 0] (over the cap)
    assert dp.make_buckets(ts, 60) == [[3], [2, 1, 0]]
    # cap 100: 80 + 12 + 12 = 104 closes [3, 2, 1]; 40 is left open, a bucket of its own
    assert dp.make_buckets(ts, 100) == [[3, 2, 1], [0]]
    assert dp.bucket_bytes(ts, 100) == [104, 40] and dp.bucket_bytes(ts) == [80, 12, 12, 40]
    assert dp.make_buckets(ts, 144) == [[3, 2, 1, 0]]  # exactly the cap: one bucket
    assert dp.make_buckets(ts, 10**6) == [[3, 2, 1, 0]]
    # a float64 tensor goes to a bucket of its own dtype; float32 ones still share theirs
    mixed = [torch.zeros(2), torch.zeros(2, dtype=torch.float64), torch.zeros(2)]
    assert dp.make_buckets(mixed, 10**6) == [[2, 0], [1]]
    with pytest.raises(ValueError, match="bucket_cap_bytes must be a positive integer"):
        dp.make_buckets(ts, 0)


def _ddp_reference(tensors, *caps):
    """DDP's own bucket assignment, last tensor first, as indices into ``tensors``."""
    import torch.distributed as dist
    last_first = list(reversed(tensors))
    buckets, _ = dist._compute_bucket_assignment_by_size(last_first, list(caps))
    return [[len(tensors) - 1 - j for j in bucket] for bucket in buckets]


def _small_cnn_parameters():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.BatchNorm2d(16),
                              torch.nn.Conv2d(16, 32, 5), torch.nn.Flatten(),
                              torch.nn.Linear(32 * 4 * 4, 10), torch.nn.Linear(10, 10).double())
    return list(net.parameters())


def test_buckets_match_ddps_own_assignment():
    figure = list(dp.make_model(FIGURE_8_2).parameters())  # 96, 24, 144, 24, 48, 8 B
    # the reviewer's case, by hand: 8 + 48 + 24 + 144 = 224 >= 200, then 24 + 96 = 120
    assert _ddp_reference(figure, 200) == dp.make_buckets(figure, 200) == [[5, 4, 3, 2], [1, 0]]
    from parlab.models import GPT, GPT2_SMALL
    with torch.device("meta"):
        gpt2 = list(GPT(GPT2_SMALL).parameters())
    cases = [(figure, (1, 24, 80, 200, 223, 224, 344, 10**6)),
             (_small_cnn_parameters(), (1, 100, 1000, 5000, 20_000, 10**6)),
             (gpt2, (2**20, 25 * 2**20, 100 * 2**20))]
    for tensors, caps in cases:
        for cap in caps:
            assert dp.make_buckets(tensors, cap) == _ddp_reference(tensors, cap), \
                (len(tensors), cap)
            for first in (1, cap // 3 or 1, 3 * cap):  # a first bucket with a cap of its own
                assert dp.make_buckets(tensors, cap, first) == _ddp_reference(tensors, first, cap)
    with pytest.raises(ValueError, match="first_cap_bytes=100 needs a bucket_cap_bytes"):
        dp.make_buckets(figure, None, 100)


def _ddp_default_buckets():
    """Rank side: a default DDP's buckets after its first iteration, and its parameters."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Linear(400, 400) for _ in range(48)])  # 29.4 MiB
    model = torch.nn.parallel.DistributedDataParallel(net)
    for _ in range(3):
        model(torch.randn(2, 400)).sum().backward()
    data = model._get_ddp_logging_data()
    indices = data["rebuilt_per_bucket_param_indices"].split(",")
    return ([[int(i) for i in bucket.split()] for bucket in indices],
            [int(b) for b in data["rebuilt_bucket_sizes"].split(",")])


def test_ddp_default_caps_are_what_a_running_ddp_uses():
    import torch.distributed as dist
    import torch.nn.parallel.distributed as ddp_module
    assert dp.DDP_FIRST_BUCKET_BYTES == dist._DEFAULT_FIRST_BUCKET_BYTES == 2**20
    assert dp.DDP_BUCKET_CAP_BYTES == 25 * 2**20
    # torch 2.13 names the 25 MiB; torch 2.11 writes it inline (the running DDP below checks both)
    assert getattr(ddp_module, "_DEFAULT_BUCKET_CAP_MB", 25) == 25
    buckets, sizes = run(_ddp_default_buckets, 2)[0]
    params = list(torch.nn.Sequential(*[torch.nn.Linear(400, 400) for _ in range(48)]).parameters())
    assert buckets == dp.make_buckets(params, dp.DDP_BUCKET_CAP_BYTES, dp.DDP_FIRST_BUCKET_BYTES)
    assert sizes == dp.bucket_bytes(params, dp.DDP_BUCKET_CAP_BYTES, dp.DDP_FIRST_BUCKET_BYTES)
    # by hand: a layer is 400 x 400 x 4 = 640,000 B of weight and 1,600 B of bias; the first
    # bucket closes after 2 layers (1,283,200 B >= 1 MiB), the next after 41 more
    # (41 x 641,600 = 26,305,600 B >= 25 MiB; 40 would be 25,664,000 B), and the last
    # 5 layers are what is left
    assert sizes == [2 * 641_600, 41 * 641_600, 5 * 641_600]


def _ddp_rebuilt_buckets(spec, cap):
    """Rank side: the buckets a real DDP rebuilds after its first iteration (gradient order)."""
    model = torch.nn.parallel.DistributedDataParallel(dp.make_model(spec),
                                                      bucket_cap_mb=cap / 2**20)
    x, y = dp.make_batch(spec, 0)
    for _ in range(3):
        torch.nn.functional.mse_loss(model(x), y).backward()
    text = model._get_ddp_logging_data()["rebuilt_per_bucket_param_indices"]
    return [[int(i) for i in bucket.split()] for bucket in text.split(",")]


@pytest.mark.parametrize("cap", [60, 200])
def test_buckets_match_what_a_running_ddp_rebuilds(cap):
    assert run(_ddp_rebuilt_buckets, 2, FIGURE_8_2, cap)[0] == dp.make_buckets(
        list(dp.make_model(FIGURE_8_2).parameters()), cap)


def test_the_optimizer_is_torch_sgd_and_a_checkpoint_keeps_its_momentum_on_the_cpu():
    opt = dp.make_optimizer(SPEC, dp.make_model(SPEC).parameters())
    assert type(opt) is torch.optim.SGD
    group = opt.param_groups[0]
    assert (group["lr"], group["momentum"], group["dampening"], group["nesterov"]) == \
        (SPEC.lr, SPEC.momentum, 0, False)
    spec = SPEC.replace(steps=1)
    run = dp.train(spec, 2)[0]
    # after one step the momentum buffer is that step's gradient: (w0 - w1) / lr
    before, after = dp.make_model(spec).state_dict(), run.state
    state = run.checkpoint["optimizer"]["state"]
    buffers = [state[i]["momentum_buffer"] for i in sorted(state)]
    assert len(buffers) == len(before)
    for buf, name in zip(buffers, before):
        assert buf.device.type == "cpu"
        torch.testing.assert_close(buf, (before[name] - after[name]) / spec.lr, atol=1e-5, rtol=0)


def _imported_before_the_optimizer(spec):
    import sys
    before = "torch._dynamo" in sys.modules
    dp.make_optimizer(spec, dp.make_model(spec).parameters())
    return before


def test_ranks_find_what_torch_optim_imports_already_loaded():
    # creating a torch.optim optimizer imports torch._dynamo (seconds): the forkserver
    # preloads it, so every rank starts with it and no launch pays for it again
    assert run(_imported_before_the_optimizer, 2, SPEC) == [True, True]


# --------------------------------------------------------------------------- equivalence


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_training_on_n_ranks_equals_one_process(backend, world_size):
    reference = dp.reference(SPEC)
    runs = dp.train(SPEC, world_size, backend=backend)
    assert _identical(runs)
    assert_states_close(runs[0].state, reference.state)
    mean_losses = [sum(r.losses[i] for r in runs) / world_size for i in range(SPEC.steps)]
    assert mean_losses == pytest.approx(reference.losses, abs=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_buckets_change_the_calls_not_the_result(backend):
    reference = dp.reference(SPEC)
    per_tensor = dp.train(SPEC, 2, backend=backend)
    bucketed = dp.train(SPEC.replace(bucket_cap_bytes=200), 2, backend=backend)
    one = dp.train(SPEC.replace(bucket_cap_bytes=10**6), 2, backend=backend)
    # 6 tensors; under 200 B: b3 + W3 + b2 + W2 = 224 B closes a bucket, b1 + W1 = 120 B
    assert [r[0].calls[0] for r in (per_tensor, bucketed, one)] == [6, 2, 1]
    assert per_tensor[0].sync_bytes == one[0].sync_bytes == [344] * SPEC.steps
    for runs in (bucketed, one):
        assert_states_close(runs[1].state, reference.state)


def test_uneven_split_is_weighted_to_match_one_process():
    spec = SPEC.replace(samples=15, micro_batches=5, uneven=True)
    runs = dp.train(spec, 2)
    assert _identical(runs)
    assert_states_close(runs[0].state, dp.reference(spec).state)
    with pytest.raises(ValueError, match="do not split evenly over 2 ranks"):  # before any rank
        dp.train(spec.replace(uneven=False, samples=10), 2)


def test_segmented_run_resumes_exactly():
    whole = dp.train(SPEC, 2)
    parts = dp.train(SPEC, 2, segments=3)
    assert len(parts[0].losses) == SPEC.steps
    assert_states_close(parts[0].state, whole[0].state, atol=0)


def test_bad_training_options_are_clear_errors():
    with pytest.raises(ValueError, match="engine must be 'hand' or 'ddp', got 'fsdp'"):
        dp.train(SPEC, 2, engine="fsdp")
    with pytest.raises(ValueError, match="use engine='hand'"):
        dp.train(SPEC, 2, engine="ddp", fail_at=(0, 1, 0))
    with pytest.raises(ValueError, match="segments must be a positive integer"):
        dp.train(SPEC, 2, segments=0)


def test_ddp_gives_the_same_weights_as_the_hand_built_step():
    spec = SPEC.replace(bucket_cap_bytes=200)
    hand = dp.train(spec, 2)
    ddp = dp.train(spec, 2, engine="ddp")
    assert _identical(ddp)
    assert_states_close(ddp[0].state, hand[0].state)
    assert_states_close(ddp[0].state, dp.reference(spec).state)


# --------------------------------------------------------------------------- Figure 8-2


@pytest.mark.parametrize("backend", BACKENDS)
def test_figure_8_2_book_mlp_two_ranks(backend):
    result = run_figure_8_2(backend=backend)
    a1, a2 = result.ranks
    assert a1["micro"] == [1, 2, 3, 4] and a2["micro"] == [5, 6, 7, 8]
    for mine, peer in ((a1, a2), (a2, a1)):  # all_gather: A1 literally receives A2's gradient
        assert all(torch.equal(r, g) for r, g in zip(mine["remote"], peer["local"]))
    assert result.replicas_identical()
    assert result.max_difference() < TOL
    assert all(torch.allclose(a, r, atol=1e-7)
               for a, r in zip(a1["averaged"], result.reference_grads))


@pytest.mark.parametrize("world_size,how", [(1, "all_gather"), (2, "all_reduce"),
                                            (4, "all_gather"), (4, "all_reduce")])
def test_figure_8_2_book_mlp_several_steps(world_size, how):
    result = run_figure_8_2(FIGURE_8_2.replace(steps=3), world_size=world_size, how=how)
    assert result.max_difference() < TOL


def test_book_mlp_rejects_momentum():
    with pytest.raises(RankError, match="momentum=0"):
        run_figure_8_2(FIGURE_8_2.replace(momentum=0.9))


def test_figure_8_2_has_one_colour_scale_per_kind_of_panel():
    import inspect

    import matplotlib
    matplotlib.use("Agg")
    from parlab.viz.plots import figure_8_2
    from parlab.experiments import book_step_explorer

    result = run_figure_8_2()
    fig = figure_8_2(result)
    # the title states a bound, not the CPU-dependent difference; the one-process column
    # labels its gradient panel as the whole batch's gradient, not (local + remote) / N
    assert result.max_difference() < 1e-6
    assert fig.get_suptitle().endswith("weights equal one process's to within 1e-6")
    labelled = [ax.get_xlabel() for ax in fig.axes if ax.get_xlabel()]
    assert labelled == ["∇W1 of the whole batch"]
    # the limits, worked out here from the run's tensors: the largest |entry| of dW1 over
    # every gradient panel, and of W1 over every weight panel (replicas and one process)
    grads = [r[k][0] for r in result.ranks for k in ("local", "remote", "averaged")]
    grad_limit = max(float(t.abs().max()) for t in grads + [result.reference_grads[0]])
    weight_limit = max(float(t.abs().max())
                       for t in [r["weights"][0] for r in result.ranks] + [result.reference[0]])
    images = [im for ax in fig.axes for im in ax.get_images()]
    # 2 replicas x (local, remote, averaged, weights) + one process x (averaged, weights)
    assert len(images) == 2 * 4 + 2
    limits = sorted({im.get_clim() for im in images})
    assert limits == sorted({(-grad_limit, grad_limit), (-weight_limit, weight_limit)})
    bars = {im.colorbar.ax.get_ylabel(): im.get_clim() for im in images if im.colorbar}
    assert bars == {"∇W1 entry (every ∇ panel)": (-grad_limit, grad_limit),
                    "W1 entry": (-weight_limit, weight_limit)}
    # the explorer below the figure opens on the same step: run_figure_8_2's own defaults
    opens = inspect.signature(book_step_explorer).parameters
    runs = inspect.signature(run_figure_8_2).parameters
    assert opens["ranks"].default == runs["world_size"].default
    assert opens["how"].default == runs["how"].default
    assert opens["steps"].default == runs["spec"].default.steps == 1


# --------------------------------------------------------------------------- traffic (toy)


@pytest.mark.parametrize("world_size", [2, 4])
def test_ring_sends_2_n_minus_1_over_n_of_the_gradient_per_rank(world_size):
    spec = SPEC.replace(sizes=(4, 6, 4, 2), steps=2, bucket_cap_bytes=10**6)  # 68 numbers
    size = gradient_bytes(spec)
    assert size == 68 * 4
    runs, sent = measure_traffic(spec, world_size, "ring")
    assert sent == [2 * (world_size - 1) * size // world_size] * world_size
    assert_states_close(runs[0].state, dp.reference(spec).state)


def test_naive_root_sends_n_minus_1_gradients_and_uneven_ring_chunks_average_out():
    spec = FIGURE_8_2.replace(bucket_cap_bytes=10**6)  # 86 numbers: chunks of 22, 22, 21, 21
    size = gradient_bytes(spec)
    _, naive = measure_traffic(spec, 4, "naive")
    assert naive == [3 * size, size, size, size] == allreduce_bytes_per_rank(size, 4, "naive")
    _, ring = measure_traffic(spec, 4, "ring")
    assert sum(ring) / 4 == 2 * 3 / 4 * size
    assert max(abs(b - 2 * 3 / 4 * size) for b in ring) <= 4  # at most one number apart


def test_traffic_per_layer_is_c_in_times_c_out_whatever_the_batch():
    table = layer_traffic(FIGURE_8_2, batches=(8, 64))
    weights = table[table["C_in"] != "-"]
    assert list(weights["C_in x C_out x 4 B"]) == [4 * 6 * 4, 6 * 6 * 4, 6 * 2 * 4]
    assert list(weights["sent, batch 8 (B)"]) == list(weights["C_in x C_out x 4 B"])
    assert list(table["sent, batch 8 (B)"]) == list(table["sent, batch 64 (B)"])


def test_bucketing_cuts_calls_and_latency_not_bandwidth():
    tensors = [torch.empty(1000, 1000, device="meta"), torch.empty(1000, device="meta")] * 10
    # cap 8 MB: bias + weight + bias + weight = 8,008,000 B closes a bucket: 20 tensors, 5 calls
    table = bucketing_table(tensors, gpus=8, gbps=400, caps=(None, 8_000_000, 2**40))
    assert list(table["all-reduce calls"]) == [20, 5, 1]
    latency = list(table["of which latency ms"])
    assert latency == sorted(latency, reverse=True) and latency[0] == pytest.approx(20 * latency[2])
    bandwidth = table["modelled ms"] - table["of which latency ms"]
    assert max(bandwidth) - min(bandwidth) < 0.02


# --------------------------------------------------------------------------- lossless matters


def test_lost_transfer_fails_every_rank_and_no_rank_updates(tmp_path):
    spec = SPEC.replace(bucket_cap_bytes=200, steps=6)
    journal = str(tmp_path)
    with pytest.raises(RankError) as info:
        dp.train(spec, 2, fail_at=(1, 4, 1), journal_dir=journal)
    assert info.value.rank == 1 and info.value.exc_type == "LostTransfer"
    assert "bucket 1) in step 4" in str(info.value)
    last_update = []
    for rank in (0, 1):
        applied = [line for line in dp.read_journal(journal, rank) if "update applied" in line]
        assert len(applied) == 3 and applied[-1].startswith("step 3:")
        last_update.append(applied[-1])
    assert last_update[0] == last_update[1]  # same weights (sum printed) after step 3
    # rank 0 had received the average of bucket 0 of step 4, and still did not update
    assert dp.read_journal(journal, 0)[-2:] == ["step 4: bucket 0 sent", "step 4: bucket 1 sent"]
    assert dp.read_journal(journal, 1)[-1] == "step 4: bucket 0 sent"


def test_resume_from_checkpoint_equals_an_uninterrupted_run(tmp_path):
    spec = SPEC.replace(steps=8)
    folder = str(tmp_path)
    with pytest.raises(RankError):
        dp.train(spec, 2, fail_at=(0, 5, 0), checkpoint_dir=folder, checkpoint_every=3)
    start = dp.latest_checkpoint(folder)
    assert start["step"] == 3
    resumed = dp.train(spec, 2, start=start)
    assert len(resumed[0].losses) == 5
    assert_states_close(resumed[0].state, dp.train(spec, 2)[0].state, atol=0)


def test_a_silently_lost_transfer_lets_replicas_drift_apart():
    runs = dp.train(SPEC, 2, lose_at=(1, 2))
    assert max_difference(runs[0].state, runs[1].state) > 1e-4
