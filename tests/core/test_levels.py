"""An integer priority level (JobSpec.level) orders the queue before the policy's own order."""

from __future__ import annotations

from corral.core import Cluster, Preempt, Scheduler, Start
from corral.core.job import Job
from corral.core.placement import make_placement
from corral.core.policy.base import Key, Policy
from tests.core.helpers import scheduler, spec, started


def test_fifo_starts_the_highest_level_first_and_breaks_ties_by_arrival():
    # One GPU, four waiting jobs: a (level 0, t=0), b (level 5, t=1), c (level 5, t=2),
    # d (level -1, t=3). Order: b, c (level 5, by arrival), a (0), d (-1).
    s = scheduler(1, 1, "fifo")
    s.submit(spec("a", 1, submit=0), 0)
    s.submit(spec("b", 1, submit=1, level=5), 1)
    s.submit(spec("c", 1, submit=2, level=5), 2)
    s.submit(spec("d", 1, submit=3, level=-1), 3)
    assert [job.id for job in s.pending_jobs()] == ["b", "c", "a", "d"]
    order = []
    now = 3.0
    for _ in range(4):
        actions = s.decide(now).actions
        (job_id,) = started(actions)
        order.append(job_id)
        now += 10
        s.finished(job_id, now)
    assert order == ["b", "c", "a", "d"]


def test_level_zero_everywhere_is_the_policy_order():
    s = scheduler(1, 1, "fifo")
    for i, job_id in enumerate(["x", "y", "z"]):
        s.submit(spec(job_id, 1, submit=i), i)
    assert [job.id for job in s.pending_jobs()] == ["x", "y", "z"]


def test_sjf_orders_within_a_level_by_length():
    # Same level: the shorter first (the policy's order); a higher level goes before both.
    s = scheduler(1, 1, "sjf")
    s.submit(spec("long", 1, submit=0, duration=100, level=1), 0)
    s.submit(spec("short", 1, submit=1, duration=10, level=1), 1)
    s.submit(spec("urgent-long", 1, submit=2, duration=500, level=2), 2)
    s.submit(spec("plain-short", 1, submit=3, duration=1), 3)
    assert [job.id for job in s.pending_jobs()] == ["urgent-long", "short", "long", "plain-short"]


def test_a_higher_level_preempts_a_lower_one_only_under_a_preemptive_policy():
    # srtf preempts: "low" (level 0, 100 s left) is preempted by "high" (level 3, 500 s), though
    # srtf alone would keep the job with less work left.
    s = scheduler(1, 4, "srtf")
    s.submit(spec("low", 4, duration=100), 0)
    s.decide(0)
    s.submit(spec("high", 4, submit=10, duration=500, level=3), 10)
    assert s.decide(10).actions == [
        Preempt("low", (0, 1, 2, 3), "high"),
        Start("high", (0, 1, 2, 3)),
    ]
    # A lower level never preempts a higher one, even with less work left.
    s2 = scheduler(1, 4, "srtf")
    s2.submit(spec("high", 4, duration=100, level=3), 0)
    s2.decide(0)
    s2.submit(spec("low", 4, submit=10, duration=5), 10)
    assert s2.decide(10).actions == []
    # fifo never preempts: the level only orders the queue.
    s3 = scheduler(1, 4, "fifo")
    s3.submit(spec("low", 4), 0)
    s3.decide(0)
    s3.submit(spec("high", 4, submit=10, level=3), 10)
    assert s3.decide(10).actions == []


def test_explain_names_the_level():
    s = scheduler(1, 1, "fifo")
    s.submit(spec("run", 1), 0)
    s.decide(0)
    s.submit(spec("w", 1, submit=1, level=7), 1)
    s.decide(1)
    # what holds the job comes first (a listing that shortens the text keeps it), then the level
    assert s.explain("w", 1) == (
        "PENDING, position 1 of 1 in the queue; "
        "waiting for free GPUs: all are in use by jobs of equal or higher priority; level 7"
    )


class _Flat(Policy):
    """A preemptive policy that gives every job the same key: only the level and the order the
    scheduler saw the jobs in (its seq, appended to every key) tell them apart."""

    name = "flat-test"
    preemptive = True

    def key(self, job: Job, now: float) -> Key:
        return (0,)


def test_jobs_of_equal_keys_keep_the_order_they_came_in_and_the_later_one_gives_way():
    # One 2-GPU node, all keys equal. A (1 GPU) and B (2 GPUs) come at 0: A starts, and B,
    # which came after A, may not preempt it: B waits. C (1 GPU) comes at 1 and starts on the
    # free GPU (B does not fit there). When A ends at 2, B, which came before C, preempts C and
    # takes both GPUs.
    s = Scheduler(Cluster.shorthand(1, 2), _Flat(), make_placement("any"))
    s.submit(spec("A", 1, submit=0), 0)
    s.submit(spec("B", 2, submit=0), 0)
    assert s.decide(0).actions == [Start("A", (0,))]
    s.submit(spec("C", 1, submit=1), 1)
    assert s.decide(1).actions == [Start("C", (1,))]
    assert [job.id for job in s.pending_jobs()] == ["B"]
    s.finished("A", 2)
    assert s.decide(2).actions == [Preempt("C", (1,), "B"), Start("B", (0, 1))]
