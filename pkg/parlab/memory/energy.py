"""Power and electricity cost of a training run, and what losing its progress costs.

Why this module exists: the chapter insists that the network of a training cluster must not
lose packets, because a stalled synchronization can force a restart, and it prices a run
(50,000 GPUs at 350 W for 60 days) to show what a restart from the beginning throws away.
A *lost packet* does not end a run: the RDMA transport (InfiniBand's reliable connection,
RoCE) retransmits it, which costs time (:func:`rdma_retry_times`). What ends a run is a
transfer that never completes, a failed link, NIC, GPU or host: the transport gives up,
the collective fails or times out, and every rank stops.
:func:`training_cost` does that arithmetic for any run. :func:`failure_cost` prices one
failure, and :func:`expected_waste` the failures a long run should expect, with and without
checkpoints (snapshots of the training state to restart from).

Failure model (Daly 2006, "A higher order estimate of the optimum checkpoint interval"):
failures arrive at random (a Poisson process) with a mean time between failures ``mtbf``
for the *whole job*; a job of n GPUs fails n times as often as one GPU. The run needs ``T``
hours of work. Writing a checkpoint takes ``c`` hours, restarting (reloading, rescheduling)
``r`` hours. Cut into segments of k hours of work plus one checkpoint, a segment that must be
repeated until it runs through without a failure takes on average
``mtbf exp(r / mtbf) (exp((k + c) / mtbf) - 1)`` hours, so the run takes ``T / k`` times that. Without
checkpoints the whole run is a single segment (k = T, c = 0), and the expected time grows
exponentially with T / mtbf: a run much longer than the time between failures never ends.
To first order each failure loses about k / 2 of work plus r, and the best interval is close
to Young's ``sqrt(2 c mtbf)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from parlab.checks import check_count, check_positive_number

__all__ = ["RunCost", "Waste", "RetryTimes", "training_cost", "failure_cost", "expected_waste",
           "young_interval", "rdma_retry_times", "WasteCurve", "waste_curve"]


@dataclass(frozen=True)
class RunCost:
    """A run's power draw, energy and electricity bill (``pue`` = facility overhead factor)."""

    gpus: int
    watts_per_gpu: float
    hours: float
    usd_per_kwh: float
    pue: float
    power_mw: float
    energy_mwh: float
    cost_usd: float

    @property
    def energy_kwh(self) -> float:
        return self.energy_mwh * 1000

    @property
    def usd_per_hour(self) -> float:
        return self.cost_usd / self.hours

    def __str__(self) -> str:
        return (f"{self.gpus:,} GPUs x {self.watts_per_gpu:g} W = {self.power_mw:,.2f} MW; "
                f"{self.hours:,.0f} h -> {self.energy_mwh:,.0f} MWh "
                f"({self.energy_kwh:,.0f} kWh); at ${self.usd_per_kwh:g}/kWh: "
                f"${self.cost_usd:,.0f}")


def training_cost(gpus: int, watts_per_gpu: float, days: float, usd_per_kwh: float,
                  pue: float = 1.0) -> RunCost:
    """Power (MW), energy (MWh) and cost (USD) of ``gpus`` drawing ``watts_per_gpu`` for ``days``.

    ``pue`` (power usage effectiveness) multiplies the GPUs' draw by the cooling and power
    losses of the building; the book's example leaves it at 1.
    """
    check_count("gpus", gpus)
    watts, days, price = (check_positive_number(n, v) for n, v in (("watts_per_gpu", watts_per_gpu),
                                                       ("days", days), ("usd_per_kwh", usd_per_kwh)))
    if check_positive_number("pue", pue) < 1:
        raise ValueError(f"pue is at least 1 (all power reaches the GPUs), got {pue!r}")
    hours = 24 * days
    power_mw = gpus * watts * pue / 1e6
    energy_mwh = power_mw * hours
    return RunCost(gpus, watts, hours, price, pue, power_mw, energy_mwh,
                   energy_mwh * 1000 * price)


def failure_cost(run: RunCost, at_hours: float, interval_hours: float | None = None,
                 restart_hours: float = 0.0) -> float:
    """USD lost when the run fails once, ``at_hours`` into it.

    Without checkpoints (``interval_hours=None``) everything done so far is lost; with a
    checkpoint every ``interval_hours`` only the work since the last one, plus the restart.
    """
    if not 0 <= at_hours <= run.hours:
        raise ValueError(f"at_hours must be within the run (0 to {run.hours:g} h), got {at_hours!r}")
    lost = at_hours if interval_hours is None \
        else at_hours % check_positive_number("interval_hours", interval_hours)
    return (lost + restart_hours) * run.usd_per_hour


@dataclass(frozen=True)
class Waste:
    """Expected cost of failures over a whole run, for one checkpoint policy."""

    interval_hours: float | None  # None: no checkpoints, restart from the beginning
    expected_hours: float         # wall-clock hours the run is expected to take
    failures: float               # expected number of failures on the way
    wasted_hours: float           # expected_hours - the hours of useful work
    wasted_usd: float

    @property
    def overhead(self) -> float:
        """Wasted time as a fraction of the useful work."""
        return self.wasted_hours / (self.expected_hours - self.wasted_hours)


def expected_waste(run: RunCost, mtbf_hours: float, interval_hours: float | None = None,
                   checkpoint_minutes: float = 10.0, restart_minutes: float = 30.0) -> Waste:
    """Expected wasted hours and dollars of ``run`` with job-level failures every ``mtbf_hours``.

    See the module docstring for the model. ``interval_hours=None`` means no checkpoints.
    Returns ``math.inf`` hours and dollars when the expectation overflows (hopeless runs).
    """
    mtbf = check_positive_number("mtbf_hours", mtbf_hours)
    c = 0.0 if interval_hours is None else checkpoint_minutes / 60
    r = restart_minutes / 60
    if c < 0 or r < 0:
        raise ValueError("checkpoint_minutes and restart_minutes cannot be negative")
    k = run.hours if interval_hours is None \
        else min(check_positive_number("interval_hours", interval_hours), run.hours)
    segments = run.hours / k
    try:
        expected = segments * mtbf * math.exp(r / mtbf) * math.expm1((k + c) / mtbf)
    except OverflowError:
        expected = math.inf
    failures = segments * math.expm1((k + c) / mtbf) if math.isfinite(expected) else math.inf
    wasted = expected - run.hours
    return Waste(interval_hours, expected, failures, wasted, wasted * run.usd_per_hour)


def young_interval(mtbf_hours: float, checkpoint_minutes: float) -> float:
    """Young's (1974) near-optimal checkpoint interval sqrt(2 c mtbf), in hours."""
    return math.sqrt(2 * check_positive_number("checkpoint_minutes", checkpoint_minutes) / 60
                     * check_positive_number("mtbf_hours", mtbf_hours))


@dataclass(frozen=True)
class WasteCurve:
    """Expected waste of one run against the checkpoint interval (:func:`waste_curve`)."""

    run: RunCost
    mtbf_hours: float
    intervals: list          # checkpoint intervals (hours), log-spaced
    wasted_usd: list         # expected wasted dollars at each interval
    best: float              # Young's interval (hours)
    at_best: Waste           # the waste at Young's interval
    never: Waste             # the waste without checkpoints


def waste_curve(run: RunCost, mtbf_hours: float, checkpoint_minutes: float = 10,
                restart_minutes: float = 30, points: int = 81) -> WasteCurve:
    """:func:`expected_waste` at ``points`` intervals from half a checkpoint's time to the run
    (at most 3 x ``mtbf_hours``), with Young's interval and the run without checkpoints."""
    if check_count("points", points, "intervals on the curve") < 2:
        raise ValueError(f"points must be at least 2 (the curve's two ends), got {points!r}")
    best = young_interval(mtbf_hours, checkpoint_minutes)
    lo, hi = checkpoint_minutes / 60 / 2, min(run.hours, 3 * mtbf_hours)
    ks = [lo * (hi / lo) ** (i / (points - 1)) for i in range(points)]
    waste = [expected_waste(run, mtbf_hours, k, checkpoint_minutes, restart_minutes).wasted_usd
             for k in ks]
    never = expected_waste(run, mtbf_hours, None, restart_minutes=restart_minutes)
    at_best = expected_waste(run, mtbf_hours, best, checkpoint_minutes, restart_minutes)
    return WasteCurve(run, mtbf_hours, ks, waste, best, at_best, never)


class RetryTimes(NamedTuple):
    """How long an RDMA queue pair waits for a lost packet, and when it gives up."""

    wait_s: float      # one acknowledgement timeout: at most this much later, it resends
    give_up_s: float   # no acknowledgement through every retry: the transfer fails


def rdma_retry_times(ib_timeout: int = 20, retry_count: int = 7) -> RetryTimes:
    """An InfiniBand/RoCE reliable connection's timeouts, as NCCL configures them.

    The sender waits 4.096 us x 2**``ib_timeout`` for an acknowledgement before it sends
    again (a gap the receiver notices is resent sooner, on its negative acknowledgement), and
    after ``retry_count`` unanswered resends the queue pair fails, which NCCL reports as an
    error ("transport retry counter exceeded"). The defaults are NCCL's ``NCCL_IB_TIMEOUT``
    (20 in current releases) and ``NCCL_IB_RETRY_CNT`` (7). So one lost packet costs at most
    ``wait_s``; a link that stays down fails the transfer after about ``give_up_s``.
    """
    if isinstance(ib_timeout, bool) or not isinstance(ib_timeout, int) \
            or not 1 <= ib_timeout <= 31:
        raise ValueError(f"ib_timeout must be an integer from 1 to 31 (InfiniBand's 5-bit "
                         f"exponent; 0 means no timeout), got {ib_timeout!r}")
    if isinstance(retry_count, bool) or not isinstance(retry_count, int) \
            or not 0 <= retry_count <= 7:
        raise ValueError(f"retry_count must be an integer from 0 to 7 (InfiniBand's 3-bit "
                         f"field), got {retry_count!r}")
    wait = 4.096e-6 * 2 ** ib_timeout
    return RetryTimes(wait, (retry_count + 1) * wait)
