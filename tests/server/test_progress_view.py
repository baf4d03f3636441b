"""What the manager shows of a job's progress between its reports: the last loss known (a report
without one, such as the Hugging Face callback's step-only reports, keeps it), the run's total
steps from its reports where its spec declares none, and an ETA that counts down only while the
attempt that reported runs (a preempted job waiting to resume, or restarting, does not reach 0).

The telemetry is the manager's own (corral.server.telemetry) on a real SQLite store, reading a
real progress file that the test appends to, at instants of a fake clock."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.core.profiles import Shape
from corral.server.store import JobProgress, Store
from corral.server.telemetry import Telemetry

SHAPE = Shape("mlp", "gpu", 1)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(Store.sqlite_url(tmp_path))
    try:
        for job_id, spec in ((1, {}), (2, {"total_steps": 50})):
            store.insert_job(
                job_id,
                name=f"j{job_id}",
                user="bob",
                vc="default",
                priority="guaranteed",
                gpus=1,
                spec=spec,
                submitted_at=0.0,
            )
        yield store
    finally:
        store.close()


def append(path: Path, *reports: dict[str, float]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write("".join(json.dumps(report) + "\n" for report in reports))


def progress(store: Store, job_id: int) -> JobProgress:
    row = store.get_job(job_id)
    assert row is not None and row.progress is not None
    return row.progress


def test_a_report_without_a_loss_keeps_the_last_loss_known(store: Store, tmp_path: Path) -> None:
    telemetry = Telemetry(store)
    path = tmp_path / "rank-0.progress"
    telemetry.watch("1", 1, path, SHAPE, 100.0, resumed=False)
    append(path, {"step": 1, "loss": 0.5})
    telemetry.poll(101.0)
    assert progress(store, 1).loss == 0.5
    append(path, {"step": 2})  # a step-only report (the Trainer logs its loss every N steps)
    telemetry.poll(102.0)
    assert (progress(store, 1).step, progress(store, 1).loss) == (2, 0.5)
    # Within one read: the newest report that has a loss gives it (0.25, not step 4's none).
    append(path, {"step": 3, "loss": 0.25}, {"step": 4})
    telemetry.poll(103.0)
    assert (progress(store, 1).step, progress(store, 1).loss) == (4, 0.25)
    # A new attempt (after a preemption) shows the last loss until it reports one of its own.
    telemetry.unwatch("1", 104.0)
    second = tmp_path / "attempt-2" / "rank-0.progress"
    telemetry.watch("1", 2, second, SHAPE, 110.0, resumed=False)
    append(second, {"step": 5})
    telemetry.poll(111.0)
    assert (progress(store, 1).step, progress(store, 1).loss) == (5, 0.25)
    append(second, {"step": 6, "loss": 0.125})
    telemetry.poll(112.0)
    assert progress(store, 1).loss == 0.125


def test_the_total_steps_come_from_the_reports_unless_the_spec_declares_them(
    store: Store, tmp_path: Path
) -> None:
    telemetry = Telemetry(store)
    undeclared, declared = tmp_path / "j1.progress", tmp_path / "j2.progress"
    telemetry.watch("1", 1, undeclared, SHAPE, 100.0, resumed=False)
    telemetry.watch("2", 1, declared, SHAPE, 100.0, resumed=False, declared_total=True)
    assert store.get_job(1).progress is None  # type: ignore[union-attr]
    append(undeclared, {"step": 1, "total_steps": 400})
    append(declared, {"step": 1, "total_steps": 400})
    telemetry.poll(101.0)
    assert progress(store, 1).total_steps == 400  # said by the job's callback
    assert progress(store, 2).total_steps == 50  # the spec's total_steps wins
    # A report without it keeps the total known; a later one that changes it is taken.
    append(undeclared, {"step": 2})
    telemetry.poll(102.0)
    assert progress(store, 1).total_steps == 400
    append(undeclared, {"step": 3, "total_steps": 600})
    telemetry.poll(103.0)
    assert progress(store, 1).total_steps == 600


def test_the_eta_counts_down_only_while_the_reporting_attempt_runs() -> None:
    # Step 40 of 100 at 2 steps/s, read at t=100: 60 steps, 30 s left at t=100.
    shown = JobProgress(step=40, at=100.0, total_steps=100, steps_per_s=2.0)
    # Running since t=90 (the attempt that reported): 10 s later, 20 s left; past the end, 0.
    assert shown.eta_s(110.0, running_since=90.0) == 20.0
    assert shown.eta_s(200.0, running_since=90.0) == 0.0
    # Preempted at t=105 and waiting (not running): its 60 steps still take 30 s, however
    # long it waits; not 0 s.
    assert shown.eta_s(200.0, running_since=None) == 30.0
    # Restarted at t=150, its new attempt not reported yet: still 30 s, not 0 s.
    assert shown.eta_s(200.0, running_since=150.0) == 30.0
    # Not known without a rate or a total.
    assert JobProgress(step=40, at=100.0, total_steps=100).eta_s(110.0, 90.0) is None
    assert JobProgress(step=40, at=100.0, steps_per_s=2.0).eta_s(110.0, 90.0) is None
