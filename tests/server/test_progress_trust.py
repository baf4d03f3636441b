"""What a job reports is not trusted (docs/progress.md, "What corral trusts"): its reports are
stamped with the manager's clock, and a tenant's measurements are its own VC's.

The telemetry here is the manager's own (corral.server.telemetry) on a real SQLite store, reading
a real progress file that the test appends to, at instants of a fake clock: every rate below is
worked out by hand from the lines written and the instants they were read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.core.profiles import Measure, Shape
from corral.server.store import Store
from corral.server.telemetry import Telemetry

BERT = Shape("bert-large", "gpu", 1, vc="nlp")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(Store.sqlite_url(tmp_path))
    try:
        for job_id in (1, 2):
            store.insert_job(
                job_id,
                name=f"j{job_id}",
                user="bob",
                vc="nlp",
                priority="guaranteed",
                gpus=1,
                spec={},
                submitted_at=0.0,
            )
        yield store
    finally:
        store.close()


class Job:
    """A job's progress file, appended to as a job would."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, *reports: dict[str, float]) -> None:
        with self.path.open("a") as handle:
            handle.write("".join(json.dumps(report) + "\n" for report in reports))


def watched(telemetry: Telemetry, tmp_path: Path, job_id: str = "1", now: float = 100.0) -> Job:
    job = Job(tmp_path / f"job-{job_id}" / "rank-0.progress")
    telemetry.watch(job_id, 1, job.path, BERT, now, resumed=False)
    return job


def rows(store: Store) -> dict[tuple[str, str], tuple[float, float, int]]:
    return {(p.vc, p.model): (p.steps_per_s, p.seconds, p.runs) for p in store.profiles()}


def test_reports_are_stamped_with_the_managers_clock_not_the_jobs(
    store: Store, tmp_path: Path
) -> None:
    telemetry = Telemetry(store, fold_every_s=1000.0)
    job = watched(telemetry, tmp_path)
    # The job's own times say 1,000 s between its reports (a clock in milliseconds, or a lie);
    # the manager read them 10 s apart: 50 steps in 10 s is 5 steps/s, not 0.05.
    job.write({"step": 0, "time": 1_000_000.0})
    telemetry.poll(100.0)
    job.write({"step": 50, "time": 1_001_000.0})
    telemetry.poll(110.0)
    row = store.get_job(1)
    assert row is not None and row.progress is not None
    assert row.progress.steps_per_s == 5.0
    assert row.progress.at == 110.0
    telemetry.unwatch("1", 110.0)
    assert rows(store) == {("nlp", "bert-large"): (5.0, 10.0, 1)}


def test_a_rate_runs_from_the_latest_report_of_one_read_to_the_latest_of_another(
    store: Store, tmp_path: Path
) -> None:
    telemetry = Telemetry(store, fold_every_s=1000.0)
    job = watched(telemetry, tmp_path)
    # Five reports found by one read (written while the manager was not looking): the latest,
    # step 40, is where the job was at 100 s; the earlier ones were written before.
    job.write(*({"step": float(step)} for step in range(0, 50, 10)))
    telemetry.poll(100.0)
    job.write({"step": 70}, {"step": 90})
    telemetry.poll(110.0)
    telemetry.unwatch("1", 110.0)
    # (90 - 40) / 10 = 5 steps/s; from the read's first report (step 0) it would be 9.
    assert rows(store) == {("nlp", "bert-large"): (5.0, 10.0, 1)}


def test_a_measurement_is_kept_under_the_vc_of_the_job_that_made_it(
    store: Store, tmp_path: Path
) -> None:
    telemetry = Telemetry(store, fold_every_s=1000.0)
    job = Job(tmp_path / "vision" / "rank-0.progress")
    telemetry.watch(
        "1", 1, job.path, Shape("bert-large", "gpu", 1, vc="vision"), 0.0, resumed=False
    )
    job.write({"step": 0})
    telemetry.poll(0.0)
    job.write({"step": 5000})
    telemetry.poll(10.0)
    telemetry.unwatch("1", 10.0)
    assert rows(store) == {("vision", "bert-large"): (500.0, 10.0, 1)}
    profiles = telemetry.profiles
    assert profiles.rate("bert-large", "gpu", 1, vc="vision") == 500.0
    assert profiles.rate("bert-large", "gpu", 1, vc="nlp") is None
    # An admin shares the model: stored, and nlp reads vision's measurement now.
    assert telemetry.share("bert-large", True, "root", 20.0)
    assert [(m.model, m.marked_by, m.marked_at) for m in store.shared_models()] == [
        ("bert-large", "root", 20.0)
    ]
    assert profiles.view("nlp").get(Shape("bert-large", "gpu", 1)) == Measure(500.0, 10.0, 1)
    assert Telemetry(store).profiles.shared == {"bert-large"}  # a restart reads it back
    assert telemetry.share("bert-large", False, "root", 30.0)
    assert not telemetry.share("bert-large", False, "root", 30.0)
    assert profiles.rate("bert-large", "gpu", 1, vc="nlp") is None
    assert store.shared_models() == []
