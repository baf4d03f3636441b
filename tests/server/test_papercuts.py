"""The client commands' papercuts, against a real manager (4 declared GPUs, SQLite, real
processes): `ls --name` finds an array's tasks and takes a glob, at the server; `hold --array`
holds the pending tasks and skips the running one; `ls` prints a long reason whole."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner, Result

from corral.cli.main import app
from corral.server.boot import RunningServer
from tests.server.helpers import admin_token, api, kill_jobs_of, start_server, wait_until


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    data_dir = tmp_path_factory.mktemp("corral-data")
    running = start_server(data_dir, gpus=4)
    try:
        yield running
    finally:
        try:
            with api(running.url, admin_token(data_dir)) as client:
                for job in client.get("/api/v1/jobs", params={"limit": 1000}).json():
                    if job["status"] in ("PENDING", "RUNNING"):
                        client.post(f"/api/v1/jobs/{job['id']}/cancel")
        finally:
            running.stop()
            kill_jobs_of(data_dir)


@pytest.fixture
def client(server: RunningServer) -> Iterator[httpx.Client]:
    with api(server.url, admin_token(server.manager.data_dir)) as http:
        yield http
        # Each test leaves an idle cluster: what it left waiting or running is cancelled.
        for job in http.get("/api/v1/jobs", params={"limit": 1000}).json():
            if job["status"] in ("PENDING", "RUNNING"):
                http.post(f"/api/v1/jobs/{job['id']}/cancel")


def cli(server: RunningServer, *args: str) -> Result:
    env = {"CORRAL_URL": server.url, "CORRAL_TOKEN": admin_token(server.manager.data_dir)}
    return CliRunner().invoke(app, list(args), env=env)


def submit(client: httpx.Client, **spec: object) -> dict[str, object]:
    answer = client.post("/api/v1/jobs", json=spec)
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


def job(client: httpx.Client, job_id: str) -> dict[str, object]:
    return dict(client.get(f"/api/v1/jobs/{job_id}").json())


def listed(server: RunningServer, name: str) -> list[str]:
    result = cli(server, "ls", "--all", "--name", name, "-o", "json")
    assert result.exit_code == 0, result.output
    return sorted((job["id"] for job in json.loads(result.stdout)), key=int)


def test_ls_name_selects_an_arrays_tasks_and_takes_a_glob(
    server: RunningServer, client: httpx.Client
) -> None:
    tasks = [str(t) for t in submit(client, name="sweep", gpus=1, command="true", array="0-2")[
        "array_tasks"
    ]]  # fmt: skip
    ids = {
        name: str(submit(client, name=name, gpus=1, command="true")["id"])
        for name in ("sweep-x", "sweeper", "other", "a.b", "axb")
    }
    # By hand: the tasks are named sweep[0], sweep[1], sweep[2].
    assert listed(server, "sweep") == tasks  # the array's name: its three tasks
    assert listed(server, "sweep[1]") == [tasks[1]]  # one task, by its own name
    assert listed(server, "sweep*") == sorted([*tasks, ids["sweep-x"], ids["sweeper"]], key=int)
    assert listed(server, "sweep-?") == [ids["sweep-x"]]
    assert listed(server, "sweep[!-]*") == sorted([*tasks, ids["sweeper"]], key=int)
    assert listed(server, "a.b") == [ids["a.b"]]  # '.' is a character, not "any"
    assert listed(server, "a?b") == sorted([ids["a.b"], ids["axb"]], key=int)
    assert listed(server, "SWEEP") == []  # case-sensitive, as a shell's glob
    assert listed(server, "swee") == []  # a name, not a prefix
    # At the server: the API's filter answers the same, one page of it at a time.
    page = client.get("/api/v1/jobs", params={"name": "sweep", "limit": 2})
    assert [j["id"] for j in page.json()] == [tasks[2], tasks[1]]  # newest first
    assert page.headers["X-Corral-Next-Before-Id"] == tasks[1]


def test_hold_array_holds_the_pending_tasks_and_skips_the_running_one(
    server: RunningServer, client: httpx.Client
) -> None:
    # Each task takes all 4 GPUs: task 0 runs, tasks 1 and 2 wait.
    tasks = [
        str(t)
        for t in submit(client, name="hog", gpus=4, command="sleep 60", array="0-2")["array_tasks"]
    ]
    wait_until(lambda: job(client, tasks[0])["status"] == "RUNNING", "task 0 running")
    held = cli(server, "hold", "--array", tasks[0])
    assert held.exit_code == 0, held.output
    assert held.stdout == (
        f"array {tasks[0]}: 2 tasks held; 1 skipped: job {tasks[0]} is RUNNING: only a pending "
        "job can be held\n"
    )
    assert [job(client, t)["held_by"] for t in tasks] == [None, "admin", "admin"]
    answer = client.post(f"/api/v1/jobs/{tasks[0]}/hold", params={"array": "true"}).json()
    assert answer["array_tasks"] == tasks[1:] and list(answer["array_skipped"]) == [tasks[0]]
    released = cli(server, "release", "--array", tasks[0])
    assert released.exit_code == 0, released.output
    assert released.stdout == (
        f"array {tasks[0]}: 2 tasks released; 1 skipped: job {tasks[0]} is not held\n"
    )
    assert [job(client, t)["held_by"] for t in tasks] == [None, None, None]


def test_ls_prints_a_long_reason_whole_and_says_same_priority(
    server: RunningServer, client: httpx.Client
) -> None:
    blocker = str(submit(client, name="big", gpus=4, command="sleep 60")["id"])
    wait_until(lambda: job(client, blocker)["status"] == "RUNNING", "the blocker running")
    first = str(submit(client, name="first", gpus=2, command="true")["id"])
    second = str(submit(client, name="second", gpus=2, command="true")["id"])

    def reason_of_second() -> str | None:
        reason = str(job(client, second)["reason"])
        return reason if "position 2 of 2" in reason else None

    reason = wait_until(reason_of_second, "the second's place in the queue")
    # Both at level 0: the second is behind the first by the policy's order, not by priority.
    assert "higher-priority" not in reason, reason
    assert "of the same priority" in reason, reason
    informative = reason.split("; ", 1)[1]
    assert len(informative) > 60, informative  # `ls` used to cut it at 60 characters
    rows = cli(server, "ls").stdout.splitlines()
    row = next(r for r in rows if r.split()[0] == second)
    assert row.endswith(informative), row
    assert first in {r.split()[0] for r in rows}


@pytest.fixture(autouse=True)
def _tmp_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # jobs run where they are submitted from
