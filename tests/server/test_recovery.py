"""kill -9 the server (a real `corral up` process) while jobs run: nothing is lost, nothing runs twice."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.exec.local import kill_attempt
from tests.server.helpers import (
    Corral,
    job,
    kill_jobs_of,
    python_job,
    submit,
    wait_for,
)


@pytest.fixture
def corral(tmp_path: Path) -> Iterator[Corral]:
    server = Corral(tmp_path / "corral")
    yield server
    server.stop()
    kill_jobs_of(server.data_dir)


RUN_ONCE = (
    "import os, pathlib, time; "
    "pathlib.Path(os.environ['CORRAL_CHECKPOINT_DIR'], 'starts').open('a').write('start\\n'); "
    "time.sleep(3)"
)


def test_jobs_keep_running_through_a_kill_9_and_are_found_again(corral: Corral) -> None:
    client = corral.start()
    running = submit(client, **python_job("survivor", RUN_ONCE))
    wait_for(client, running, ["RUNNING"])
    waiting = submit(client, **python_job("queued", "pass", gpus=2))  # behind the running job
    time.sleep(0.3)
    corral.kill()
    time.sleep(0.5)
    client = corral.start()
    assert job(client, waiting)["status"] in ("PENDING", "RUNNING", "SUCCEEDED")  # not lost
    done = wait_for(client, running, timeout=30)
    assert done["status"] == "SUCCEEDED" and done["attempts"] == 1
    starts = corral.data_dir / "jobs" / running / "checkpoint" / "starts"
    assert starts.read_text() == "start\n"  # it ran once: found again, not started again
    events = [e["message"] for e in job(client, running)["events"]]
    assert "attempt 1 found running" in events
    assert wait_for(client, waiting, timeout=30)["status"] == "SUCCEEDED"


def test_a_job_that_died_while_the_server_was_down_is_a_lost_attempt_and_runs_again(
    corral: Corral,
) -> None:
    client = corral.start()
    code = "import os, time; time.sleep(30 if os.environ['CORRAL_ATTEMPT'] == '1' else 0)"
    job_id = submit(client, **python_job("victim", code))
    wait_for(client, job_id, ["RUNNING"])
    attempt = corral.data_dir / "jobs" / job_id / "attempt-1"
    deadline = time.monotonic() + 10
    while not (attempt / "workers.json").is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    corral.kill()
    assert kill_attempt(attempt) >= 2  # its supervisor and its worker
    client = corral.start()
    done = wait_for(client, job_id, timeout=30)
    assert done["status"] == "SUCCEEDED" and done["attempts"] == 2
    history = job(client, job_id)["attempt_history"]
    assert [a["outcome"] for a in history] == ["lost", "succeeded"]
    assert done["failures"] == 0  # the machine's fault, not the job's: no retry used up


def test_a_job_that_ended_while_the_server_was_down_is_recorded_from_its_result(
    corral: Corral,
) -> None:
    client = corral.start()
    job_id = submit(client, **python_job("quick", "import time; time.sleep(1); print('fine')"))
    wait_for(client, job_id, ["RUNNING"])
    corral.kill()
    time.sleep(2.0)  # it finishes meanwhile, under its supervisor
    assert (corral.data_dir / "jobs" / job_id / "attempt-1" / "result.json").is_file()
    client = corral.start()
    done = wait_for(client, job_id, timeout=15)
    assert done["status"] == "SUCCEEDED" and done["attempts"] == 1 and done["exit_code"] == 0


def test_no_accepted_job_is_lost(corral: Corral) -> None:
    client = corral.start()
    ids = [submit(client, **python_job(f"j{i}", "pass", gpus=2)) for i in range(20)]
    corral.kill()  # some ran, some wait
    client = corral.start()
    assert sorted(int(j["id"]) for j in client.get("/api/v1/jobs").json()) == sorted(map(int, ids))
    for job_id in ids:
        assert wait_for(client, job_id, timeout=30)["status"] == "SUCCEEDED"
    assert os.path.isdir(corral.data_dir)
