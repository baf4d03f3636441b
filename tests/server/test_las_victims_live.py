"""LAS picks its victim in `corral up`: of two running jobs it may preempt, the one of lowest
priority gives way, not the first found. Real job processes (local executor), a real SQLite file,
HTTP on loopback."""

from __future__ import annotations

import time
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


def sleeper(name: str) -> dict[str, Any]:
    return {"name": name, "gpus": 1, "command": "exec sleep 3600", "grace_seconds": 1}


def test_las_preempts_the_running_job_that_entered_the_lower_queue_last(data_dir: Path) -> None:
    # Two GPUs; LAS's first queue holds jobs under 3 GPU-seconds. A starts, B starts at least
    # 1.5 s later: each drops to the second queue after 3 s of running, A first. Within a queue
    # LAS ranks jobs by when they entered it, so B (entered last) has the lowest priority of all.
    # C arrives once both have dropped: in the first queue, it may preempt either, and takes B's
    # GPU; A runs on untouched. (Preempting the highest-priority victim first would take A's.)
    server = start_server(data_dir, gpus=2, policy="las", las_thresholds_gpu_s=[3.0])
    try:
        client = api(server.url, admin_token(data_dir))
        first = submit(client, **sleeper("A"))
        wait_for(client, first, ["RUNNING"])
        time.sleep(1.5)  # the gap between the two drops, not a wait for a condition
        second = submit(client, **sleeper("B"))
        wait_for(client, second, ["RUNNING"])
        b_running_since = time.monotonic()
        # past 3 GPU-seconds of B's running (and so of A's): both are in the second queue
        time.sleep(max(0.0, b_running_since + 4.0 - time.monotonic()))
        short = submit(client, **{**sleeper("C"), "command": "exec sleep 0.5"})
        assert wait_for(client, short)["status"] == "SUCCEEDED"
        a, b = job(client, first), job(client, second)
        assert (b["preemptions"], a["preemptions"]) == (1, 0)
        assert a["status"] == "RUNNING" and a["attempts"] == 1
        assert f"preempted by job {short}" in [e["message"] for e in b["events"]]
    finally:
        server.stop()
        kill_jobs_of(data_dir)
