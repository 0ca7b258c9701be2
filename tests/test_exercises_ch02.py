"""Chapter 02's exercises: each checker against answers worked out by hand, hints that teach
without the number, and solutions out of the notebook's reach that agree with the checkers."""
from pathlib import Path

import torch
import torch.distributed as dist

from parlab.exercises import check

CHAPTER = Path(__file__).resolve().parents[1] / "chapters" / "02_data_parallelism.py"

#: Figure 8-2's model, layers 4 -> 6 -> 6 -> 2, in bytes (fp32), last tensor first:
#: b3 8, W3 48, b2 24 | W2 144, b1 24 | W1 96.
LAST_FIRST = [2 * 4, 6 * 2 * 4, 6 * 4, 6 * 6 * 4, 6 * 4, 6 * 4 * 4]
GRADIENT = sum(LAST_FIRST)  # 86 numbers
CH02 = {
    # DDP's buckets, cap 200 B: 8 + 48 + 24 + 144 = 224 >= 200 closes one; 24 + 96 = 120
    "02.1": 2,
    # ring on 4 GPUs: 2 passes x 3 chunks x (344 / 4) B
    "02.2": 2 * 3 * GRADIENT // 4,
    # W2 is 6 x 6 fp32 = 144 B; a ring of 2 sends half of it in each of its 2 passes
    "02.3": 2 * (6 * 6 * 4 // 2),
}


def test_hand_worked_answers_are_what_they_say():
    assert GRADIENT == 344 and CH02 == {"02.1": 2, "02.2": 516, "02.3": 144}


def test_checkers_accept_the_hand_computed_answers_and_hide_them():
    for exercise_id, answer in CH02.items():
        assert check(exercise_id, answer).ok is True, exercise_id
        assert check(exercise_id, float(answer)).ok is True, exercise_id
        for wrong_answer in (answer + 20, answer // 2, 2 * answer, 12345):
            verdict = check(exercise_id, wrong_answer)
            assert verdict.ok is False, (exercise_id, wrong_answer)
            assert str(answer) not in verdict.message, (exercise_id, verdict)
        assert check(exercise_id, ...).ok is None
        assert check(exercise_id, "many").ok is False


def test_the_ring_accepts_what_single_gpus_measure_but_not_one_pass():
    # 86 numbers in 4 chunks of 22, 22, 21, 21: single GPUs send 512 to 520 B (the toy backend)
    for sent in (512, 520):
        assert check("02.2", sent).ok is True
    assert check("02.2", 3 * GRADIENT // 4).ok is False


HINTS = [  # (exercise, a typical wrong answer, what the hint must talk about)
    ("02.1", 6, "one all-reduce per tensor"),
    # a bucket never allowed over the cap: 8 + 48 + 24 = 80 | 144 + 24 = 168 | 96, 3 buckets
    ("02.1", 3, "DDP adds the tensor first"),
    ("02.1", 1, "reach the cap before the last tensor"),
    ("02.1", 2.5, "whole, positive"),
    ("02.2", 2 * 3 * 86 // 4, "numbers or in bytes"),  # the ring's numbers, not bytes
    ("02.2", 3 * GRADIENT / 4, "all-gather half"),  # the reduce-scatter alone
    ("02.2", 3 * GRADIENT, "naive algorithm's root"),
    ("02.2", 2 * GRADIENT, "levels off"),
    ("02.3", 144 * 64 // 8, "grows with the batch"),
    ("02.3", 36, "numbers or in bytes"),  # 6 x 6 numbers
    ("02.3", 64 * 6 * 4, "activations"),
    ("02.3", 144 + 24, "bias is a tensor of its own"),
    ("02.3", 288, "share the work of one pass"),  # the whole tensor in both passes
]


def test_hints_name_the_mistake_but_never_the_answer():
    for exercise_id, wrong_answer, topic in HINTS:
        message = check(exercise_id, wrong_answer).message
        assert topic in message, (exercise_id, wrong_answer, message)
        assert str(CH02[exercise_id]) not in message, (exercise_id, wrong_answer, message)
    # no hint gives the factor that turns the wrong answer into the right one
    for exercise_id, wrong_answer in (("02.2", 3 * GRADIENT / 4), ("02.2", 2 * 3 * 86 // 4),
                                      ("02.3", 36), ("02.3", 288)):
        message = check(exercise_id, wrong_answer).message
        assert not any(giveaway in message for giveaway in
                       ("as much again", "4 bytes", "half the tensor", "twice")), message


def _average(grads):
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    for g, piece in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(piece.view_as(g))


def _per_tensor(grads):
    for g in grads:
        dist.all_reduce(g)
        g /= dist.get_world_size()


def _sum_only(grads):
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    for g, piece in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(piece.view_as(g))


def test_write_average_counts_calls_and_checks_the_values():
    assert check("02.4", _average).ok is True
    verdict = check("02.4", _per_tensor)
    assert verdict.ok is False and "3 time(s)" in verdict.message
    verdict = check("02.4", _sum_only)
    assert verdict.ok is False and "differs from the average" in verdict.message
    assert check("02.4", 42).ok is False


def test_solutions_agree_with_the_checkers():
    from parlab.exercises.ch02_solutions import solutions
    worked = solutions()
    assert {k: s.answer for k, s in worked.items() if k != "02.4"} == CH02
    assert check("02.4", worked["02.4"].answer).ok is True
    assert all(f"Answer: {answer}" in str(worked[k]) for k, answer in CH02.items())


def test_each_predict_first_exercise_comes_before_the_cell_that_prints_its_answer():
    text = CHAPTER.read_text()
    reveals = {"02.1": "for cap in caps", "02.2": "traffic_table(", "02.3": "layer_traffic("}
    for exercise_id, reveal in reveals.items():
        asked = text.index(f'check("{exercise_id}"')
        assert asked < text.index(reveal), exercise_id
