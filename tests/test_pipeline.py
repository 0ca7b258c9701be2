"""Chapter 03 without ranks: schedules, the simulator, the book's table and its slips, the
comparison, figures and widgets (the exercises: test_pipeline_exercises.py)."""
import math

import pytest

from parlab import memory
from parlab.pipeline import Action, compare, comparison_table, from_order, schedule
from parlab.pipeline import describe_step, execute, Network, simulate
from parlab.experiments import BOOK_ACTIVE_PERCENT, errata
from parlab.pipeline import doubled_steps


@pytest.fixture(scope="module")
def book():
    return simulate(schedule("book", stages=4, microbatches=4))


def test_book_schedule_has_eleven_steps_with_the_chapters_percentages(book):
    assert book.steps == 11
    assert book.active_percent == [25, 50, 75, 100, 75, 50, 75, 100, 75, 50, 25]
    assert book.active_percent == BOOK_ACTIVE_PERCENT
    assert book.names == ["A1", "A2", "B1", "B2"]


def test_book_schedule_overlaps_forward_and_backward_where_the_chapter_does(book):
    order = book.schedule.pipeline_order
    # step 5 on B2: forward of x2, error and gradient of x1; step 6 on B1: forward of x4 and E1
    assert order[3][4] == ("3F1", "3B0")
    assert order[2][5] == ("2F3", "2B0")
    tuples = [(r, s) for r, row in order.items() for s, e in enumerate(row) if isinstance(e, tuple)]
    assert sorted(tuples) == [(2, 5), (3, 4), (3, 5), (3, 6)]
    # counted from 1, as the chapter's text counts: B2 in steps 5 to 7, B1 in step 6
    assert doubled_steps(book.schedule) == {0: [], 1: [], 2: [6], 3: [5, 6, 7]}
    assert doubled_steps(schedule("gpipe", 4, 4)) == {0: [], 1: [], 2: [], 3: []}
    with pytest.raises(ValueError, match="needs a Schedule"):
        doubled_steps(book)
    assert [str(t) for t in book.records[4].transfers] != []
    step5 = {(t.kind, t.microbatch, book.names[t.src], book.names[t.dst])
             for t in book.records[4].transfers}
    assert step5 == {("y", 3, "A2", "B1"), ("y", 2, "B1", "B2"), ("E", 0, "B2", "B1")}


def test_errata_are_found_by_comparing_the_text_with_the_simulation(book):
    found = {(e.step, e.what): (e.book_only, e.computed_only) for e in errata(book)}
    assert set(found) == {(2, "communication"), (4, "communication"), (6, "communication")}
    assert found[(2, "communication")] == (("y1 A2->B3",), ("y1 A2->B1",))
    assert set(found[(4, "communication")][0]) == {"y3 A1->A2", "y2 A2->B1", "y1 B1->B2"}
    assert set(found[(4, "communication")][1]) == {"y4 A1->A2", "y3 A2->B1", "y2 B1->B2"}
    assert found[(6, "communication")] == ((), ("E1 B1->A2",))
    assert "75% active" in describe_step(book, 5)


@pytest.mark.parametrize("p,m", [(2, 1), (2, 5), (4, 4), (4, 8), (3, 7), (8, 16)])
def test_gpipe_bubble_steps_and_memory(p, m):
    sim = simulate(schedule("gpipe", p, m))
    assert sim.steps == 2 * (m + p - 1)
    assert math.isclose(sim.bubble_fraction, (p - 1) / (m + p - 1))
    assert math.isclose(sim.bubble_over_ideal, (p - 1) / m)
    assert sim.peak_inflight == [m] * p


@pytest.mark.parametrize("p,m", [(2, 1), (2, 5), (4, 4), (4, 8), (3, 7), (8, 16), (4, 2)])
def test_one_f_one_b_keeps_the_bubble_and_caps_memory(p, m):
    sim, gpipe = simulate(schedule("1f1b", p, m)), simulate(schedule("gpipe", p, m))
    assert sim.steps == gpipe.steps and sim.bubble_fraction == gpipe.bubble_fraction
    assert sim.peak_inflight == [min(p - s, m) for s in range(p)]
    assert max(sim.peak_inflight) <= p


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 4, 2), (4, 12, 3), (2, 2, 4),
                                   (4, 2, 2)])
def test_interleaving_shrinks_the_bubble_for_more_transfers(p, m, v):
    sim, plain = simulate(schedule("interleaved", p, m, v)), simulate(schedule("1f1b", p, m))
    if m % p == 0:  # Megatron-LM's setting: bubble (p-1) slots of 1/v stage each
        assert sim.steps == 2 * m * v + 2 * (p - 1)
        assert math.isclose(sim.bubble_fraction, (p - 1) / (m * v + p - 1))
    assert sim.time < plain.time
    assert len(sim.transfers) == 2 * m * (p * v - 1) > len(plain.transfers)


def test_naive_model_parallelism_pushes_the_whole_batch_at_once():
    sim = simulate(schedule("naive", 4, 8))
    assert sim.schedule.microbatches == 1 and sim.steps == 8
    assert sim.bubble_fraction == 0.75 and sim.time == 64
    assert sim.peak_activation == [8.0] * 4  # the whole batch's activations on every stage


def test_pipeline_order_speaks_pytorchs_vocabulary():
    sched = schedule("interleaved", 2, 4, 2)
    for rank, row in sched.pipeline_order.items():
        assert len(row) == sched.steps
        for entry in row:
            assert entry is None or isinstance(entry, (str, tuple))
            for action in ([entry] if isinstance(entry, str) else entry or []):
                parsed = Action.parse(action)
                assert str(parsed) == action and parsed.stage % 2 == rank
    assert Action.parse("2F0") == Action(2, "F", 0)
    with pytest.raises(ValueError, match="not an action"):
        Action.parse("F2")


def test_hand_written_schedules_are_checked_with_reasons():
    good = {0: ["0F0", None, "0B0"], 1: [None, ("1F0", "1B0"), None]}
    assert simulate(from_order(good)).steps == 3
    with pytest.raises(ValueError, match="same time step on rank 0"):
        simulate(from_order({0: ["0F0", "0B0"], 1: ["1F0", "1B0"]}))
    with pytest.raises(ValueError, match="runs before 1B0, whose result it needs"):
        simulate(from_order({0: ["0F0", None, "0B0"], 1: [None, "1F0", None]}))
    with pytest.raises(ValueError, match="never runs 0B0, 1B0"):
        simulate(from_order({0: ["0F0", None], 1: [None, "1F0"]}))
    with pytest.raises(ValueError, match="lives on rank 1"):
        simulate(from_order({0: ["1F0"], 1: [None]}))
    with pytest.raises(ValueError, match="already run"):
        simulate(from_order({0: ["0F0", "0F0"]}))


@pytest.mark.parametrize("call,message", [
    (lambda: schedule("gpipe", 4, 0), "microbatches must be a positive integer"),
    (lambda: schedule("gpipe", 8, 4, layers=4), "stages=8 is more than the model's 4 layers"),
    (lambda: schedule("interleaved", 2, 4, 3, layers=4), "chunks=3 does not divide the layers"),
    (lambda: schedule("zero-bubble", 4, 4), "unknown schedule 'zero-bubble'"),
    (lambda: schedule("gpipe", 4, 4, chunks=2), "only applies to 'interleaved'"),
    (lambda: schedule("interleaved", 4, 9, 2), "not a multiple of 2"),
    (lambda: schedule("1f1b", 0, 4), "stages must be a positive integer"),
    (lambda: execute(schedule("gpipe", 8, 4)), "more than the network's 4 layers"),
    (lambda: execute(schedule("interleaved", 1, 2, 3)), "do not split evenly"),
    (lambda: execute(schedule("gpipe", 4, 3)), "does not split into 3 equal micro-batches"),
])
def test_bad_input_gets_a_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_compare_counts_memory_in_bytes_through_parlab_memory():
    rows = {r.name: r for r in compare(4, 8, 2)}
    assert set(rows) == {"naive", "gpipe", "1f1b", "interleaved"}
    per_stage = [memory.activation_bytes("GPT-3 175B", 1, 2048, "bf16", stage=s, pp=4)
                 for s in range(4)]
    assert rows["gpipe"].peak_bytes == 8 * max(per_stage)  # every stage holds all m
    one_f_one_b = max(n * b for n, b in zip((4, 3, 2, 1), per_stage))  # stage s holds p - s
    assert rows["1f1b"].peak_bytes == one_f_one_b < rows["gpipe"].peak_bytes
    assert rows["interleaved"].bubble_fraction < rows["1f1b"].bubble_fraction
    assert rows["interleaved"].transfers > rows["1f1b"].transfers
    bad = {r.name: r for r in compare(4, 9, 2)}["interleaved"]
    assert bad.error and "interleaved: " in comparison_table(compare(4, 9, 2))


def test_figures_are_registered_under_the_books_numbers():
    from parlab.tools import figures
    names = set(figures.registry())
    expected = {f"fig-8-{s + 2:02d}-pipeline-step-{s}" for s in range(1, 12)}
    expected |= {"fig-8-14-pipeline-data-sync", "fig-03-schedule-comparison",
                 "fig-03-schedule-gantt"}
    assert expected <= names


def test_step_figure_and_gantt_draw_any_schedule():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from parlab.viz.plots import step_caption, step_figure
    for name, p, m, v in [("book", 4, 4, 1), ("interleaved", 2, 4, 2), ("naive", 3, 2, 1)]:
        sim = simulate(schedule(name, p, m, v))
        fig = step_figure(sim, 2)
        assert len(fig.axes) == 2
        plt.close(fig)
    assert step_caption(simulate(schedule("book")), 4).endswith("100% active")


def test_step_explorer_redraws_with_the_active_percentage(capsys):
    import matplotlib
    matplotlib.use("Agg")
    from parlab.viz.widgets import step_explorer

    explorer = step_explorer()
    assert "Time step 1 of 11 (book): A1 busy; 25% active" in capsys.readouterr().out
    play, box = explorer.widget.children
    slider, dropdown = box.children[0].children
    slider.value = 4  # outside a kernel the live output prints to stdout
    assert "Time step 4 of 11 (book): A1, A2, B1, B2 busy; 100% active" in capsys.readouterr().out
    dropdown.value = "GPipe"
    assert slider.max == play.max == 14
    assert repr(explorer).startswith("[interactive]")
