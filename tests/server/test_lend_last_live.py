"""Quota's lend-last order in `corral up`: real job processes (local executor), a real SQLite
file, HTTP on loopback. Each round places the jobs within their VC's quota first and lends idle
GPUs only after them, so a borrower ahead in the queue never takes the GPU a job within its quota
is waiting for (only to be preempted for it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.server.helpers import (
    TWO_VCS,
    admin_token,
    api,
    considered,
    job,
    start_server,
    submit,
    wait_for,
)


def sleeper(name: str, vc: str) -> dict[str, Any]:
    return {"name": name, "vc": vc, "gpus": 1, "command": "exec sleep 3600", "grace_seconds": 1}


def test_a_job_within_its_quota_is_placed_before_an_earlier_borrower(data_dir: Path) -> None:
    # One machine of 2 GPUs; VCs a and b guaranteed one GPU each; fifo, quota (oversubscribe,
    # lend_last: the defaults). By hand:
    # 1. a1 (VC a) and b0 (VC b) run, each VC at its quota.
    # 2. a2 (VC a: it would borrow) arrives, then b2 (VC b): no GPU is free, both wait.
    # 3. b0 is cancelled: one GPU is free. In queue order a2 comes first, but the round first
    #    walks the jobs within their quotas: b2 (b uses 0 of 1) takes the GPU; a2 is lent
    #    nothing, and never started (in queue order it would borrow the GPU and be preempted by
    #    b2 within its quota at once).
    # 4. b2 is cancelled: the GPU is idle and nobody within a quota waits: a2 borrows it.
    server = start_server(data_dir, gpus=2, config=TWO_VCS, policy="fifo", admission="quota")
    try:
        client = api(server.url, admin_token(data_dir))
        a1 = submit(client, **sleeper("a1", "a"))
        b0 = submit(client, **sleeper("b0", "b"))
        freed = [wait_for(client, job_id, ["RUNNING"])["placement"] for job_id in (a1, b0)][1]
        a2 = submit(client, **sleeper("a2", "a"))
        assert considered(client, a2)["status"] == "PENDING"
        b2 = submit(client, **sleeper("b2", "b"))
        assert considered(client, b2)["status"] == "PENDING"

        client.post(f"/api/v1/jobs/{b0}/cancel")
        started = wait_for(client, b2, ["RUNNING"], timeout=60)
        assert started["placement"] == freed
        found = job(client, a2)
        assert (found["status"], found["attempts"], found["preemptions"]) == ("PENDING", 0, 0)
        assert job(client, a1)["status"] == "RUNNING"

        client.post(f"/api/v1/jobs/{b2}/cancel")
        borrowed = wait_for(client, a2, ["RUNNING"], timeout=60)
        assert (borrowed["attempts"], borrowed["preemptions"]) == (1, 0)
        with server.manager.lock:
            assert server.manager.scheduler.jobs[a2].borrowed
        for job_id in (a1, a2):
            client.post(f"/api/v1/jobs/{job_id}/cancel")
            assert wait_for(client, job_id)["status"] == "CANCELLED"
    finally:
        server.stop()
