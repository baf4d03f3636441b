"""Optimus: the loss-curve fit, and srtf on the estimate it gives (hand-worked cases)."""

from __future__ import annotations

import numpy as np
import pytest

from corral.core import Preempt, Start
from corral.core.estimate import EstimateError, LossCurve, fit_loss_curve, thin
from corral.core.job import Job
from corral.core.policy import make_policy
from corral.core.policy.optimus import Optimus, Progress
from tests.core.helpers import scheduler, spec, started


def exact_observer(curves: dict[str, tuple[LossCurve, float]], every: float = 10.0):
    """Jobs log the exact loss of their curve every `every` steps; `steps_per_s` steps per ideal
    second of work."""

    def observe(job: Job, now: float) -> Progress:
        if job.id not in curves:
            return Progress()
        curve, steps_per_s = curves[job.id]
        steps = job.work_done_at(now) * steps_per_s
        logged = np.arange(every, steps + 1e-9, every)
        return Progress(steps, [(float(k), curve.loss(float(k))) for k in logged])

    return observe


# -- the fit ------------------------------------------------------------------------------------


def test_fit_recovers_a_known_curve_and_its_convergence_step():
    # l(k) = 1/(0.01 k + 0.5) + 0.2: l(10) = 1/0.6 + 0.2 = 1.8667, l(50) = 1/1.0 + 0.2 = 1.2,
    # l(100) = 1/1.5 + 0.2 = 0.8667, l(200) = 1/2.5 + 0.2 = 0.6, l(400) = 1/4.5 + 0.2 = 0.4222.
    points = [
        (10, 1 / 0.6 + 0.2),
        (50, 1.2),
        (100, 1 / 1.5 + 0.2),
        (200, 0.6),
        (400, 1 / 4.5 + 0.2),
    ]
    curve = fit_loss_curve(points)
    assert curve is not None
    assert (curve.b0, curve.b1, curve.b2) == pytest.approx((0.01, 0.5, 0.2), rel=1e-5)
    # Converged when the excess 1/(b0 k + b1) is 5 % of the initial 1/b1 = 2, i.e. 0.1:
    # 0.01 k + 0.5 = 10, k = 950 (= b1 (1/0.05 - 1) / b0 = 0.5 x 19 / 0.01).
    assert curve.converged_step(0.05) == pytest.approx(950, rel=1e-5)
    assert LossCurve(0.01, 0.5, 0.2).converged_step(0.05) == pytest.approx(950)


def test_curve_converging_at_a_step():
    # Initial excess 2 -> b1 = 0.5; converging at 1000 with fraction 0.05 -> b0 = 0.5 x 19 / 1000.
    curve = LossCurve.converging_at(1000, initial_excess=2.0, asymptote=0.3, fraction=0.05)
    assert (curve.b0, curve.b1, curve.b2) == pytest.approx((0.0095, 0.5, 0.3))
    assert curve.loss(1000) - 0.3 == pytest.approx(0.05 * 2.0)


@pytest.mark.parametrize(
    "points",
    [
        [],
        [(10, 2.0), (20, 1.5)],  # two points cannot fix three coefficients
        [(10, 2.0), (10, 1.5), (20, 1.2)],  # two distinct steps
        [(10, 1.0), (20, 1.0), (30, 1.0)],  # flat: no convergence to predict
        [(10, 1.0), (20, 1.5), (30, 2.0)],  # rising
        [(10, 1.0), (20, 0.5), (30, 0.0)],  # a loss of 0 is below any asymptote b2 >= 0
    ],
)
def test_fit_declines_points_that_do_not_pin_a_curve_down(points):
    assert fit_loss_curve(points) is None


@pytest.mark.parametrize(
    ("points", "message"),
    [
        ([(10, 2.0), (20, float("nan")), (30, 1.0)], "sample 1: loss: must be a finite number"),
        ([(10, 2.0), (-20, 1.5), (30, 1.0)], "sample 1: step: must not be negative"),
        ([(10, 2.0), (20,), (30, 1.0)], "sample 1: expected a (step, loss) pair"),
        ([(10, 2.0), ("x", 1.5), (30, 1.0)], "sample 1: step: must be a finite number, got 'x'"),
    ],
)
def test_malformed_samples_are_refused_naming_the_sample(points, message):
    with pytest.raises(EstimateError) as error:
        fit_loss_curve(points)
    assert message in str(error.value)


def test_thin_keeps_evenly_spaced_samples_first_and_last():
    samples = [(float(k), 1.0) for k in range(10)]
    # Positions round(i x 9 / 3) for i = 0..3: 0, 3, 6, 9.
    assert [s[0] for s in thin(samples, 4)] == [0, 3, 6, 9]
    assert thin(samples, 20) == samples


# -- the estimate and the order -----------------------------------------------------------------


def test_order_by_estimated_remaining_time_not_by_length():
    # A converges at step 1000 at 1 step/s and has done 400 s: 1000 - 400 = 600 s left.
    # B converges at step 2000 at 2 steps/s and has done 500 s (1000 steps): (2000 - 1000)/2 = 500.
    a_curve = LossCurve.converging_at(1000, 2.0, 0.2, 0.05)
    b_curve = LossCurve.converging_at(2000, 1.0, 0.5, 0.05)
    policy = Optimus(exact_observer({"A": (a_curve, 1.0), "B": (b_curve, 2.0)}))
    # The durations in the specs are deliberately wrong: optimus must not read them.
    a = Job(spec=spec("A", 1, duration=1.0), seq=0, work_done_s=400)
    b = Job(spec=spec("B", 1, duration=1e9), seq=1, work_done_s=500)
    key_a, key_b = policy.key(a, 0), policy.key(b, 0)
    assert key_a[0] == pytest.approx(600, rel=1e-4)
    assert key_b[0] == pytest.approx(500, rel=1e-4)
    assert key_b < key_a
    assert policy.estimate(a, 0).source == "fit" and policy.estimate(a, 0).points == 40


def test_a_refit_changes_the_decision():
    # One GPU. A converges at step 10,000 at 1 step/s and logs every 10 steps; B reports nothing.
    curve = LossCurve.converging_at(10_000, 2.0, 0.2, 0.05)
    s = scheduler(1, 1, "optimus", policy_options={"observe": exact_observer({"A": (curve, 1.0)})})
    s.submit(spec("A", 1, submit=0), 0)
    decision = s.decide(0)
    assert started(decision.actions) == {"A": (0,)}
    # No point yet: A's estimate is the prior, 3,600 s (nothing has finished). First refit after
    # max(300 s, 0.5 x 0 s run) = 300 s.
    assert decision.wake_at == pytest.approx(300)
    s.submit(spec("B", 1, submit=100), 100)
    # B's prior is 3,600 s; A has 3,600 - 100 = 3,500 s left on its prior, so B waits.
    assert s.decide(100).actions == []
    # At 300 A has 30 points: the fit predicts 10,000 steps, 9,700 s left > B's 3,600: preempt.
    assert s.decide(300).actions == [Preempt("A", (0,), "B"), Start("B", (0,))]
    why = s.explain("A", 300)
    assert "estimated remaining 9700s of work (loss-curve fit of 30 points)" in why


def test_remaining_is_the_estimate_the_key_holds_read_only():
    # The case above: A on its prior (3,600 s) from 0, refit at 300 from 30 points.
    curve = LossCurve.converging_at(10_000, 2.0, 0.2, 0.05)
    s = scheduler(1, 1, "optimus", policy_options={"observe": exact_observer({"A": (curve, 1.0)})})
    policy = s.policy
    s.submit(spec("A", 1, submit=0), 0)
    s.decide(0)
    a = s.jobs["A"]
    # At 100 A has 10 points, but its key still holds the prior it started with: 3,500 s left.
    at_100 = policy.remaining(a, 100)
    assert at_100 is not None and at_100.source == "prior"
    assert at_100.remaining_s == pytest.approx(3500)
    assert at_100.basis == "prior: no job has finished yet (prior_s 3600 s)"
    assert policy.remaining(a, 100) == at_100  # asking refits nothing
    s.decide(300)  # the refit: converging at step 10,000, 9,700 s left
    at_300 = policy.remaining(a, 300)
    assert at_300 is not None and at_300.source == "fit"
    assert at_300.remaining_s == pytest.approx(9700, rel=1e-4)
    assert at_300.basis == "loss-curve fit of 30 reported losses, converging at step 10000"
    # A job the policy never keyed has no estimate; the base policy makes none.
    assert policy.remaining(Job(spec=spec("B", 1)), 300) is None
    assert make_policy("fifo").remaining(a, 300) is None


def test_prior_before_three_points_and_learnt_from_finished_jobs():
    curve = LossCurve.converging_at(1000, 2.0, 0.2, 0.05)
    policy = Optimus(exact_observer({"A": (curve, 1.0)}))
    # 20 s of work at one sample per 10 steps: two points, not enough for a fit. Nothing has
    # finished: the prior is 3,600 s, 3,580 left.
    job = Job(spec=spec("A", 1), work_done_s=20)
    assert policy.estimate(job, 0).source == "prior"
    assert policy.key(job, 0)[0] == pytest.approx(3580)
    # Finished lengths 100, 200, 400, 800: a new job expects the median, (200 + 400) / 2 = 300;
    # one that did 150 s the median of those longer (200, 400, 800) = 400, so 250 left; one that
    # did 200 s the median of (400, 800) = 600; one longer than all of them twice what it did.
    policy.finished_lengths.update([100, 200, 400, 800])
    assert [policy.prior_total_s(w) for w in (0, 150, 200, 900)] == [300, 400, 600, 1800]
    fresh = Job(spec=spec("B", 1), work_done_s=150)
    assert policy.key(fresh, 0)[0] == pytest.approx(250)


def test_prior_is_learnt_online_from_jobs_that_succeed():
    # Two GPUs, no progress reported. A (50 s) and B start at 0; A succeeds at 50.
    s = scheduler(1, 2, "optimus")
    policy = s.policy
    assert isinstance(policy, Optimus)
    s.submit(spec("A", 1, duration=50), 0)
    s.submit(spec("B", 1, duration=1000), 0)
    s.decide(0)
    s.finished("A", 50)
    # The policy looks at the running jobs it watches (A, B) once per as many key computations:
    # C's is the first since A ended, so C still gets the 3,600 s prior; D's triggers the look,
    # learns A's 50 s, and D expects the median of the finished jobs, 50 s.
    s.submit(spec("C", 1, submit=50), 50)
    s.submit(spec("D", 1, submit=50), 50)
    assert list(policy.finished_lengths) == [50]
    assert policy.key(s.jobs["C"], 50)[0] == pytest.approx(3600)
    assert policy.key(s.jobs["D"], 50)[0] == pytest.approx(50)
    # D (50 s expected) goes ahead of C (3,600 s) although C arrived first.
    assert [j.id for j in s.pending_jobs()] == ["D", "C"]


def test_job_with_no_progress():
    policy = make_policy("optimus")  # no observer: every estimate is the prior
    assert isinstance(policy, Optimus)
    waiting = Job(spec=spec("A", 1, duration=None))  # no length known at all: still a key
    assert policy.key(waiting, 0)[0] == pytest.approx(3600)
    assert policy.estimate(waiting, 0).source == "prior"
    # A job that already did 5,000 s, longer than the prior: expected to run as long again.
    veteran = Job(spec=spec("B", 1), work_done_s=5000)
    assert policy.key(veteran, 0)[0] == pytest.approx(5000)


def test_ties_go_to_the_earlier_arrival_then_to_submission_order():
    s = scheduler(1, 1, "optimus")
    s.submit(spec("late", 1, submit=5), 5)
    s.submit(spec("first", 1, submit=0), 5)
    s.submit(spec("second", 1, submit=0), 5)
    # All three have the same prior (3,600 s): submit time 0 before 5, then the order seen.
    assert [j.id for j in s.pending_jobs()] == ["first", "second", "late"]
    assert started(s.decide(5).actions) == {"first": (0,)}


def test_empty_cluster_round_and_bad_options():
    s = scheduler(1, 1, "optimus")
    decision = s.decide(0)
    assert decision.actions == [] and decision.wake_at is None
    with pytest.raises(ValueError, match="between 0 and 1"):
        Optimus(converge_fraction=1.0)
    with pytest.raises(ValueError, match="prior_s"):
        Optimus(prior_s=0)


def test_malformed_progress_names_the_job():
    def observe(job: Job, now: float) -> Progress:
        return Progress(30.0, [(10.0, 2.0), (20.0, float("inf")), (30.0, 1.0)])

    policy = Optimus(observe)
    job = Job(spec=spec("J7", 1), work_done_s=30)
    with pytest.raises(EstimateError, match="job J7: progress sample 1: loss: must be a finite"):
        policy.key(job, 0)
