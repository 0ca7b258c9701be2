"""Figure 8-19 on 6 ranks (equal to one device, traffic by link type), chapter 04's counting,
exercises and figures."""
import pytest

from parlab.comm import ring_wire_bytes
from parlab.tensor_parallel import counting, run_ffn
from parlab.comm import figure_8_19
from parlab.tensor_parallel import layout


def test_layout_is_the_figures():
    places = layout()
    assert [str(p) for p in places] == [
        "A1 (rank 0): H1 neurons 1-3 of 6", "B1 (rank 1): H1 neurons 4-6 of 6",
        "A2 (rank 2): H2 neurons 1-2 of 4", "B2 (rank 3): H2 neurons 3-4 of 4",
        "A3 (rank 4): Out neuron 1 of 2", "B3 (rank 5): Out neuron 2 of 2"]


@pytest.mark.parametrize("backend", ["gloo", "toy"])
def test_six_ranks_equal_one_device(backend):
    c = run_ffn(backend=backend, batch=4, micro_batches=2)
    assert set(c.parallel) == {"output", "x.grad", "layer1.W.grad", "layer1.b.grad",
                               "layer2.W.grad", "layer2.b.grad", "layer3.W.grad", "layer3.b.grad"}
    assert c.max_error < 1e-6
    if backend == "toy":
        topology = figure_8_19()
        by_link = {phase: log.per_link_type(topology) for phase, log in c.traffic.items()}
        predicted = counting.ffn_bytes((4, 6, 4, 2), tensor=2, batch=4)
        assert by_link == {phase: {**links, "spine": 0} for phase, links in predicted.items()}
        for phase, log in c.traffic.items():
            for t in log.records:  # collectives inside a server, sends along a rail
                kind = topology.link_type(t.src, t.dst)
                assert kind == ("rail" if t.op == "send" else "nvlink"), (phase, t)
            assert log.time(topology) > 0


def test_more_ranks_than_neurons_is_a_clear_error():
    with pytest.raises(ValueError,
                       match="layer H2 .4 neurons.: 6 ranks for 4 neurons: "
                             "more ranks than neurons"):
        run_ffn(sizes=(4, 6, 4, 2), tensor=6)
    with pytest.raises(ValueError,
                       match=r"layer H1 .6 neurons.: tensor-parallel degree 4 does not divide"):
        run_ffn(tensor=4)


def test_gpt3_counts_match_the_book():
    c = counting.gpt3_counts()
    for part, book in counting.BOOK_SAYS.items():
        assert abs(c[part] - book) / book < 0.01, part
    rows = counting.parameter_memory(degrees=(1, 2, 4, 8))
    assert [r["tp"] for r in rows] == [1, 2, 4, 8]
    assert all(a["bytes"] > 1.9 * b["bytes"] for a, b in zip(rows, rows[1:]))
    assert not rows[0]["fits_80GB"] and rows[-1]["fits_80GB"]
    table = counting.embedding_table()
    assert table["parameters"] == 50257 * 12288 and table["share_of_model"] < 0.01
    assert table["bytes"] < table["one_block_bytes"]


def test_slide_formulas():
    assert counting.slide_costs(8, 1024, 4096) == {
        "data": 1024 * 4096, "partition_output": 8 * 4096, "reduce_output": 8 * 1024}
    assert ring_wire_bytes("all_reduce", 100, 1) == 0


def test_exercises_accept_right_answers_and_hide_them():
    from parlab.exercises import check
    from parlab.exercises.ch04 import _answers
    for exercise_id, answer in _answers().items():
        assert check(exercise_id, answer).ok is True, exercise_id
        wrong = check(exercise_id, 12345)
        assert wrong.ok is False and str(answer) not in wrong.message


def test_chapter_figures_are_registered():
    from parlab import figures
    names = set(figures.registry())
    assert {"fig-8-17-qkv-sharding", "fig-8-18-attention-tensor-parallel",
            "fig-8-19-ffn-tensor-pipeline", "fig-04-attention-bytes"} <= names
