"""What one tenant learns of another's jobs, through a live manager (two VCs of one GPU each, the
local executor, real job processes): a dependency on a job the submitter may not see is refused
as one on a job that does not exist."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from corral.server.boot import RunningServer
from tests.server.helpers import (
    TWO_VCS,
    admin_token,
    api,
    python_job,
    start_server,
    submit,
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
