"""Philly's pre-run on a live manager (corral.core.precheck): a job's first steps run as one
worker before it holds its gang. Real processes, a real SQLite file, HTTP on loopback."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.server.boot import RunningServer
from tests.server.helpers import (
    TRAIN,
    admin_token,
    api,
    job,
    kill_jobs_of,
    start_server,
    submit,
    wait_for,
    wait_until,
)

#: Writes its rank's WORLD_SIZE and CORRAL_PRECHECK to a file named after its attempt and rank.
WHO_AM_I = (
    "import os; open(f\"seen-{os.environ['CORRAL_ATTEMPT']}-{os.environ['RANK']}\", 'w')"
    ".write(os.environ['WORLD_SIZE'] + ' ' + os.environ.get('CORRAL_PRECHECK', '-'))"
)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningServer]:
    data_dir = tmp_path / "corral"
    running = start_server(data_dir, gpus=4, progress_check_s=0.1)
    try:
        yield running
    finally:
        running.stop()
        kill_jobs_of(data_dir)


def test_a_typo_fails_in_the_pre_run_without_ever_holding_the_gang(
    server: RunningServer,
) -> None:
    client = api(server.url, admin_token(server.manager.data_dir))
    job_id = submit(
        client,
        name="typo",
        gpus=4,
        workers=4,
        max_retries=3,
        precheck=True,
        command=[sys.executable, "-c", "import torchh"],
    )
    done = wait_for(client, job_id)
    assert done["status"] == "FAILED"
    assert "pre-run" in done["reason"], done["reason"]
    (attempt,) = done["attempt_history"]  # no retry, whatever max_retries
    assert len(attempt["gpus"]) == 1 and attempt["outcome"] == "failed"
    assert "No module named 'torchh'" in attempt["reason"]


def test_a_good_job_passes_its_pre_run_on_its_first_report_then_runs_its_gang(
    server: RunningServer, tmp_path: Path
) -> None:
    client = api(server.url, admin_token(server.manager.data_dir))
    workdir = tmp_path / "work"
    workdir.mkdir()
    # train.py reports every step (by hand); it runs 20 steps of 0.05 s as each worker.
    (workdir / "who.py").write_text(WHO_AM_I)
    command = f"{sys.executable} who.py && exec {sys.executable} {TRAIN}"
    job_id = submit(
        client,
        name="good",
        gpus=2,
        workers=2,
        precheck=600,  # passes by its first report, long before
        command=command,
        workdir=str(workdir),
        env={"TRAIN_STEPS": "20", "STEP_SECONDS": "0.05"},
    )
    done = wait_for(client, job_id)
    assert done["status"] == "SUCCEEDED", (done["reason"], done["attempt_history"])
    first, second = done["attempt_history"]
    assert len(first["gpus"]) == 1 and first["outcome"] == "pre-run"
    assert len(second["gpus"]) == 2 and second["outcome"] == "succeeded"
    assert (workdir / "seen-1-0").read_text() == "1 1"  # one worker, told it is a pre-run
    assert not (workdir / "seen-1-1").exists()
    assert (workdir / "seen-2-0").read_text() == "2 -"  # its whole gang
    assert (workdir / "seen-2-1").read_text() == "2 -"
    kinds = [event["kind"] for event in done["events"]]
    assert "pre-run passed" in kinds and "preempted" not in kinds
    assert done["preemptions"] == 0


def test_a_pre_run_that_reports_and_runs_on_passes_by_its_report(
    server: RunningServer, tmp_path: Path
) -> None:
    # As a pre-run (CORRAL_PRECHECK set) the job reports its 20 steps and then keeps running for
    # 120 s; its pre-run limit is 600 s. So only its first report can pass it (an exit or the
    # timer would come minutes later): the pre-run ends with the manager's "its pre-run passed",
    # not "exited 0", and the gang then runs the 20 steps and ends.
    client = api(server.url, admin_token(server.manager.data_dir))
    command = (
        f'{sys.executable} {TRAIN} && if [ -n "${{CORRAL_PRECHECK:-}}" ]; then exec sleep 120; fi'
    )
    job_id = submit(
        client,
        name="reports",
        gpus=2,
        workers=2,
        precheck=600,
        command=command,
        workdir=str(tmp_path),
        env={"TRAIN_STEPS": "20", "STEP_SECONDS": "0.05"},
        grace_seconds=1,
    )
    done = wait_for(client, job_id, timeout=90)
    assert done["status"] == "SUCCEEDED", (done["reason"], done["attempt_history"])
    first, second = done["attempt_history"]
    assert len(first["gpus"]) == 1 and first["outcome"] == "pre-run"
    assert len(second["gpus"]) == 2 and second["outcome"] == "succeeded"
    passed = [e["message"] for e in done["events"] if e["kind"] == "pre-run passed"]
    assert passed == ["its pre-run passed"]


def test_a_silent_pre_run_passes_by_its_timer_and_one_that_exits_0_passes(
    server: RunningServer,
) -> None:
    client = api(server.url, admin_token(server.manager.data_dir))
    silent = submit(
        client,
        name="silent",
        gpus=2,
        workers=2,
        precheck=1,
        command="exec sleep 600",
        grace_seconds=1,
    )
    quick = submit(client, name="quick", gpus=2, workers=2, precheck=True, command="true")
    wait_for(client, quick)
    done = job(client, quick)
    assert done["status"] == "SUCCEEDED"
    assert [len(a["gpus"]) for a in done["attempt_history"]] == [1, 2]
    assert done["attempt_history"][0]["outcome"] == "pre-run"

    def gang_started() -> dict | None:
        found = job(client, silent)
        return found if len(found["attempt_history"]) == 2 else None

    found = wait_until(gang_started, "the silent job's gang after its pre-run's timer")
    first, second = found["attempt_history"]
    assert len(first["gpus"]) == 1 and first["outcome"] == "pre-run"
    assert len(second["gpus"]) == 2
    # The timer passed it: at least a second after its pre-run started.
    passed = next(e for e in found["events"] if e["kind"] == "pre-run passed")
    assert passed["at"] - first["started_at"] >= 1.0
    client.post(f"/api/v1/jobs/{silent}/cancel")
    assert wait_for(client, silent)["status"] == "CANCELLED"
