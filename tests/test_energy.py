"""Power and cost of a run: the book's example, and what failures cost with and without checkpoints."""
import math

import pytest

from parlab.memory import expected_waste, failure_cost, training_cost, young_interval


def test_the_books_example():
    run = training_cost(gpus=50_000, watts_per_gpu=350, days=60, usd_per_kwh=0.10)
    assert run.power_mw == pytest.approx(17.5)
    assert run.hours == 1440
    assert run.energy_mwh == pytest.approx(25_200)
    assert run.energy_kwh == pytest.approx(25_200_000)
    assert run.cost_usd == pytest.approx(2_520_000)
    assert "17.50 MW" in str(run) and "$2,520,000" in str(run)


def test_pue_scales_everything():
    base = training_cost(gpus=1000, watts_per_gpu=700, days=10, usd_per_kwh=0.1)
    cooled = training_cost(gpus=1000, watts_per_gpu=700, days=10, usd_per_kwh=0.1, pue=1.5)
    assert cooled.cost_usd == pytest.approx(1.5 * base.cost_usd)


def test_a_failure_at_the_end_costs_the_whole_run_without_checkpoints():
    run = training_cost(gpus=50_000, watts_per_gpu=350, days=60, usd_per_kwh=0.10)
    assert failure_cost(run, run.hours) == pytest.approx(run.cost_usd)
    assert failure_cost(run, 100, interval_hours=4) == pytest.approx(0)
    assert failure_cost(run, 101, interval_hours=4) == pytest.approx(run.cost_usd / 1440)


def test_checkpoints_turn_an_endless_run_into_a_small_overhead():
    run = training_cost(gpus=50_000, watts_per_gpu=350, days=60, usd_per_kwh=0.10)
    none = expected_waste(run, mtbf_hours=8)
    best_k = young_interval(8, 10)
    best = expected_waste(run, mtbf_hours=8, interval_hours=best_k)
    assert none.wasted_usd > 1e6 * run.cost_usd
    assert 0 < best.wasted_usd < 0.5 * run.cost_usd
    # Young's interval is near the true optimum of the model
    for k in (best_k / 3, best_k * 3):
        assert expected_waste(run, 8, k).wasted_usd > best.wasted_usd
    # first order: about T / mtbf failures, each losing about k/2 plus the restart
    assert best.failures == pytest.approx(run.hours / 8, rel=0.3)


def test_rare_failures_cost_little_even_without_checkpoints():
    run = training_cost(gpus=8, watts_per_gpu=300, days=1, usd_per_kwh=0.1)
    waste = expected_waste(run, mtbf_hours=10_000)
    assert waste.overhead == pytest.approx(24 / 2 / 10_000, rel=0.1)


def test_young_interval():
    assert young_interval(4, 6) == pytest.approx(math.sqrt(2 * 0.1 * 4))


@pytest.mark.parametrize("kwargs, message", [
    (dict(gpus=-5), "gpus must be a positive integer, got -5"),
    (dict(gpus=2.5), "gpus must be a positive integer"),
    (dict(days=0), "days must be a positive number, got 0"),
    (dict(usd_per_kwh="cheap"), "usd_per_kwh must be a positive number"),
    (dict(pue=0.9), "pue is at least 1"),
])
def test_bad_input_is_a_clear_error(kwargs, message):
    args = dict(gpus=10, watts_per_gpu=300, days=1, usd_per_kwh=0.1) | kwargs
    with pytest.raises(ValueError, match=message):
        training_cost(**args)


def test_exercises_01_3_and_01_4_accept_the_right_answer_and_never_print_it():
    from parlab.exercises import check

    # 01.3: 17.5 MW for 4.096 us x 2**20 seconds, at $0.10 per kWh
    wait_usd = 50_000 * 350 / 1000 * (4.096e-6 * 2 ** 20) / 3600 * 0.10
    assert check("01.3", round(wait_usd, 2)).ok is True
    assert check("01.4", round(young_interval(4, 6), 2)).ok is True
    for exercise_id, wrong, answer in (("01.3", wait_usd * 8, f"{wait_usd:.2f}"),
                                       ("01.3", wait_usd * 10, f"{wait_usd:.2f}"),
                                       ("01.3", 1750, f"{wait_usd:.2f}"),
                                       ("01.4", young_interval(4, 6) * 60, "0.89")):
        verdict = check(exercise_id, wrong)
        assert verdict.ok is False and answer not in verdict.message


def test_a_lost_packet_waits_one_timeout_and_a_dead_link_fails_after_every_retry():
    from parlab.memory import rdma_retry_times
    times = rdma_retry_times()                       # NCCL's defaults: 20 and 7
    assert times.wait_s == pytest.approx(4.096e-6 * 1_048_576)
    assert times.give_up_s == pytest.approx(8 * times.wait_s)
    assert rdma_retry_times(14, 0) == (pytest.approx(0.0671088640), pytest.approx(0.0671088640))
    for kwargs, message in ((dict(ib_timeout=0), "ib_timeout must be an integer from 1 to 31"),
                            (dict(ib_timeout=2.5), "ib_timeout must be an integer"),
                            (dict(retry_count=8), "retry_count must be an integer from 0 to 7")):
        with pytest.raises(ValueError, match=message):
            rdma_retry_times(**kwargs)
