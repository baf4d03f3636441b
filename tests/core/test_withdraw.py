"""withdraw: a job taken out of the core (held, requeued) and adopted again with its history."""

from __future__ import annotations

from corral.core import JobStatus
from tests.core.helpers import scheduler, spec, started


def test_a_running_job_withdrawn_frees_its_gpus_and_keeps_its_history():
    s = scheduler(1, 2, "fifo")
    s.submit(spec("a", 2), 0)
    assert started(s.decide(0).actions) == {"a": (0, 1)}
    s.submit(spec("b", 2, submit=1), 1)
    job = s.withdraw("a", 10)
    assert job.status is JobStatus.PENDING and "a" not in s.jobs
    assert job.executed_s == 10 and job.attained_gpu_s == 20 and job.preemptions == 0
    assert s.preemptions == 0
    assert started(s.decide(10).actions) == {"b": (0, 1)}  # its GPUs were freed
    s.adopt(job, 10)
    s.finished("b", 20)
    # a arrived first (submit time 0): adopted again it is ahead of nothing, and starts.
    assert started(s.decide(20).actions) == {"a": (0, 1)}
    assert s.jobs["a"].executed_s == 10


def test_an_adopted_job_keeps_its_place_in_arrival_order():
    s = scheduler(1, 1, "fifo")
    s.submit(spec("run", 1), 0)
    s.decide(0)
    for i, job_id in enumerate(["x", "y", "z"], start=1):
        s.submit(spec(job_id, 1, submit=i), i)
    held = s.withdraw("x", 5)
    assert [j.id for j in s.pending_jobs()] == ["y", "z"]
    s.adopt(held, 6)
    assert [j.id for j in s.pending_jobs()] == ["x", "y", "z"]  # by submit time, as before


def test_a_finished_job_withdrawn_is_forgotten_and_may_be_adopted_again():
    s = scheduler(1, 1, "fifo")
    s.submit(spec("a", 1), 0)
    s.decide(0)
    s.finished("a", 1)
    job = s.withdraw("a", 2)
    assert job.status is JobStatus.SUCCEEDED and "a" not in s.jobs
    job.status = JobStatus.PENDING
    s.adopt(job, 3)
    assert started(s.decide(3).actions) == {"a": (0,)}
