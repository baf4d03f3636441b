"""kill -9 the server (a real `corral up` process) while jobs run: nothing is lost, nothing runs twice."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from corral.exec.local import kill_attempt
from tests.server.helpers import (
    Corral,
    job,
    kill_jobs_of,
    python_job,
    submit,
    wait_for,
    wait_until,
)


@pytest.fixture
def corral(tmp_path: Path) -> Iterator[Corral]:
    server = Corral(tmp_path / "corral")
    try:
        yield server
    finally:
        try:
            server.stop()
        finally:
            kill_jobs_of(server.data_dir)


# Records its start, then runs until the file named by its argument exists: the test, not a fixed
# length, decides that the job outlives the server's restart, however slow the machine.
GATED = (
    "import os, pathlib, sys, time\n"
    "pathlib.Path(os.environ['CORRAL_CHECKPOINT_DIR'], 'starts').open('a').write('start\\n')\n"
    "while not pathlib.Path(sys.argv[1]).exists():\n"
    "    time.sleep(0.05)\n"
    "print('fine', flush=True)\n"
)


def gated_job(name: str, gate: Path, **fields: object) -> dict[str, object]:
    return {"name": name, "gpus": 1, "command": [sys.executable, "-c", GATED, str(gate)], **fields}


def events(client: httpx.Client, job_id: str) -> list[str]:
    return [e["message"] for e in job(client, job_id)["events"]]


def test_jobs_keep_running_through_a_kill_9_and_are_found_again(
    corral: Corral, tmp_path: Path
) -> None:
    gate = tmp_path / "go-on"
    client = corral.start()
    running = submit(client, **gated_job("survivor", gate))
    wait_for(client, running, ["RUNNING"])
    waiting = submit(client, **python_job("queued", "pass", gpus=2))  # behind the running job
    corral.kill()
    client = corral.start()
    assert job(client, waiting)["status"] == "PENDING"  # not lost
    found = "attempt 1 found running"
    wait_until(lambda: found in events(client, running), f"event {found!r}")
    assert job(client, running)["status"] == "RUNNING"
    gate.touch()
    done = wait_for(client, running)
    assert done["status"] == "SUCCEEDED" and done["attempts"] == 1
    starts = corral.data_dir / "jobs" / running / "checkpoint" / "starts"
    assert starts.read_text() == "start\n"  # it ran once: found again, not started again
    assert wait_for(client, waiting)["status"] == "SUCCEEDED"


def test_a_job_that_died_while_the_server_was_down_is_a_lost_attempt_and_runs_again(
    corral: Corral,
) -> None:
    client = corral.start()
    code = "import os, time; time.sleep(30 if os.environ['CORRAL_ATTEMPT'] == '1' else 0)"
    job_id = submit(client, **python_job("victim", code))
    wait_for(client, job_id, ["RUNNING"])
    attempt = corral.data_dir / "jobs" / job_id / "attempt-1"
    wait_until((attempt / "workers.json").is_file, "its workers to start")
    corral.kill()
    assert kill_attempt(attempt) >= 2  # its supervisor and its worker
    client = corral.start()
    done = wait_for(client, job_id)
    assert done["status"] == "SUCCEEDED" and done["attempts"] == 2
    history = job(client, job_id)["attempt_history"]
    assert [a["outcome"] for a in history] == ["lost", "succeeded"]
    assert done["failures"] == 0  # the machine's fault, not the job's: no retry used up


def test_a_job_that_ended_while_the_server_was_down_is_recorded_from_its_result(
    corral: Corral, tmp_path: Path
) -> None:
    gate = tmp_path / "go-on"
    client = corral.start()
    job_id = submit(client, **gated_job("quick", gate))
    wait_for(client, job_id, ["RUNNING"])
    corral.kill()
    gate.touch()  # it finishes meanwhile, under its supervisor
    result = corral.data_dir / "jobs" / job_id / "attempt-1" / "result.json"
    wait_until(result.is_file, "its supervisor to write result.json")
    client = corral.start()
    done = wait_for(client, job_id)
    assert done["status"] == "SUCCEEDED" and done["attempts"] == 1 and done["exit_code"] == 0


def test_no_accepted_job_is_lost(corral: Corral) -> None:
    client = corral.start()
    ids = [submit(client, **python_job(f"j{i}", "pass", gpus=2)) for i in range(20)]
    corral.kill()  # some ran, some wait
    client = corral.start()
    assert sorted(int(j["id"]) for j in client.get("/api/v1/jobs").json()) == sorted(map(int, ids))
    for job_id in ids:  # one after another (2 GPUs each): a while on a loaded machine
        assert wait_for(client, job_id, timeout=240)["status"] == "SUCCEEDED"
    assert os.path.isdir(corral.data_dir)
