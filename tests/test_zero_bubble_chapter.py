"""Issue 30, items 3 and 4: chapter 09's experiments and exercises, and the bad input of the
zero-bubble schedules.

References are independent of the code under test: hand-worked timelines (1F1B, ZB-H1, ZBV
with F = B = W), Qi et al. 2024's (p-1)(F+B-W), DeepSeek's PP + 1, chapter 03's layer written
out with autograd, and the slips a reader makes.
"""
import math

import pytest
import torch

from parlab.exercises import check
from parlab.experiments import (
    bubble_sweep, measure_passes, memory_table, run_real, schedule_timelines, speedups,
    split_backward_demo, UNIT_PASSES
)
from parlab.pipeline import (Durations, Network, program, SplitBackward, timeline, v_stages,
                             zb_h1, zbv, dualpipe_v)

# ----------------------------------------------------------------------------- experiments


def test_zero_bubble_chapter_split_demo_on_chapter_03s_layer():
    """Hidden layer 2 (Linear 4 -> 4, sigmoid) on 2 samples: autograd saves x, A and y; B
    needs dL/dy, A and y; W needs x and dL/dz; B and W together equal the full backward."""
    demo = split_backward_demo()
    assert demo.saved == [("the stage's input x", (2, 4)), ("the weight A", (4, 4)),
                          ("the sigmoid's output y", (2, 4))]
    assert [name for name, _ in demo.b_needs] == ["the gradient from the next stage dL/dy",
                                                  "the weight A", "the sigmoid's output y"]
    assert demo.w_needs == [("the stage's input x", (2, 4)),
                            ("the gradient dL/dz that B computed", (2, 4))]
    assert demo.untouched and demo.input_error == 0 and demo.weight_error == 0
    assert demo.kept_share == 1  # x and dL/dz (8 + 8 numbers) against x and y (8 + 8)


def test_zero_bubble_chapter_timelines_describe_the_same_model():
    """F = B = W = 1 per rank's stage, 4 ranks, 8 micro-batches, worked by hand: 1F1B
    8 x 3 + 3 x 3 = 33, ZB-H1 24 + 3 x (1 + 1 - 1) = 27, ZBV 24 + 3 x 0.5 = 25.5 (a V stage
    takes half: (p-1) V forwards of fill and drain); every rank does the same 24 of work."""
    t = schedule_timelines()
    assert {name: x.makespan for name, x in t.items()} == {
        "1f1b": 33, "zb-h1": 27, "zbv": 25.5, "dualpipev": 25.5}
    assert all(x.busy == [24] * 4 for x in t.values())
    assert t["zbv"].durations == Durations(0.5, 0.5, 0.5)
    assert t["zb-h1"].durations == UNIT_PASSES
    gains = speedups(t)
    assert gains["1f1b"] == 0 and math.isclose(gains["zb-h1"], 33 / 27 - 1)


@pytest.mark.parametrize("f,b,w", [(1, 1, 1), (0.22, 0.24, 0.39), (2, 3, 1)])
def test_zero_bubble_chapter_bubble_shrinks_with_m_and_grows_with_p(f, b, w):
    sweep = bubble_sweep(Durations(f, b, w))
    for name in sweep["m"]:
        by_m, by_p = sweep["m"][name], sweep["p"][name]
        assert all(x > y for x, y in zip(by_m, by_m[1:])), name
        assert all(x < y for x, y in zip(by_p, by_p[1:])), name
    for n in range(len(sweep["m"]["1f1b"])):
        assert sweep["m"]["1f1b"][n] > sweep["m"]["zb-h1"][n] > sweep["m"]["zbv"][n] * 0.999


def test_zero_bubble_chapter_memory_table_per_rank():
    """In units of one rank's stage: 1F1B p - s, ZB-H1 p - s + s k, ZBV 2p V stages = p,
    DualPipeV 2p + 1 V stages = p + 1/2 (DeepSeek's PP + 1); 1/p of the parameters, one copy."""
    for k in (0, 0.5, 1):
        rows = {row["schedule"]: row for row in memory_table(k)}
        ranks = [f"rank {r}" for r in range(4)]
        assert [rows["1f1b"][r] for r in ranks] == [4, 3, 2, 1]
        assert [rows["zb-h1"][r] for r in ranks] == [4 - s + s * k for s in range(4)]
        assert [rows["zbv"][r] for r in ranks] == [4] * 4
        assert [rows["dualpipev"][r] for r in ranks] == [4.5] * 4
        assert all(row["parameters per rank"] == "1/4" and row["copies"] == 1
                   for row in rows.values())


def test_zero_bubble_chapter_measures_positive_times():
    d = measure_passes(Network(widths=(8,) * 9, samples=16), repeats=1)
    assert isinstance(d, Durations) and min(d.F, d.B, d.W) > 0


def test_zero_bubble_chapter_real_runs_equal_one_process_and_the_simulation():
    real = run_real(net=Network(widths=(4,) * 9, samples=16))
    assert set(real.runs) == {"1f1b", "zb-h1", "zbv", "dualpipev"}
    assert all(e < 1e-6 for e in real.errors.values()), real.errors
    assert all(real.same_order.values())
    assert all(len(run.spans[0]) == 2 for run in real.runs.values())  # spans of both ranks


def test_zero_bubble_explorer_leaves_dualpipe_v_out_below_2p(capsys):
    from parlab.viz.widgets.zero_bubble import draw_zero_bubble
    import matplotlib.pyplot as plt

    fig = draw_zero_bubble(4, 6, 1.0, 1.0)
    assert len(fig.axes) == 3
    out = capsys.readouterr().out
    assert "DualPipeV needs at least 2 x ranks = 8" in out and "zb-h1: length" in out
    plt.close(fig)


def test_zero_bubble_durations_split_halves_the_passes_not_the_transfer():
    d = Durations(2, 4, 6, 0.5, 9).split(2)
    assert d == Durations(1, 2, 3, 0.5, 4.5)
    assert Durations(1, 1, 1).split(1) == Durations(1, 1, 1)

# ----------------------------------------------------------------------------- exercises


@pytest.mark.parametrize("answer", [9, 9.0, "9", "9.0"])
def test_zero_bubble_exercise_09_1_accepts_the_hand_worked_answer(answer):
    """(p - 1)(F + B - W) = 3 x (2 + 2 - 1) = 9 ms."""
    assert check("09.1", answer).ok is True


@pytest.mark.parametrize("answer,hint", [
    (15, "1F1B's idle time"),          # (p-1)(F+B+W): W not split off
    (12, "Subtract what they fill"),   # (p-1)(F+B): W leaves the path but fills nothing
    (3, "That is one gap"),            # F+B-W: the (p-1) forgotten
    (9 / (8 * 5 + 9), "a fraction"),   # the bubble fraction instead of the time
    (7, "Start from 1F1B's"),
])
def test_zero_bubble_exercise_09_1_names_the_classic_slips(answer, hint):
    verdict = check("09.1", answer)
    assert verdict.ok is False and hint in verdict.message
    assert "9" not in verdict.message.replace("09.1", "")  # the hint never gives the number


@pytest.mark.parametrize("answer", [9, "9", 9.0])
def test_dualpipe_v_exercise_09_2_accepts_the_hand_worked_answer(answer):
    """2p + 1 = 9 (stage, micro-batch) pairs: DeepSeek's PP + 1 with PP = 2p stages."""
    assert check("09.2", answer).ok is True


@pytest.mark.parametrize("answer,hint", [
    (8, "ZBV's peak"), (4, "1F1B's peak"), (4.5, "units of a whole rank's stage"),
    (16, "every micro-batch"), (12, "Follow rank 0"),
])
def test_dualpipe_v_exercise_09_2_names_the_classic_slips(answer, hint):
    verdict = check("09.2", answer)
    assert verdict.ok is False and hint in verdict.message


@pytest.mark.parametrize("exercise", ["09.1", "09.2"])
def test_zero_bubble_exercises_wait_for_an_answer_and_survive_nonsense(exercise):
    assert check(exercise, ...).ok is None
    assert check(exercise, "nine").ok is False
    assert check(exercise, float("nan")).ok is False

# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("call,message", [
    (lambda: timeline(program("zbv", 2, 4), (1, 1, 1)), "must be a parlab.pipeline.Durations"),
    (lambda: v_stages(2, 2), "rank must be one of 0 to 1 on 2 ranks, got 2"),
    (lambda: v_stages(0, 0), "ranks must be a positive integer"),
    (lambda: zb_h1(0, 4), "p must be a positive integer"),
    (lambda: zbv(2, 0), "m must be a positive integer"),
    (lambda: dualpipe_v(2, 3), "at least 2 x ranks = 4 micro-batches"),
    (lambda: program("dualpipev", 3, 5), "at least 2 x ranks = 6 micro-batches"),
    (lambda: SplitBackward(torch.nn.Linear(2, 2)), r"dict \{stage: torch.nn.Module\}"),
    (lambda: Durations(1, 1, 1).split(0), "chunks must be a positive integer"),
])
def test_zero_bubble_bad_input_names_what_is_valid(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_dualpipe_v_on_an_odd_number_of_ranks_is_documented_as_accepted():
    """The choice not to refuse it is explained where a user meets it."""
    assert "odd number of ranks is accepted" in dualpipe_v.__doc__
    assert timeline(program("dualpipev", 3, 6)).program.virtual_stages == 6

# ----------------------------------------------------------------------------- the planner


@pytest.mark.parametrize("p", [1, 2, 3, 4, 8])
def test_zero_bubble_h1_in_the_planner_equals_the_simulator(p):
    """Chapter 05's planner, schedule "zb-h1": its bubble fraction (F = B = W) and the
    micro-batches each stage holds are the event-driven simulator's, for m below and above p."""
    from parlab.hybrid import bubble_fraction
    from parlab.memory.breakdown import Setup

    for m in (1, 2, 3, 5, 8, 13):
        t = timeline(program("zb-h1", p, m), Durations(1, 1, 1))
        assert bubble_fraction(p, m, "zb-h1") == pytest.approx(t.bubble_fraction), (p, m)
        assert bubble_fraction(p, m, "zb-h1") <= bubble_fraction(p, m, "1f1b")
        setup = Setup(*[None] * 11)._replace(schedule="zb-h1", pp=p, microbatches=m)
        assert [setup.in_flight(k) for k in range(p)] == t.peak_inflight


def test_zero_bubble_h1_plans_gpt3_with_a_smaller_bubble():
    """GPT-3 on 1,024 GPUs: the fastest ZB-H1 layout steps faster than the fastest 1F1B one."""
    from parlab.hybrid import plan

    ofob = plan("GPT-3 175B", 1024, schedule="1f1b")[0]
    h1 = plan("GPT-3 175B", 1024, schedule="zb-h1")[0]
    assert h1.step_time_s < ofob.step_time_s
    assert h1.bubble_fraction < ofob.bubble_fraction or h1.pp < ofob.pp
