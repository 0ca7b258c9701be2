"""Figure 8-19 on 6 ranks (equal to one device, traffic by link type), chapter 04's counting,
exercises and figures."""
import pytest

from parlab.comm import ring_wire_bytes
from parlab.tensor_parallel import counting
from parlab.experiments import (
    BOOK_SAYS, book_names, cross_rail_bytes, gpt3_counts, run_ffn, run_layer_strategy
)
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
        # moved across rails: per micro-batch of 2 samples, 2 x 6 floats leave H1's stage
        # and 2 x 4 leave H2's, from both GPUs (backward: the same sizes come back)
        sent = 2 * (2 * (2 * 6 * 4) + 2 * (2 * 4 * 4))
        crossed = cross_rail_bytes(c, topology)
        for phase in ("forward", "backward"):
            assert crossed[phase]["messages"] == 8 and crossed[phase]["bytes"] == sent == 320
            assert crossed[phase]["spine"] == {"nvlink": 0, "rail": 0, "spine": sent,
                                               "switches": 8 * 3}
            assert crossed[phase]["relay"] == {"nvlink": sent, "rail": sent, "spine": 0,
                                               "switches": 8 * 1}


def test_book_names_map_to_the_notebooks_with_their_sizes():
    # the names as the book's text spells them (Figures 8-16 to 8-19), sizes by hand: Figure
    # 8-16's example has 4 tokens and d_model 8; run_ffn's batch of 4 in 2 micro-batches
    rows = {r["book"]: r for r in book_names()}
    assert list(rows) == ["Eepv", "Eevp", "Q, K, V matrices", "Q, K, V vectors",
                          "first/second fragments", "Cv", "C1, C2", "H1, H2", "ynA1+B1",
                          "ynA2+B2"]
    assert [rows[n]["here"] for n in ("Eepv", "Eevp", "Q, K, V matrices", "Cv")] == \
        ["4 x 8", "4 x 8", "8 x 8", "4 x 8"]
    assert rows["first/second fragments"]["here"] == "A1 columns 0-3; A2 columns 4-7"
    assert rows["C1, C2"]["here"] == "2 x 4 each"
    assert rows["H1, H2"]["here"] == "neurons 1-3 on A1, 4-6 on B1; 1-2 on A2, 3-4 on B2"
    assert (rows["ynA1+B1"]["here"], rows["ynA2+B2"]["here"]) == ("2 x 6", "2 x 4")
    assert rows["Eepv"]["notebook"].startswith("X") and rows["Cv"]["notebook"].startswith("context")


def test_more_ranks_than_neurons_is_a_clear_error():
    with pytest.raises(ValueError,
                       match="layer H2 .4 neurons.: 6 ranks for 4 neurons: "
                             "more ranks than neurons"):
        run_ffn(sizes=(4, 6, 4, 2), tensor=6)
    with pytest.raises(ValueError,
                       match=r"layer H1 .6 neurons.: tensor-parallel degree 4 does not divide"):
        run_ffn(tensor=4)


def test_gpt3_counts_match_the_book():
    c = gpt3_counts()
    for part, book in BOOK_SAYS.items():
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


#: Chapter 04's answers, worked out by hand from the questions' sizes (ring collectives on N
#: GPUs, all GPUs together: all-gather and broadcast (N - 1) S, all-reduce 2 (N - 1) S).
X_BYTES = 2 * 4 * 8 * 4  # batch 2 x 4 tokens x d_model 8, fp32
CH04 = {
    "04.1": 4 * 12288 * 12288 // 8,                     # four d x d matrices, an eighth each
    "04.2": 2 * X_BYTES,                                 # one all-reduce of X's size, N = 2
    "04.3": X_BYTES + X_BYTES + X_BYTES + 2 * X_BYTES,   # broadcast X, gather Q, K, sum output
    "04.4": 2 * (4 * 6 * 4 + 4 * 4 * 4),                 # H1's and H2's outputs, on 2 rails
    # data: 2 x (64 x 96 x 4) per step; reduce-output: 2 x (96 x 4) + 64 x 4 per sample
    "04.5": (2 * 64 * 96 * 4) // (2 * 96 * 4 + 64 * 4),
}


def test_chapter_04_exercises_accept_the_hand_computed_answers_and_hide_them():
    from parlab.exercises import check
    assert CH04 == {"04.1": 75497472, "04.2": 512, "04.3": 1280, "04.4": 320, "04.5": 48}
    for exercise_id, answer in CH04.items():
        assert check(exercise_id, answer).ok is True, exercise_id
        assert check(exercise_id, float(answer)).ok is True, exercise_id
        for wrong_answer in (answer + 1, answer // 2, 2 * answer, 12345):
            verdict = check(exercise_id, wrong_answer)
            assert verdict.ok is False, (exercise_id, wrong_answer)
            assert f"{answer}" not in verdict.message.replace(",", ""), (exercise_id, verdict)


def test_chapter_04_hints_name_the_mistake():
    from parlab.exercises import check
    assert "size of the tensor being summed" in check("04.2", X_BYTES).message
    assert "hidden layer" in check("04.2", 2 * 4 * 32 * 4).message         # d_ff-wide tensor
    assert "Short by one tensor" in check("04.3", 4 * X_BYTES).message    # all-reduce once
    assert "after the output projection" in check("04.3", 3 * X_BYTES).message
    assert "NVLink" in check("04.4", 4 * (6 + 4 + 2) * 4).message      # the all-gathers
    assert "two rails" in check("04.4", 160).message
    assert "slide's break-even" in check("04.5", 96).message
    assert "already moves more" in check("04.5", 49).message
    assert "try larger" in check("04.5", 40).message
    assert check("04.5", 47.5).ok is False and check("04.1", "many").ok is False


def test_chapter_04_break_even_is_what_the_toy_backend_measures():
    """At B = 48 reduce-output moves exactly what data parallelism moves; at 50, more."""
    data = sum(run_layer_strategy("data", batch=48, c_in=64, c_out=96,
                                  backend="toy").total_bytes().values())
    for batch, relation in ((48, "equal"), (50, "more")):
        moved = sum(run_layer_strategy("reduce_output", batch=batch, c_in=64, c_out=96,
                                       backend="toy").total_bytes().values())
        assert (moved == data) if relation == "equal" else (moved > data), (batch, moved, data)


def test_chapter_04_solutions_agree_with_the_checkers():
    from parlab.exercises.ch04_solutions import solutions
    assert {k: s.answer for k, s in solutions().items()} == CH04


def test_chapter_figures_are_registered():
    from parlab.tools import figures
    names = set(figures.registry())
    assert {"fig-8-17-qkv-sharding", "fig-8-18-attention-tensor-parallel",
            "fig-8-19-ffn-tensor-pipeline", "fig-04-attention-bytes"} <= names
