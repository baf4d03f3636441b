"""Tiresias's Gittins index in `corral up`: real job processes (local executor), a real SQLite
file, HTTP on loopback, the real clock. The index is learned, as the live manager learns it, from
the GPU-seconds of the jobs the store says this manager finished."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from corral.server.store import JobRow, Store
from tests.server.helpers import (
    admin_token,
    api,
    job,
    start_server,
    submit,
    wait_for,
    wait_until,
)

SLEEPER = {"gpus": 1, "command": "exec sleep 3600", "grace_seconds": 1}
#: The finished jobs' sizes (GPU-seconds): three in four end after 3, the others after 13.
HISTORY = [3.0] * 15 + [13.0] * 5


def finished_history(data_dir: Path, sizes: list[float]) -> None:
    """The store of a manager that already ran jobs of these sizes to success."""
    data_dir.mkdir(parents=True)
    store = Store(Store.sqlite_url(data_dir))
    try:
        for number, size in enumerate(sizes, start=1):
            spec = {"name": f"past-{number}", "gpus": 1, "command": "true"}
            row = JobRow.new(
                number,
                name=spec["name"],
                user="admin",
                vc="default",
                priority="guaranteed",
                gpus=1,
                spec=spec,
                submitted_at=time.time() - 3600,
            )
            store.insert_jobs([row])
            store.update_job(number, status="SUCCEEDED", attained_gpu_s=size)
    finally:
        store.close()


def event_at(found: dict[str, Any], kind: str, message: str) -> float:
    (at,) = [e["at"] for e in found["events"] if e["kind"] == kind and e["message"] == message]
    return float(at)


def attempts(client: httpx.Client, job_id: str) -> list[dict[str, Any]]:
    return list(job(client, job_id)["attempt_history"])


def test_gittins_ranks_jobs_by_the_index_learned_from_finished_jobs(data_dir: Path) -> None:
    # The manager learned its job sizes from 20 finished jobs: 15 of 3 GPU-s, 5 of 13. Its index
    # levels are 0, the samples 3 and 13, the quantiles (3, 13 and, between them, the 0.75
    # quantile 3 + 0.25 x 10 = 5.5) and the LAS thresholds (3600, 36000). Worked out by hand,
    # G(a) = max over quanta d of P(S - a <= d | S > a) / E[min(S - a, d) | S > a]:
    #   a in [0, 3):    d=3: 0.75 / 3 = 0.25;  d=13: 1 / ((15x3 + 5x13)/20) = 0.18  -> 0.25
    #   a in [3, 5.5):  only the 13s are left, 10 to go:                          -> 0.1
    #   a in [5.5, 13): 7.5 to go (the index of level 5.5):                       -> 0.133
    # The index falls at 3 GPU-s (the job was not a short one) and rises again at 5.5 (the long
    # ones are nearer their end): not monotone in the service attained, as LAS's order is.
    # One GPU:
    # 1. A starts; B (arrived just after, 0.3 s long) waits: both at 0.25, A arrived first.
    # 2. At A's 3 GPU-s its index falls to 0.1 < 0.25: B preempts A (fifo never preempts; LAS,
    #    with its thresholds at 3600 GPU-s, would not either). B ends; A resumes at 0.1.
    # 3. Once A has 5.5 GPU-s (0.133), D arrives (0.25): D preempts A.
    # 4. At D's 3 GPU-s its index falls to 0.1 < A's 0.133: A, which attained MORE service,
    #    preempts D (LAS, whatever its thresholds, never prefers the job with more service).
    finished_history(data_dir, HISTORY)
    server = start_server(data_dir, gpus=1, policy="gittins")
    try:
        with server.manager.lock:
            policy: Any = server.manager.scheduler.policy
            assert sorted(policy.samples) == HISTORY  # learned from the store
            assert policy.grid[:4] == [0.0, 3.0, 5.5, 13.0]
            assert [round(i, 3) for i in policy.index_at[:4]] == [0.25, 0.1, 0.133, 0.0]
        client = api(server.url, admin_token(data_dir))
        a = submit(client, name="a", **SLEEPER)
        b = submit(client, name="b", **(SLEEPER | {"command": "exec sleep 0.3"}))
        wait_for(client, a, ["RUNNING"])
        assert job(client, b)["status"] == "PENDING"

        # 2. B preempts A when, and only when, A has 3 GPU-s (the epoch clock's rounding aside).
        wait_for(client, b, ["RUNNING", "SUCCEEDED"], timeout=60)
        # (A job's `started_at` is the scheduler's first start, from which it counts service;
        # an attempt's is when its processes were launched, once the GPU's owner had left.)
        found = job(client, a)
        preempted = event_at(found, "preempted", f"preempted by job {b}")
        first_run = preempted - found["started_at"]
        assert 3.0 - 1e-3 <= first_run < 5.5  # at the level 3, not the next one
        assert wait_for(client, b)["status"] == "SUCCEEDED"
        assert job(client, b)["preemptions"] == 0
        wait_until(lambda: len(attempts(client, a)) == 2, "A resumed")

        # 3. A runs on to 5.5 GPU-s of service (as the scheduler counts it), then D arrives.
        def attained(job_id: str) -> float:
            with server.manager.lock:
                scheduled = server.manager.scheduler.jobs[job_id]
                return float(scheduled.attained_at(time.time()))

        wait_until(lambda: attained(a) >= 5.6, "A past 5.5 GPU-s", timeout=60)
        assert job(client, a)["status"] == "RUNNING" and job(client, a)["attempts"] == 2
        d = submit(client, name="d", **SLEEPER)
        wait_for(client, d, ["RUNNING"], timeout=60)
        # D preempted A while A's index was 0.133: before A's 13 GPU-s, where it falls to 0.
        found = job(client, a)
        second_run = (
            event_at(found, "preempted", f"preempted by job {d}")
            - (found["attempt_history"][1]["started_at"])
        )
        assert 5.5 <= first_run + second_run < 13.0

        # 4. A takes the GPU back from D at D's 3 GPU-s.
        wait_until(lambda: len(attempts(client, a)) == 3, "A back on the GPU", timeout=60)
        found_d = job(client, d)
        back = event_at(found_d, "preempted", f"preempted by job {a}")
        assert 3.0 - 1e-3 <= back - found_d["started_at"] < 5.5
        assert job(client, a)["preemptions"] == 2
        for job_id in (a, d):
            client.post(f"/api/v1/jobs/{job_id}/cancel")
            assert wait_for(client, job_id)["status"] == "CANCELLED"
    finally:
        server.stop()
