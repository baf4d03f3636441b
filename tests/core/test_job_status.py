"""Which job states are final; a job's id."""

from __future__ import annotations

from dataclasses import replace

from corral.core.job import Job, JobSpec, JobStatus


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


def test_a_jobs_id_is_its_specs_through_a_new_spec():
    job = Job(spec=JobSpec(id="j7", submit_time=0.0, gpus=8))
    assert job.id == "j7"
    job.spec = replace(job.spec, gpus=2)  # a pre-run's, or an elastic job's size
    assert (job.id, job.spec.gpus) == ("j7", 2)
