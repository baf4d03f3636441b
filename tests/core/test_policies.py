"""Ordering policies on hand-worked scenarios."""

from __future__ import annotations

import numpy as np
import pytest

from corral.core import JobStatus, Preempt, Start
from corral.core.policy import gittins_index, make_policy
from corral.core.policy.las import LasState
from tests.core.helpers import scheduler, spec, started


def test_las_order_after_preemption_follows_attained_service_then_arrival():
    # One 4-GPU node, one LAS threshold at 100 GPU-s: queue 0 below it, queue 1 above.
    s = scheduler(1, 4, "las", policy_options={"thresholds_gpu_s": [100]})
    s.submit(spec("A", 4, submit=0), 0)
    assert started(s.decide(0).actions) == {"A": (0, 1, 2, 3)}
    s.submit(spec("B", 4, submit=5), 5)
    decision = s.decide(5)
    # At t=5 A has 4 x 5 = 20 GPU-s: both in queue 0, A arrived first, so B waits.
    assert decision.actions == []
    # A reaches 100 GPU-s at t = 100 / 4 = 25: the scheduler asks to be woken then.
    assert decision.wake_at == pytest.approx(25)
    decision = s.decide(25)
    assert decision.actions == [Preempt("A", (0, 1, 2, 3), "B"), Start("B", (0, 1, 2, 3))]
    assert s.jobs["A"].attained_gpu_s == pytest.approx(100)
    # A new job C (queue 0) goes ahead of the preempted A (queue 1) in the queue.
    s.submit(spec("C", 4, submit=30), 30)
    assert s.decide(30).actions == []  # B (20 GPU-s) and C both queue 0; B arrived earlier
    assert [j.id for j in s.pending_jobs()] == ["C", "A"]
    # B drops to queue 1 at t = 25 + 100/4 = 50; C (queue 0) preempts it.
    decision = s.decide(50)
    assert decision.actions == [Preempt("B", (0, 1, 2, 3), "C"), Start("C", (0, 1, 2, 3))]
    # C reaches queue 1 at t = 75: A and B wait in queue 1 too, but only a higher queue
    # preempts (Tiresias's rule, the default), so C keeps its GPUs.
    assert s.decide(75).actions == []
    assert [j.id for j in s.pending_jobs()] == ["A", "B"]  # by when they entered queue 1
    # When C ends, FIFO inside queue 1 gives the GPUs to A (entered at 25), not B (at 50).
    s.finished("C", 80)
    decision = s.decide(80)
    assert started(decision.actions) == {"A": (0, 1, 2, 3)}
    assert s.jobs["A"].attempts == 2
    assert [j.id for j in s.pending_jobs()] == ["B"]


def test_las_starvation_promotion_moves_a_waiting_job_to_the_top_queue():
    s = scheduler(1, 4, "las", policy_options={"thresholds_gpu_s": [100], "starvation_factor": 2.0})
    s.submit(spec("A", 4, submit=0), 0)
    s.decide(0)
    s.submit(spec("B", 4, submit=1), 1)
    s.decide(1)
    s.decide(25)  # A has 100 GPU-s: queue 1; B preempts it. A ran 25 s.
    assert s.jobs["A"].status is JobStatus.PENDING
    # Fresh jobs keep arriving so that B and its successors stay ahead of A.
    s.submit(spec("C", 4, submit=26), 26)
    decision = s.decide(26)
    # A waits from t=25; with factor 2 and 25 s executed it is promoted at 25 + 2 x 25 = 75.
    assert decision.wake_at == pytest.approx(50)  # B's own queue crossing comes first
    s.decide(50)  # B crosses to queue 1; C (queue 0) preempts it
    assert s.jobs["C"].status is JobStatus.RUNNING
    s.decide(74.0)
    assert s.jobs["A"].status is JobStatus.PENDING
    s.decide(75.0)
    # Promoted A (queue 0, arrived at 0) outranks C (queue 1 since t = 50 + 25 = 75).
    assert s.jobs["A"].status is JobStatus.RUNNING
    assert s.jobs["A"].record(LasState).promotions == 1


def test_gittins_index_of_a_two_point_distribution():
    # Half of the jobs need 10 GPU-s, half need 100.
    samples = np.array([10.0, 100.0])
    # At 0: quantum 10 gives P=0.5 over E[min(S,10)]=10 -> 0.05; quantum 100 gives 1/55.
    assert gittins_index(samples, 0.0) == pytest.approx(0.05)
    # At 5: quantum 5 gives 0.5/5 = 0.1, better than 1/((5+95)/2) = 0.02.
    assert gittins_index(samples, 5.0) == pytest.approx(0.1)
    # Past 10 only the long job is possible: 90 GPU-s left with certainty.
    assert gittins_index(samples, 10.0) == pytest.approx(1 / 90)
    assert gittins_index(samples, 100.0) == 0.0


def test_gittins_preempts_a_job_that_outlived_the_short_mode():
    s = scheduler(
        1,
        1,
        "gittins",
        policy_options={"service_samples_gpu_s": [10.0, 100.0], "thresholds_gpu_s": [10.0]},
    )
    s.submit(spec("long", 1, submit=0), 0)
    decision = s.decide(0)
    assert started(decision.actions) == {"long": (0,)}
    s.submit(spec("new", 1, submit=3), 3)
    # Indexes are read on a grid of service levels (0, 10, ...): at 3 GPU-s the running job
    # still has the index of level 0, the same as the new job, and it arrived first.
    assert s.decide(3).actions == []
    # At 10 GPU-s (the next grid point) it has index 1/90 < 0.05: the new job takes the GPU.
    decision = s.decide(10)
    assert decision.actions == [Preempt("long", (0,), "new"), Start("new", (0,))]


def test_srtf_preempts_the_job_with_most_work_left_and_sjf_never_preempts():
    s = scheduler(1, 4, "srtf")
    s.submit(spec("big", 4, duration=100), 0)
    s.decide(0)
    s.submit(spec("small", 4, submit=10, duration=50), 10)
    # big has 90 s left, small 50: small runs.
    assert s.decide(10).actions == [
        Preempt("big", (0, 1, 2, 3), "small"),
        Start("small", (0, 1, 2, 3)),
    ]
    s2 = scheduler(1, 4, "sjf")
    s2.submit(spec("big", 4, duration=100), 0)
    s2.decide(0)
    s2.submit(spec("small", 4, submit=10, duration=50), 10)
    assert s2.decide(10).actions == []


def test_sjf_starts_the_shortest_waiting_job_first_not_the_earliest():
    # One 4-GPU node. "running" holds it until 100. "long" (300 s) arrives at 10, "short"
    # (20 s) at 20: when the node frees at 100, sjf starts short (20 < 300), where arrival
    # order would start long. Nothing is preempted at 20: sjf never preempts.
    s = scheduler(1, 4, "sjf")
    s.submit(spec("running", 4, duration=100), 0)
    s.decide(0)
    s.submit(spec("long", 4, submit=10, duration=300), 10)
    s.submit(spec("short", 4, submit=20, duration=20), 20)
    assert s.decide(20).actions == []
    s.finished("running", 100)
    assert s.decide(100).actions == [Start("short", (0, 1, 2, 3))]


def test_srtf_does_not_preempt_a_job_that_is_closer_to_done():
    s = scheduler(1, 4, "srtf")
    s.submit(spec("a", 4, duration=100), 0)
    s.decide(0)
    s.submit(spec("b", 4, submit=80, duration=50), 80)
    assert s.decide(80).actions == []  # a has 20 s left


def test_fifo_head_of_line_blocking_and_backfill():
    for backfill, expect_small_runs in [(False, False), (True, True)]:
        s = scheduler(1, 4, "fifo", backfill=backfill)
        s.submit(spec("running", 3), 0)
        s.decide(0)
        s.submit(spec("head", 4, submit=1), 1)
        s.submit(spec("small", 1, submit=2), 2)
        decision = s.decide(2)
        assert ("small" in started(decision.actions)) is expect_small_runs
        if not backfill:
            assert "blocked behind job head" in s.explain("small", 2)
            assert "waiting for 4 free GPUs (1 free)" in s.explain("head", 2)


def test_a_job_behind_others_of_its_own_level_is_not_said_to_wait_for_higher_priority():
    # One 4-GPU node, full: the round stops at the queue's head, and the jobs after it are not
    # looked at. b and c are both at level 0: c waits behind b by fifo's order, not by priority.
    s = scheduler(1, 4, "fifo")
    s.submit(spec("running", 4), 0)
    s.decide(0)
    s.submit(spec("b", 1, submit=1), 1)
    s.submit(spec("c", 1, submit=2), 2)
    s.decide(2)
    assert "all are in use" in s.explain("b", 2)
    assert s.explain("c", 2) == (
        "PENDING, position 2 of 2 in the queue; "
        "behind jobs of the same priority ahead in the fifo order"
    )
    # d at level 1 goes to the head: now b and c do wait behind a higher-priority job.
    s.submit(spec("d", 1, submit=3, level=1), 3)
    s.decide(3)
    assert s.explain("c", 3) == (
        "PENDING, position 3 of 3 in the queue; behind higher-priority jobs"
    )


def test_unknown_policy_and_bad_thresholds_are_refused():
    with pytest.raises(ValueError, match="unknown policy 'lottery'"):
        make_policy("lottery")
    with pytest.raises(ValueError, match="strictly increasing"):
        make_policy("las", thresholds_gpu_s=[100, 50])
