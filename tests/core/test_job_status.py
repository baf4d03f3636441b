"""Which job states are final."""

from __future__ import annotations

from corral.core.job import JobStatus


def test_only_ended_and_refused_jobs_are_finished():
    finished = {status for status in JobStatus if status.finished}
    assert finished == {
        JobStatus.SUCCEEDED,
        JobStatus.FAILED,
        JobStatus.CANCELLED,
        JobStatus.REFUSED,
    }
    assert not JobStatus.PENDING.finished
    assert not JobStatus.RUNNING.finished
