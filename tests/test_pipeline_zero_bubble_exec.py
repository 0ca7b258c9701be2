"""Issue 30, item 2: ZB-H1, ZBV and DualPipeV executed on real ranks, the split backward
(I then W) and the V placement included.

References are independent of the executor: one process training the same network (written
out here, float64), the event-driven simulator's order (:meth:`Timeline.order`), and
PyTorch 2.13's ``ScheduleZBVZeroBubble`` and ``ScheduleDualPipeV`` on gloo ranks.
"""
import pytest
import torch

from parlab.pipeline import (Action, execute_program, execute_programs, Network, program,
                             program_from_order, schedule, SplitBackward, timeline,
                             torch_pipelining, weight_modules, V_SCHEDULES_NEED_TORCH)

#: 8 layers of unequal widths, so a stage's output shape is never its neighbour's by chance;
#: 2 ranks: 2 (loop) or 4 (V) stages, 4 ranks: 4 or 8 stages.
NET = Network(widths=(6, 8, 12, 8, 10, 8, 12, 8, 4), samples=8)
NAMES = ("1f1b", "zb-h1", "zbv", "dualpipev")
MICROBATCHES = {2: 4, 4: 8}
LR, ITERATIONS, TOLERANCE = 0.1, 2, 1e-12


@pytest.fixture(scope="module")
def runs():
    """Every schedule on 2 and on 4 gloo ranks, two SGD steps each: one launch per size."""
    out = {}
    for p, m in MICROBATCHES.items():
        progs = [program(name, p, m) for name in NAMES]
        for prog, run in zip(progs, execute_programs(progs, NET, LR, ITERATIONS)):
            out[(prog.name, p)] = run
    return out


@pytest.fixture(scope="module")
def one_process():
    """The whole batch in one process: per step the loss and the gradients, then the weights."""
    layers = [layer.double() for layer in NET.build()]
    x, target = (t.double() for t in NET.batch())
    losses, grads = [], []
    for _ in range(ITERATIONS):
        out = x
        for layer in layers:
            out = layer(out)
        loss = torch.nn.functional.mse_loss(out, target, reduction="sum") / x.shape[0]
        for layer in layers:
            layer.zero_grad(set_to_none=True)
        loss.backward()
        losses.append(float(loss.detach()))
        grads.append({j: (l[0].weight.grad.clone(), l[0].bias.grad.clone())
                      for j, l in enumerate(layers)})
        with torch.no_grad():
            for q in (q for l in layers for q in l.parameters()):
                q -= LR * q.grad
    weights = {j: (l[0].weight.detach(), l[0].bias.detach()) for j, l in enumerate(layers)}
    return losses, grads, weights


def largest_difference(ours: dict, theirs: dict) -> float:
    assert sorted(ours) == sorted(theirs) == list(range(8))
    return max(float((a - b).abs().max()) for j in ours for a, b in zip(ours[j], theirs[j]))


CASES = [(name, p) for p in MICROBATCHES for name in NAMES]


@pytest.mark.parametrize("name,p", CASES)
def test_zero_bubble_executed_training_equals_one_process(runs, one_process, name, p):
    """Losses, gradients of both steps and the final weights, float64, to 1e-12."""
    run, (losses, grads, weights) = runs[(name, p)], one_process
    assert run.losses == pytest.approx(losses, abs=TOLERANCE, rel=0)
    for n in range(ITERATIONS):
        assert largest_difference(run.grads[n], grads[n]) < TOLERANCE
    assert largest_difference(run.weights, weights) < TOLERANCE
    assert losses[1] < losses[0]  # the SGD step did something: the second loss is lower
    assert largest_difference(grads[0], grads[1]) > 1e-4  # and the second step saw new weights


@pytest.mark.parametrize("name,p", CASES)
def test_zero_bubble_executed_log_equals_the_simulated_order(runs, name, p):
    """Each rank ran its actions, W included, in the order the event-driven simulator gives."""
    run = runs[(name, p)]
    expected = timeline(program(name, p, MICROBATCHES[p])).order()
    assert run.order(0) == run.order(1) == expected
    kinds = {Action.parse(a).kind for row in expected.values() for a in row}
    assert kinds == ({"F", "B"} if name == "1f1b" else {"F", "I", "W"} if name != "dualpipev"
                     else {"F", "B", "I", "W"})


@pytest.mark.parametrize("name,p", CASES)
def test_zero_bubble_transfers_cross_ranks_and_the_v_tip_stays_local(runs, name, p):
    """Between every two neighbouring stages on different ranks one activation goes down and
    one gradient comes back per micro-batch; in a V, stages p - 1 and p share rank p - 1,
    so that boundary sends nothing. Input gradients (I, or a full B) are sent, never W."""
    run, m = runs[(name, p)], MICROBATCHES[p]
    v = name in ("zbv", "dualpipev")
    rank_of = (lambda k: k if k < p else 2 * p - 1 - k) if v else (lambda k: k)
    crossings = [k for k in range((2 if v else 1) * p - 1) if rank_of(k) != rank_of(k + 1)]
    assert len(crossings) == (2 * p - 2 if v else p - 1)
    sent = run.sent()
    assert sorted((t.kind, min(t.src_stage, t.dst_stage), t.microbatch) for t in sent) == sorted(
        (kind, k, i) for kind in "Ey" for k in crossings for i in range(m))
    assert all((t.src, t.dst) == (rank_of(t.src_stage), rank_of(t.dst_stage)) for t in sent)
    senders = {Action.parse(e.action).kind for log in run.events[0] for e in log if e.sent}
    assert senders == ({"F", "B"} if name == "1f1b" else {"F", "I"} if name != "dualpipev"
                       else {"F", "B", "I"})


@pytest.fixture(scope="module")
def torch_runs():
    """PyTorch's V schedules on 2 gloo ranks, float64, one launch."""
    if torch.__version__ < V_SCHEDULES_NEED_TORCH:
        pytest.skip(f"torch {torch.__version__}: PyTorch's V schedules on gloo need torch "
                    f"{V_SCHEDULES_NEED_TORCH} (see parlab.pipeline.torch_pipelining)")
    return torch_pipelining(("zbv", "dualpipev"), stages=2, microbatches=4, net=NET,
                            dtype=torch.float64)


@pytest.mark.parametrize("name", ["zbv", "dualpipev"])
def test_zbv_and_dualpipe_v_pytorch_gives_our_losses_gradients_and_order(runs, torch_runs, name):
    """PyTorch's ScheduleZBVZeroBubble / ScheduleDualPipeV with PipelineStage s r and 2p-1-r
    on each rank: the same loss and gradients as ours, and each rank ran what PyTorch planned
    (its pipeline_order, a DualPipeV F&B pair as its forward then its backward)."""
    ours, theirs = runs[(name, 2)], torch_runs[name]
    assert abs(theirs.loss - ours.losses[0]) < TOLERANCE
    assert largest_difference(theirs.grads, ours.grads[0]) < TOLERANCE
    planned = {r: [a for item in row for a in (item if isinstance(item, tuple) else (item,))]
               for r, row in theirs.actions.items()}
    assert ours.order(0) == planned


def test_zero_bubble_zbv_and_dualpipe_v_on_the_toy_backend_send_what_the_log_says(
        one_process):
    """The toy backend's own record: per step, the messages each rank sent are the log's
    transfers (2 samples x the boundary's width x 8 bytes), and the gradients equal one
    process's: ZB-H1 (2 stages of 4 layers), ZBV and DualPipeV (4 stages of 2)."""
    progs = [program("zb-h1", 2, 4), program("zbv", 2, 4), program("dualpipev", 2, 4)]
    for prog, run in zip(progs, execute_programs(progs, NET, LR, 1, backend="toy")):
        per_stage = (len(NET.widths) - 1) // prog.virtual_stages
        for r, log in enumerate(run.events[0]):
            by_step = {}
            for e in log:
                if e.sent:
                    boundary = min(e.sent.src_stage, e.sent.dst_stage) + 1
                    width = NET.widths[per_stage * boundary]
                    by_step.setdefault(e.step, []).append((r, e.sent.dst, 2 * width * 8))
            logged = {s + 1: [(m.src, m.dst, m.nbytes) for m in msgs]
                      for s, msgs in enumerate(run.traffic[0][r]) if msgs}
            assert by_step and logged == by_step, (prog.name, r)
        assert largest_difference(run.grads[0], one_process[1][0]) < TOLERANCE, prog.name


@pytest.mark.parametrize("first_stage", [True, False])
def test_zero_bubble_i_computes_only_the_input_gradient_and_w_the_rest(first_stage):
    """One stage in one process, against autograd's full backward: after I the weights have
    no gradient yet and the input gradient is complete; after W the weights' gradients are.
    Stage 0's input needs no gradient: its I returns None."""
    def stage():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Sigmoid(),
                                   torch.nn.Linear(8, 4)).double()
    x = torch.rand(3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    grad_out = torch.rand(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    full = stage()
    x_full = x.clone().requires_grad_(not first_stage)
    full(x_full).backward(grad_out)

    split = stage()
    passes = SplitBackward({0: split})
    inp = x.clone().requires_grad_(not first_stage)
    out, noted = passes.forward(split, inp)
    assert [type(m).__name__ for m, _ in noted] == ["Linear", "Linear"]  # the weight modules
    input_grad, kept = passes.input_gradient(inp, out, grad_out, noted)
    assert all(q.grad is None for q in split.parameters())  # I touched no weight
    if first_stage:
        assert input_grad is None
    else:
        torch.testing.assert_close(input_grad, x_full.grad, atol=1e-15, rtol=0)
    passes.weight_gradient(kept)
    for mine, theirs in zip(split.parameters(), full.parameters()):
        torch.testing.assert_close(mine.grad, theirs.grad, atol=1e-15, rtol=0)
    passes.close()


# ----------------------------------------------------------------------------- bad input


def test_zero_bubble_split_backward_refuses_tied_or_reused_weights():
    shared = torch.nn.Linear(4, 4)
    tied = torch.nn.Sequential(shared, torch.nn.Linear(4, 4))
    tied[1].weight = shared.weight
    with pytest.raises(ValueError, match=r"parameter 1.weight is also 0.weight"):
        weight_modules(tied)
    twice = torch.nn.Sequential(shared, shared)
    passes = SplitBackward({0: twice})
    with pytest.raises(ValueError, match="Linear runs twice in one forward"):
        passes.forward(twice, torch.ones(1, 4))
    passes.close()


def _loop_stages_on_a_v(name):
    """A rank that builds one-stage-per-rank modules for a V program (its stages r, 2p-1-r)."""
    import torch.distributed as dist
    from parlab.pipeline import run_schedule
    rank = dist.get_rank()
    x = [torch.ones(1, 4)] * 4
    run_schedule(program(name, 2, 4), {rank: torch.nn.Linear(4, 4)}, x, x,
                 lambda y, t: (y - t).sum(), lambda k, i: (1, 4))


def test_zbv_run_schedule_names_the_stages_a_v_rank_holds():
    """A rank whose modules do not match the program's placement: a RankError, within
    seconds, naming the stages it should hold."""
    from parlab.launch import RankError, run
    with pytest.raises(RankError, match=r"rank (0 holds stages \[0, 3\]|1 holds stages \[1, 2\]) "
                                        r"of zbv \(v placement\), got modules for \[[01]\]"):
        run(_loop_stages_on_a_v, 2, "zbv", backend="gloo", timeout=30)


@pytest.mark.parametrize("call,message", [
    (lambda: execute_program(program("zbv", 2, 4), Network(widths=(4,) * 7, samples=8)),
     "6 layers do not split evenly over 4 stages"),
    (lambda: execute_program(program("zb-h1", 2, 3), NET), "8 samples does not split into 3"),
    (lambda: execute_program(program_from_order({0: ["0F0", "0W0"]}), NET),
     "0W0 has no input gradient 0I0"),
    (lambda: execute_program(program_from_order({0: ["0F0", "0W0", "0I0"]}), NET),
     "0W0 comes before its B"),
    (lambda: execute_program(program_from_order(
        {0: ["0F0", "1F0", "1B0", "0B0"], 1: ["2F0", "3F0", "3B0", "2B0"]}, "v", 2), NET),
     r"1F0 \(v placement\): stage 1 lives on rank 1"),
    (lambda: execute_program(schedule("1f1b", 2, 2), NET), "needs a Program"),
    (lambda: execute_programs([program("zbv", 2, 4), program("zbv", 4, 8)], NET),
     r"same number of ranks, got ranks \[2, 4\]"),
    (lambda: execute_program(program("zbv", 2, 4), NET, lr=0), "lr must be a positive number"),
    (lambda: torch_pipelining("dualpipev", 2, 2, NET), "microbatches >= 2 x ranks = 4"),
    (lambda: torch_pipelining("zb-h1", 2, 4, NET), "kinds must be among"),
])
def test_zero_bubble_bad_input_is_named_before_any_rank_starts(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_v_schedules_on_a_torch_that_cannot_run_them_say_which_torch(monkeypatch):
    """torch 2.11's stages send a tensor from a rank to itself as a V starts, which gloo
    refuses; the run says so before any rank starts, instead of gloo's "Pair is not
    connected" from a rank."""
    monkeypatch.setattr(torch, "__version__", torch.torch_version.TorchVersion("2.11.0"))
    with pytest.raises(RuntimeError, match=r"ScheduleZBVZeroBubble on gloo need torch 2\.13"):
        torch_pipelining("zbv", 2, 4, NET)
