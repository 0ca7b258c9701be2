"""Chapter 03's exercises: each checker accepts the answer worked out by hand here (not by the
simulator it uses), rejects wrong ones with a hint that never shows the number, and the
worked solutions agree and stay out of the notebook's reach."""
import re
from fractions import Fraction
from pathlib import Path

import pytest

from parlab.exercises import check

CHAPTER = Path(__file__).resolve().parents[1] / "chapters" / "03_pipeline_parallelism.py"

#: GPipe, p = 4, m = 8: the last stage starts in step p and forwards until m + p - 1; the
#: errors come back the same way: 2 (m + p - 1) = 22 steps, 2m = 16 of them busy per GPU.
GPIPE_BUBBLE = Fraction(22 - 16, 22)
#: 1F1B, p = 4, m = 8: A1 runs p forwards before its first error comes back, then one
#: backward per forward: never more than p.
A1_PEAK = 4
#: Interleaved, p = 4, v = 2, m = 4: 8 chunks, 7 boundaries, each crossed forward and back.
INTERLEAVED_MESSAGES = 4 * 2 * 7
#: GPipe for 2 stages and 2 micro-batches, placed by hand: 2 (m + p - 1) = 6 steps.
GPIPE_2X2 = {0: ["0F0", "0F1", None, None, "0B0", "0B1"],
             1: [None, "1F0", "1F1", "1B0", "1B1", None]}
CH03 = {"03.1": GPIPE_BUBBLE, "03.2": A1_PEAK, "03.3": INTERLEAVED_MESSAGES, "03.4": GPIPE_2X2}


def _numbers(message: str) -> set:
    return set(re.findall(r"\d+(?:\.\d+)?", message))


@pytest.mark.parametrize("exercise_id", ["03.1", "03.2", "03.3"])
def test_numeric_checkers_accept_the_hand_computed_answer_and_hide_it(exercise_id):
    answer = CH03[exercise_id]
    assert check(exercise_id, float(answer)).ok is True
    assert check(exercise_id, str(float(answer))).ok is True
    shown = _shown(answer)
    for wrong_answer in (float(answer) + 1, float(answer) / 2 + 0.1, 3 * float(answer), 0.01):
        verdict = check(exercise_id, wrong_answer)
        assert verdict.ok is False, (exercise_id, wrong_answer)
        assert not (_numbers(verdict.message) & shown), verdict.message


def _shown(answer) -> set:
    """The ways a hint could write the answer."""
    value = float(answer)
    return ({f"{value:g}", f"{value:.2f}", f"{value:.3f}", f"{value:.1f}"}
            | ({str(int(value))} if value == int(value) else
               {f"{Fraction(answer).numerator}", f"{Fraction(answer).denominator}"}))


#: (exercise, a typical wrong answer, a phrase its hint must contain), computed by hand
TYPICAL_MISTAKES = [
    ("03.1", 3 / 8, "ideal"),                # (p - 1) / m: idle over busy
    ("03.1", 27.27, "percentage"),
    ("03.1", 16 / 22, "Which slots"),        # the busy share
    ("03.1", 6 / 14, "run printed above"),   # m = 4, the GPipe run printed before 03.1
    ("03.2", 8, "GPipe"),                    # all m held
    ("03.2", 1, "last stage"),
    ("03.2", 7, "warm-up"),                  # forwarding every step until step 2p brings E1
    ("03.3", 2 * 4 * 3, "one chunk per GPU"),  # v = 1
    ("03.3", 4 * 7, "backward pass"),        # one direction only
    ("03.3", 2 * 8 * 7, "more micro-batches"),  # the comparison table's m = 8
    ("03.3", 2 * 4 * 8, "two chunks"),       # counting chunks, not boundaries
]


@pytest.mark.parametrize("exercise_id,wrong_answer,phrase", TYPICAL_MISTAKES)
def test_hints_name_the_mistake_not_the_number(exercise_id, wrong_answer, phrase):
    verdict = check(exercise_id, wrong_answer)
    assert verdict.ok is False and phrase in verdict.message, verdict.message
    assert not (_numbers(verdict.message) & _shown(CH03[exercise_id])), verdict.message


def test_hints_are_questions_not_corrections():
    """A hint within one step of the answer (halve, subtract from 1) asks about the concept
    instead of naming the step."""
    for exercise_id, wrong_answer in (("03.1", 16 / 22), ("03.3", 4 * 7), ("03.3", 2 * 4 * 8)):
        message = check(exercise_id, wrong_answer).message
        assert "?" in message, message
        assert not re.search(r"busy share|one direction|not the chunks|twice|double|halve",
                             message), message


def test_not_a_number_is_not_an_answer():
    assert check("03.1", float("nan")).ok is False and check("03.2", "many").ok is False


def test_writing_a_schedule_is_checked_by_the_simulator():
    assert check("03.4", GPIPE_2X2).ok is True
    one_f_one_b = {0: ["0F0", "0F1", None, "0B0", None, "0B1"],
                   1: [None, "1F0", "1B0", "1F1", "1B1", None]}
    assert "1F1B" in check("03.4", one_f_one_b).message
    late = {r: [None] + row for r, row in GPIPE_2X2.items()}
    assert check("03.4", late).ok is False and "7 time steps" in check("03.4", late).message
    assert "simulator rejects" in check("03.4", {0: ["0F0", "0B0"], 1: ["1F0", "1B0"]}).message
    # 5 steps, but rank 1 runs a forward and a backward in one step: two steps of work
    doubled = {0: ["0F0", "0F1", None, "0B0", "0B1"], 1: [None, "1F0", ("1F1", "1B0"), "1B1", None]}
    verdict = check("03.4", doubled)
    assert verdict.ok is False and "one action per time step" in verdict.message
    assert check("03.4", [["0F0"]]).ok is False


def test_solutions_agree_with_the_checkers():
    from parlab.exercises.ch03_solutions import solutions
    worked = solutions()
    assert {k: s.answer for k, s in worked.items()} == CH03
    for exercise_id, solution in worked.items():
        answer = solution.answer
        assert check(exercise_id, float(answer) if isinstance(answer, Fraction) else answer).ok
        assert "Answer:" in str(solution) and len(solution.working.splitlines()) >= 3


def test_each_prediction_comes_before_the_cell_that_prints_its_answer():
    """03.1 to 03.3 sit before their reveals; none of the four is answered earlier."""
    text = CHAPTER.read_text()
    at = {k: text.index(f'check("{k}"') for k in CH03}
    assert at["03.1"] < at["03.2"] < at["03.3"] < at["03.4"]
    table = text.index("print(comparison_table(rows))")  # m = 8: GPipe's bubble, 1F1B's peak,
    assert at["03.2"] < table                              # interleaved's transfers (twice 03.3's)
    assert at["03.2"] < text.index("print(s.summary())")   # the m = 4 Gantt summaries
    assert at["03.3"] < table
    assert at["03.3"] < text.index("interleaved_run = execute(")     # the toy backend's count
    assert text.index("## 5.") < at["03.1"]                          # in the section they belong to
    # 03.1 asks about m = 8; everything printed before it (the runs, the step explorer)
    # uses m = 4, which the exercise's text points to as a starting point
    assert "microbatches=8" not in text[:at["03.1"]] and ", 8)" not in text[:at["03.1"]]
