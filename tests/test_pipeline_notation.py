"""Chapter 03's short action labels (issue 15): one notation in the step table, the Gantt
chart and the trace timeline, none of which can be read as a GPU name.

The reference is the schedule's own action list (``Schedule.actions``), with the letter of
a backward pass written out here, not taken from the package."""
import pytest

from parlab.pipeline import Action, action_code, schedule, simulate

GPU_NAMES = {"A1", "A2", "B1", "B2"}


@pytest.fixture(scope="module")
def sim():
    return simulate(schedule("book", stages=4, microbatches=4))


def _expected(sim):
    """{(step, rank): [label, ...]} from the schedule's actions: F<i> forward, E<i> backward."""
    sched = sim.schedule
    return {(t + 1, r): [("F" if a.kind == "F" else "E") + str(a.microbatch + 1)
                         for a in sched.actions(r, t)]
            for t in range(sched.steps) for r in range(sched.stages)}


def test_action_code_is_F_forward_and_E_backward():
    assert action_code(Action(2, "F", 0)) == "F1"
    assert action_code(Action(2, "B", 3)) == "E4"
    assert str(Action(2, "B", 0)) == "2B0"  # PyTorch's stage-qualified string is unchanged


def test_step_table_cells_follow_the_schedule_and_are_never_a_gpu_name(sim):
    lines = sim.table().splitlines()
    header = lines[0].split()
    assert header[1:5] == sim.names == ["A1", "A2", "B1", "B2"]
    expected = _expected(sim)
    backward_seen = set()
    for line in lines[1:]:
        step = int(line.split()[0])
        # columns: step, then one cell per GPU ("F2, E1" when two actions share a step)
        cells = line[len(line.split()[0]):].split("  ")
        cells = [c.strip() for c in cells if c.strip()][:4]
        for rank, cell in enumerate(cells):
            labels = [] if cell == "." else cell.split(", ")
            assert labels == expected[(step, rank)], (step, rank, cell)
            assert not GPU_NAMES & set(labels), (step, rank, cell)
            backward_seen |= {x for x in labels if x.startswith("E")}
    assert backward_seen == {"E1", "E2", "E3", "E4"}


def test_gantt_labels_follow_the_schedule_and_are_never_a_gpu_name(sim):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from parlab.viz.plots import gantt_figure

    fig = gantt_figure([sim])
    try:
        labels = [t.get_text() for t in fig.axes[0].texts if not t.get_text().endswith("%")]
    finally:
        plt.close(fig)
    expected = [x for cell in _expected(sim).values() for x in cell]
    assert sorted(labels) == sorted(expected)
    assert not GPU_NAMES & set(labels)
    assert {x for x in labels if not x.startswith("F")} == {"E1", "E2", "E3", "E4"}


def test_trace_timeline_labels_use_the_same_codes():
    from parlab.viz.plots.timeline import _style

    span = {"ph": "X", "cat": "compute", "name": "2B0",
            "args": {"stage": 2, "kind": "B", "microbatch": 0}}
    assert _style(span)[2] == "E1"
