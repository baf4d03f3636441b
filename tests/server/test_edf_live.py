"""Earliest deadline first in `corral up`: real job processes (local executor), a real SQLite
file, HTTP on loopback. A spec's `deadline` (seconds after its submission here) orders the jobs;
an earlier deadline preempts a later one, and a job without one goes after every job with one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.server.helpers import admin_token, api, considered, job, start_server, submit, wait_for


def waiter(marks: Path, name: str, deadline: float | None) -> dict[str, Any]:
    """A job that runs until the test lets it go (`go-NAME`), so its end is the test's."""
    spec: dict[str, Any] = {
        "name": name,
        "gpus": 1,
        "command": f"while [ ! -e {marks}/go-{name} ]; do sleep 0.05; done",
        "grace_seconds": 1,
    }
    return spec if deadline is None else spec | {"deadline": deadline}


def test_deadlines_order_the_jobs_and_an_earlier_one_preempts(data_dir: Path) -> None:
    # One GPU, edf. Deadlines in seconds after each job's submission (they arrive within a
    # second of each other, so their order is that of the numbers): L 1000, E 500, M 800, N none.
    # By hand:
    # 1. L runs alone.
    # 2. E (500 < 1000) arrives: it preempts L.
    # 3. M (800) and N (none) arrive: neither is earlier than E: both wait.
    # 4. E ends: M (800) starts before L (1000), though L arrived first and ran before.
    # 5. M ends: L resumes; N, without a deadline, still waits.
    # 6. L is cancelled: N starts.
    marks = data_dir.parent / "marks"
    marks.mkdir()
    server = start_server(data_dir, gpus=1, policy="edf")
    try:
        client = api(server.url, admin_token(data_dir))
        low = submit(client, **waiter(marks, "L", 1000))
        wait_for(client, low, ["RUNNING"])

        early = submit(client, **waiter(marks, "E", 500))
        wait_for(client, early, ["RUNNING"], timeout=60)
        found = job(client, low)
        assert (found["status"], found["preemptions"]) == ("PENDING", 1)
        assert [e["message"] for e in found["events"] if e["kind"] == "preempted"] == [
            f"preempted by job {early}"
        ]

        middle = submit(client, **waiter(marks, "M", 800))
        none = submit(client, **waiter(marks, "N", None))
        for job_id in (middle, none):
            assert considered(client, job_id)["status"] == "PENDING"
        assert job(client, early)["status"] == "RUNNING"
        assert job(client, early)["preemptions"] == 0

        (marks / "go-E").touch()
        assert wait_for(client, early)["status"] == "SUCCEEDED"
        wait_for(client, middle, ["RUNNING"], timeout=60)
        assert job(client, low)["status"] == "PENDING" and job(client, low)["attempts"] == 1
        assert job(client, none)["status"] == "PENDING"

        (marks / "go-M").touch()
        assert wait_for(client, middle)["status"] == "SUCCEEDED"
        resumed = wait_for(client, low, ["RUNNING"], timeout=60)
        assert resumed["attempts"] == 2
        assert job(client, none)["status"] == "PENDING"
        assert job(client, none)["attempts"] == 0

        client.post(f"/api/v1/jobs/{low}/cancel")
        assert wait_for(client, low)["status"] == "CANCELLED"
        wait_for(client, none, ["RUNNING"], timeout=60)
        (marks / "go-N").touch()
        assert wait_for(client, none)["status"] == "SUCCEEDED"
        order = [
            (job(client, j)["started_at"], name)
            for j, name in ((low, "L"), (early, "E"), (middle, "M"), (none, "N"))
        ]
        assert [name for _, name in sorted(order)] == ["L", "E", "M", "N"]
    finally:
        for name in "LEMN":
            (marks / f"go-{name}").touch()
        server.stop()
