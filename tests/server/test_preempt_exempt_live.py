"""A minimum run time before preemption in `corral up` (`preempt_exempt_s`, Slurm's
PreemptExemptTime): real job processes (local executor), a real SQLite file, HTTP on loopback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.server.helpers import (
    admin_token,
    api,
    job,
    kill_jobs_of,
    start_server,
    submit,
    wait_for,
)

EXEMPT_S = 12.0


def sleeper(name: str, seconds: float) -> dict[str, Any]:
    return {"name": name, "gpus": 1, "command": f"exec sleep {seconds}", "grace_seconds": 1}


def test_a_job_that_just_started_runs_its_exempt_time_before_it_gives_way(data_dir: Path) -> None:
    # One GPU; LAS's first queue holds jobs under 1 GPU-second, so A, running, drops to the
    # second queue after 1 s. B arrives as soon as A runs: in the first queue it may preempt A
    # from A's first second on, but A is exempt for 12 s after its start. So B starts once A has
    # run 12 s (by the manager's clock, which stamps both starts), not after about 1 s: A is
    # preempted once, B runs and ends, A resumes.
    server = start_server(
        data_dir, gpus=1, policy="las", las_thresholds_gpu_s=[1.0], preempt_exempt_s=EXEMPT_S
    )
    try:
        client = api(server.url, admin_token(data_dir))
        first = submit(client, **sleeper("A", 3600))
        wait_for(client, first, ["RUNNING"])
        second = submit(client, **sleeper("B", 0.5))
        assert wait_for(client, second)["status"] == "SUCCEEDED"
        a, b = job(client, first), job(client, second)
        waited = b["started_at"] - a["started_at"]
        assert waited >= EXEMPT_S, waited
        assert waited < EXEMPT_S + 60, waited  # woken when the exemption ended (not idle)
        assert a["preemptions"] == 1
        assert f"preempted by job {second}" in [e["message"] for e in a["events"]]
        resumed = wait_for(client, first, ["RUNNING"])
        assert resumed["attempts"] == 2
    finally:
        server.stop()
        kill_jobs_of(data_dir)
