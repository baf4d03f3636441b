"""The quota admission acts on `priority: opportunistic` in `corral up` (HiveD's low priority):
an opportunistic job only borrows idle GPUs, counts in no VC's quota, never preempts, and is the
first to go. One machine of 2 GPUs; VCs `a` and `b` are guaranteed one GPU each."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.server.boot import RunningServer
from tests.server.helpers import (
    TWO_VCS,
    admin_token,
    api,
    job,
    kill_jobs_of,
    start_server,
    submit,
    wait_for,
)

SLEEPER = {"gpus": 1, "command": "exec sleep 3600", "grace_seconds": 1}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningServer]:
    data_dir = tmp_path / "corral"
    running = start_server(data_dir, gpus=2, config=TWO_VCS, policy="fifo", admission="quota")
    try:
        yield running
    finally:
        running.stop()
        kill_jobs_of(data_dir)


def test_an_opportunistic_job_on_its_own_vcs_gpu_gives_it_back_to_a_guaranteed_one(
    server: RunningServer,
) -> None:
    client = api(server.url, admin_token(server.manager.data_dir))
    # b's opportunistic job takes b's idle GPU, but not b's quota ...
    opportunist = submit(client, name="b-opp", vc="b", priority="opportunistic", **SLEEPER)
    assert wait_for(client, opportunist, ["RUNNING"])["placement"]
    a_own = submit(client, name="a-own", vc="a", **SLEEPER)
    wait_for(client, a_own, ["RUNNING"])
    # ... so b's guaranteed job, within b's quota, takes it back (fifo never preempts within a
    # quota: only an opportunistic job is taken back this way).
    b_own = submit(client, name="b-own", vc="b", **SLEEPER)
    assert wait_for(client, b_own, ["RUNNING"])["placement"]
    found = wait_for(client, opportunist, ["PENDING"])
    assert found["preemptions"] == 1
    assert job(client, a_own)["status"] == "RUNNING"


def test_an_opportunistic_job_never_preempts_and_waits_for_an_idle_gpu(
    server: RunningServer,
) -> None:
    client = api(server.url, admin_token(server.manager.data_dir))
    first = submit(client, name="a-own", vc="a", **SLEEPER)
    second = submit(client, name="b-own", vc="b", **SLEEPER)
    for job_id in (first, second):
        wait_for(client, job_id, ["RUNNING"])
    waiting = submit(client, name="a-opp", vc="a", priority="opportunistic", **SLEEPER)
    found = job(client, waiting)
    assert found["status"] == "PENDING"
    client.post(f"/api/v1/jobs/{second}/cancel")
    assert wait_for(client, waiting, ["RUNNING"])["placement"]  # b's GPU, idle now
    assert job(client, first)["status"] == "RUNNING"
