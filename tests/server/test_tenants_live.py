"""What one tenant learns of another's jobs, through a live manager (two VCs of one GPU each, the
local executor, real job processes): a dependency on a job the submitter may not see is refused
as one on a job that does not exist, and events, reasons and the queue name such a job without
its id."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.server.boot import RunningServer
from corral.server.redact import HIDDEN, job_ids
from tests.server.helpers import (
    TWO_VCS,
    admin_token,
    api,
    job,
    python_job,
    start_server,
    submit,
    wait_for,
    wait_until,
)

SLEEPER = "import time; time.sleep(600)"


@pytest.fixture
def two_vcs(data_dir: Path) -> Iterator[RunningServer]:
    running = start_server(data_dir, gpus=2, config=TWO_VCS)
    try:
        yield running
    finally:
        running.stop()


def user(server: RunningServer, admin: httpx.Client, name: str, vc: str | None) -> httpx.Client:
    body = {"user": name} | ({"vc": vc} if vc is not None else {})
    answer = admin.post("/api/v1/tokens", json=body)
    assert answer.status_code == 201, answer.text
    return api(server.url, answer.json()["token"])


def test_after_a_job_the_submitter_may_not_see_is_refused_as_if_it_did_not_exist(
    two_vcs: RunningServer, data_dir: Path
) -> None:
    admin = api(two_vcs.url, admin_token(data_dir))
    alice = user(two_vcs, admin, "alice", "a")
    bob = user(two_vcs, admin, "bob", "b")
    carol = user(two_vcs, admin, "carol", "a")  # alice's VC: she may see alice's jobs
    hers = submit(alice, **python_job("hers", "pass"))
    missing = str(int(hers) + 1000)
    answers = {
        job_id: bob.post("/api/v1/jobs", json=python_job("mine", "pass", after=[int(job_id)]))
        for job_id in (hers, missing)
    }
    for job_id, answer in answers.items():
        assert answer.status_code == 422, answer.text
        assert answer.json() == {"detail": f"after.0: no job {job_id}"}
    second = bob.post("/api/v1/jobs", json=python_job("mine", "pass", after=[1000, int(hers)]))
    assert second.json() == {"detail": "after.0: no job 1000"}
    mine = submit(bob, **python_job("own", "pass"))
    assert submit(bob, **python_job("after-own", "pass", after=[int(mine)]))
    assert submit(carol, **python_job("after-hers", "pass", after=[int(hers)]))
    assert submit(admin, **python_job("after-hers", "pass", vc="a", after=[int(hers)]))
    # Nothing bob was refused was stored.
    assert {j["name"] for j in bob.get("/api/v1/jobs").json()} == {"own", "after-own"}


def texts(found: dict[str, Any]) -> list[str]:
    """Every text of a job's detail that can name another job."""
    return [
        found["reason"],
        *(a["reason"] for a in found["attempt_history"]),
        *(e["message"] for e in found["events"]),
    ]


def test_a_job_the_reader_may_not_see_is_named_without_its_id(
    two_vcs: RunningServer, data_dir: Path
) -> None:
    """bob's two jobs run, one on VC a's idle GPU; alice's job takes it back (quota): bob's job
    is preempted by a job of VC a, which bob may not see. alice (with a token of VC b as well,
    for the team she helps) and an admin see the id; bob sees "another tenant's job"."""
    admin = api(two_vcs.url, admin_token(data_dir))
    alice = user(two_vcs, admin, "alice", "a")
    alice_in_b = user(two_vcs, admin, "alice", "b")  # sees VC b's jobs, and her own
    bob = user(two_vcs, admin, "bob", "b")
    first = submit(bob, **python_job("first", SLEEPER, grace_seconds=1))
    second = submit(bob, **python_job("second", SLEEPER, grace_seconds=1))
    for job_id in (first, second):
        wait_for(bob, job_id, ["RUNNING"])
    hers = submit(alice, **python_job("hers", SLEEPER))
    wait_for(alice, hers, ["RUNNING"])
    preempted = wait_until(
        lambda: next(
            (j for j in (job(bob, first), job(bob, second)) if j["preemptions"] == 1), None
        ),
        "one of bob's jobs preempted",
    )["id"]
    named = f"preempted by job {hers}"
    shown = f"preempted by {HIDDEN}"
    for reader, sees in ((admin, True), (alice_in_b, True), (bob, False)):
        found = job(reader, preempted)
        events = [e["message"] for e in found["events"] if e["kind"] == "preempted"]
        assert events == [named if sees else shown], (reader, found["events"])
        listed = {j["id"]: j for j in reader.get("/api/v1/jobs").json()}
        queued = {j["id"]: j for j in reader.get("/api/v1/queue").json()["jobs"]}
        everything = [*texts(found), listed[preempted]["reason"]]
        everything += [j["reason"] for j in queued.values()]
        if sees:
            assert any(named in text for text in everything)
            continue
        visible = set(listed)
        for text in everything:
            assert not re.search(rf"\bjob {hers}\b", text), text
            assert job_ids(text) <= visible, text
    assert job(bob, preempted)["preemptions"] == 1
    assert bob.get(f"/api/v1/jobs/{hers}").status_code == 404
