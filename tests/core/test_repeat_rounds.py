"""A round that repeats a round without actions (nothing it looks at changed) decides the same:
hand-worked LAS scenarios where the scheduler may skip the walk of the queue."""

from __future__ import annotations

import pytest

from corral.core import Preempt, Start
from corral.sim.engine import Simulation
from tests.core.helpers import random_trace, scheduler, spec


@pytest.mark.parametrize("within", [True, False])
def test_rekey_past_no_waiting_job_changes_nothing_and_later_crossing_still_preempts(
    within: bool,
):
    # One 2-GPU node, LAS queues split at 100 and 200 GPU-s.
    options = {"thresholds_gpu_s": [100, 200], "preempt_within_queue": within}
    s = scheduler(1, 2, "las", policy_options=options)
    s.submit(spec("W", 2, submit=0), 0)
    assert s.decide(0).actions == [Start("W", (0, 1))]
    # W crosses 100 GPU-s at t=50 and 200 at t=100 (2 GPUs): queue 2 from t=100.
    assert s.decide(50).actions == []
    assert s.decide(100).actions == []
    s.submit(spec("X", 2, submit=110), 110)
    # X (queue 0) preempts W (queue 2).
    assert s.decide(110).actions == [Preempt("W", (0, 1), "X"), Start("X", (0, 1))]
    assert s.decide(130).actions == []  # nothing changed: W still below X
    # X crosses 100 GPU-s at t=160: queue 1, still above W (queue 2), no waiting job between
    # its old and new keys, so nothing can change.
    decision = s.decide(160)
    assert decision.actions == []
    assert decision.wake_at == pytest.approx(210)  # it crosses 200 GPU-s 50 s later
    # At t=210 X enters queue 2 after W did (t=100): W goes first, and where the rule lets a
    # job preempt within its queue, it preempts X; under Tiresias's rule (the default) only a
    # higher queue preempts, and X runs on.
    expected = [Preempt("X", (0, 1), "W"), Start("W", (0, 1), resumed=True)] if within else []
    assert s.decide(210).actions == expected
    if within:
        assert s.jobs["X"].attained_gpu_s == pytest.approx(200)


def test_a_held_jobs_reason_counts_down_in_rounds_where_nothing_else_changes():
    s = scheduler(1, 1, "las")
    s.submit(spec("A", 1, submit=0, max_retries=3), 0)
    assert s.decide(0).actions == [Start("A", (0,))]
    s.failed("A", 0, "boom")  # the first retry waits the 5 s backoff: until t=5
    assert s.decide(1).actions == []
    assert s.jobs["A"].pending_reason == "retry backoff: held for 4 s more"
    assert s.decide(2).actions == []
    assert s.jobs["A"].pending_reason == "retry backoff: held for 3 s more"
    assert s.decide(5).actions == [Start("A", (0,), resumed=True)]


def test_a_round_with_nothing_new_keeps_the_reasons_and_counts_as_a_round():
    # Two 2-GPU nodes; B needs 4 GPUs, i.e. both nodes, and A (queue 0, earlier) holds one.
    s = scheduler(2, 2, "las", placement="any")
    s.submit(spec("A", 2, submit=0), 0)
    s.submit(spec("B", 4, submit=1), 1)
    assert [type(a) for a in s.decide(1).actions] == [Start]
    reason = s.jobs["B"].pending_reason
    rounds = s.rounds
    assert s.decide(2).actions == []
    assert s.decide(3).actions == []
    assert s.jobs["B"].pending_reason == reason
    assert s.rounds == rounds + 2


def test_a_running_job_that_drops_below_a_waiting_jobs_queue_is_preempted_at_once():
    # Under Tiresias's rule a waiting job of LAS queue 1 may not preempt a running job of queue 1,
    # whatever their order inside it; once the running job drops to queue 2, it may. The waiting
    # job's key is below both of the running job's keys, so the walk must not be skipped.
    s = scheduler(1, 2, "las", policy_options={"thresholds_gpu_s": [100, 200]})
    s.submit(spec("P", 2, submit=0), 0)
    assert s.decide(0).actions == [Start("P", (0, 1))]
    assert s.decide(50).actions == []  # P: 100 GPU-s, queue 1 from t=50
    s.submit(spec("R", 2, submit=60), 60)
    # R (queue 0) preempts P (queue 1), and reaches 100 GPU-s at t=110: both in queue 1, P
    # entered it first but may not preempt R there.
    assert s.decide(60).actions == [Preempt("P", (0, 1), "R"), Start("R", (0, 1))]
    decision = s.decide(110)
    assert decision.actions == []
    assert decision.wake_at == pytest.approx(160)  # R reaches 200 GPU-s: queue 2
    assert s.decide(160).actions == [
        Preempt("R", (0, 1), "P"),
        Start("P", (0, 1), resumed=True),
    ]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("within", [True, False])
@pytest.mark.parametrize("placement", ["any", "consolidate", "relax", "yarn"])
def test_skipping_quiet_rounds_decides_exactly_as_walking_every_round(
    seed: int, within: bool, placement: str
):
    # Random overloaded traces on 4 nodes x 4 GPUs in 2 racks with close LAS thresholds (many crossings and
    # preemptions): every start and preemption, in order and instant, is the same with the skip
    # and with a walk of the queue at every round.
    options = {"thresholds_gpu_s": [60, 200, 900], "preempt_within_queue": within}
    runs = []
    for may_repeat in (True, False):
        s = scheduler(4, 4, "las", placement=placement, racks=2, policy_options=options)
        s._may_repeat = s.timers.idle_when_running = may_repeat
        result = Simulation(random_trace(seed, 150), s, record_decisions=True).run()
        runs.append(result.decisions)
    assert len(runs[0]) > 300  # the trace preempts: each job starts at least once
    assert runs[0] == runs[1]


def test_a_job_that_did_not_fit_may_start_once_a_preemption_freed_more_than_it_took():
    # One 4-GPU node, LAS at 10 GPU-s: V (4 GPUs) drops to queue 1 at 2.5. J1 and J2 (1 GPU
    # each, queue 0) arrive at 3: J1 preempts V and takes one GPU, and J2 takes another of the
    # three V left free, in the same round (not at the next round, whenever that comes).
    s = scheduler(1, 4, "las", placement="any", policy_options={"thresholds_gpu_s": [10]})
    s.submit(spec("V", 4, submit=0), 0)
    # No job waits: V's drop at 2.5 wakes no round; the round at 3 takes it first.
    assert s.decide(0).wake_at is None
    s.submit(spec("J1", 1, submit=3), 3)
    s.submit(spec("J2", 1, submit=3), 3)
    assert s.decide(3).actions == [
        Preempt("V", (0, 1, 2, 3), "J1"),
        Start("J1", (0,)),
        Start("J2", (1,)),
    ]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("gap_s", [30.0, 150.0])
@pytest.mark.parametrize("policy", ["las", "gittins"])
def test_key_changes_while_no_job_waits_decide_as_rounds_of_their_own(
    seed: int, gap_s: float, policy: str
):
    # A running job's key change wakes no round while no job waits; it is taken at its own
    # instant at the next round (or before the job stops). On random traces, busy (a job every
    # 30 s) and light (every 150 s, where the queue often empties), every start and preemption
    # is the same as with every key change holding a round of its own (and every round walked),
    # and fewer rounds are held.
    if policy == "las":
        options: dict = {"thresholds_gpu_s": [60, 200, 900]}
    else:  # quantiles of a size history drawn like the trace's: many index levels
        history = random_trace(seed + 100, 300)
        options = {"service_samples_gpu_s": [j.gpus * (j.duration_s or 0) for j in history]}
    runs, rounds = [], []
    for may_repeat in (True, False):
        s = scheduler(4, 4, policy, placement="relax", racks=2, policy_options=options)
        s._may_repeat = s.timers.idle_when_running = may_repeat
        result = Simulation(random_trace(seed, 150, gap_s), s, record_decisions=True).run()
        runs.append(result.decisions)
        rounds.append(result.rounds)
    assert sum(isinstance(a, Start) for _, a in runs[0]) >= 150  # every job starts
    assert any(isinstance(a, Preempt) for _, a in runs[0])
    assert runs[0] == runs[1]
    assert rounds[0] < rounds[1]


def test_key_changes_that_woke_no_round_are_taken_before_a_job_stops_outside_a_round():
    # One 3-GPU node, LAS at 10 GPU-s; queue 1 is ordered by the instant a job entered it.
    # A (1 GPU, from 0) and B (2 GPUs, from 1) run with no job waiting: B reaches 10 GPU-s at 6
    # and A at 10, and neither crossing wakes a round. Both fail at 12 and wait again in queue
    # 1: B first (it entered at 6, A at 10), as rounds at 6 and 10 would have left them, not in
    # the order they came.
    s = scheduler(1, 3, "las", placement="any", policy_options={"thresholds_gpu_s": [10]})
    s.submit(spec("A", 1, submit=0, max_retries=3), 0)
    assert s.decide(0).actions == [Start("A", (0,))]
    s.submit(spec("B", 2, submit=1, max_retries=3), 1)
    decision = s.decide(1)
    assert decision.actions == [Start("B", (1, 2))]
    assert decision.wake_at is None
    s.failed("A", 12, "boom")
    s.failed("B", 12, "boom")
    assert s.explain("B", 12).startswith("PENDING, position 1 of 2")
    assert s.explain("A", 12).startswith("PENDING, position 2 of 2")


def test_the_walk_stops_where_fewer_gpus_are_free_than_any_waiting_job_needs():
    # One 4-GPU node, fifo with backfill. A (3 GPUs) runs; B and C (2 GPUs each) wait with 1
    # GPU free: no waiting job can start, so the walk stops at B, which is told what it waits
    # for, and C keeps its reason.
    s = scheduler(1, 4, "fifo", placement="any", backfill=True)
    s.submit(spec("A", 3, submit=0), 0)
    s.submit(spec("B", 2, submit=1), 1)
    s.submit(spec("C", 2, submit=2), 2)
    assert s.decide(2).actions == [Start("A", (0, 1, 2))]
    assert s.jobs["B"].pending_reason == "waiting for 2 free GPUs (1 free)"
    assert s.jobs["C"].pending_reason == "not yet considered"
    # C is resized to 1 GPU (an elastic job between attempts): now it fits the free GPU.
    s.set_gpus("C", 1, 3)
    assert s.decide(3).actions == [Start("C", (3,))]


def test_a_long_waiting_queue_keeps_its_order_as_it_grows_and_shrinks():
    # One 1-GPU node, fifo: j0 runs and 8,999 wait, more than LONG_QUEUE, so the queue becomes
    # a SortedList. Cancelling the even jobs from j2 to j8998 (4,499) and the odd ones from j1 to
    # j6999 (3,500) leaves 1,000, fewer than SHORT_QUEUE: a flat list again. Each step keeps
    # arrival order, and the next job to start is the earliest still waiting.
    from corral.core.index import LONG_QUEUE, SHORT_QUEUE, FlatIndex

    s = scheduler(1, 1, "fifo")
    for i in range(9_000):
        s.submit(spec(f"j{i}", 1, submit=float(i)), float(i))
    assert s.decide(9_000).actions == [Start("j0", (0,))]
    assert s.pending_count == 8_999 > LONG_QUEUE
    assert not isinstance(s.pending, FlatIndex)
    waiting = [f"j{i}" for i in range(1, 9_000)]
    assert [job.id for job in s.pending_jobs()] == waiting
    for i in range(2, 9_000, 2):
        s.cancel(f"j{i}", 9_001)
    for i in range(1, 7_000, 2):
        s.cancel(f"j{i}", 9_001)
    left = [f"j{i}" for i in range(7_001, 9_000, 2)]
    assert s.pending_count == len(left) == 1_000 < SHORT_QUEUE
    assert isinstance(s.pending, FlatIndex)
    assert [job.id for job in s.pending_jobs()] == left
    assert s.explain("j7003", 9_001).startswith("PENDING, position 2 of 1000")
    s.finished("j0", 9_002)
    assert s.decide(9_002).actions == [Start("j7001", (0,))]
