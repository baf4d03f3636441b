"""A waiting job's failed search for preemption victims, in `corral up`: the scheduler remembers
that the search found too few victims, and forgets it when a running job drops below the waiting
job (LAS demotes it), so that the job then preempts. Real job processes (local executor), a real
SQLite file, HTTP on loopback, the real clock."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.server.helpers import (
    admin_token,
    api,
    considered,
    job,
    kill_jobs_of,
    start_server,
    submit,
    wait_for,
    wait_until,
)

#: LAS's first queue: jobs under this many GPU-seconds of service.
THRESHOLD_GPU_S = 6.0


def sleeper(name: str, gpus: int = 1) -> dict[str, Any]:
    return {"name": name, "gpus": gpus, "command": "exec sleep 3600", "grace_seconds": 1}


def test_a_failed_victim_search_is_forgotten_when_a_running_job_drops_below_the_waiting_one(
    data_dir: Path,
) -> None:
    # Two GPUs of one machine, las with one threshold at 6 GPU-s (a waiting job preempts only
    # running jobs of a lower queue, as Tiresias). By hand:
    # 1. A (1 GPU) runs; at 6 s of running it drops to the second queue.
    # 2. Then B (1 GPU) starts on the other GPU, in the first queue until its own 6 s.
    # 3. J (2 GPUs, first queue) arrives while B is in the first queue: it may preempt A only,
    #    whose one GPU is too few (free 0 + A's 1 < 2). The search fails and is remembered: no
    #    GPU frees, so the rounds that follow do not search again.
    # 4. At B's 6 s, B drops to the second queue, below J: J may now preempt A and B, whose two
    #    GPUs are enough, so the remembered failure must be forgotten. J preempts both and
    #    starts, not before B dropped. (A search remembered after B dropped leaves J waiting
    #    for ever: nothing ends.)
    server = start_server(data_dir, gpus=2, policy="las", las_thresholds_gpu_s=[THRESHOLD_GPU_S])
    try:
        client = api(server.url, admin_token(data_dir))
        a = submit(client, **sleeper("A"))
        a_start = wait_for(client, a, ["RUNNING"])["started_at"]
        # A past its 6 GPU-s (a wait for the clock's condition, half a second to spare)
        wait_until(lambda: time.time() >= a_start + THRESHOLD_GPU_S + 0.5, "A in the second queue")
        b = submit(client, **sleeper("B"))
        b_start = wait_for(client, b, ["RUNNING"])["started_at"]
        b_drops = b_start + THRESHOLD_GPU_S
        j = submit(client, **sleeper("J", gpus=2))
        waiting = considered(client, j)
        # The round saw J while B was still in the first queue (else this test shows nothing).
        assert time.time() < b_drops, "J was first considered after B dropped: too slow to tell"
        assert waiting["status"] == "PENDING", waiting
        assert job(client, b)["preemptions"] == 0 and job(client, a)["preemptions"] == 0

        started = wait_for(client, j, ["RUNNING"], timeout=60)
        assert started["started_at"] >= b_drops - 1e-3  # not before B dropped below it
        assert sorted(started["placement"]) == sorted(
            g for jid in (a, b) for g in job(client, jid)["attempt_history"][0]["gpus"]
        )
        for victim in (a, b):
            found = job(client, victim)
            assert found["preemptions"] == 1, found
            assert f"preempted by job {j}" in [e["message"] for e in found["events"]]
        for job_id in (a, b, j):
            client.post(f"/api/v1/jobs/{job_id}/cancel")
            assert wait_for(client, job_id)["status"] == "CANCELLED"
    finally:
        server.stop()
        kill_jobs_of(data_dir)
