"""Optimus on a live manager: real processes (examples/train.py) report their losses, the manager
fits each job's loss curve, and the fits decide which waiting job gets a free GPU."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx

from corral.cli.client import describe_text
from corral.server.boot import RunningServer
from tests.server.helpers import (
    TRAIN,
    admin_token,
    api,
    job,
    python_job,
    start_server,
    submit,
    wait_for,
    wait_until,
)


def learner(name: str, learning_rate: float) -> dict[str, Any]:
    """train.py for ever (stopped by the test): its loss converges by Optimus's fit near step
    8 / learning_rate (examples/train.py; tests/exec/test_train_example.py measures it)."""
    return {
        "name": name,
        "gpus": 1,
        "command": [sys.executable, str(TRAIN)],
        "env": {
            "TRAIN_STEPS": "1000000",
            "STEP_SECONDS": "0.05",
            "LEARNING_RATE": str(learning_rate),
        },
        "grace_seconds": 10,
    }


def until_file(name: str, path: Path) -> dict[str, Any]:
    """A job of level 1 (above the learners) that runs until `path` exists; reports nothing."""
    code = f"import os, time\nwhile not os.path.exists({str(path)!r}): time.sleep(0.05)"
    return python_job(name, code, level=1)


def step_of(client: httpx.Client, job_id: str) -> float:
    return float((job(client, job_id)["progress"] or {}).get("step", 0))


def stop_all(client: httpx.Client, server: RunningServer, job_ids: list[str]) -> None:
    try:
        for job_id in job_ids:
            client.post(f"/api/v1/jobs/{job_id}/cancel")
    finally:
        server.stop()


def test_optimus_gives_a_free_gpu_to_the_job_its_fit_says_ends_first(
    data_dir: Path, tmp_path: Path
) -> None:
    """Two learners run on the 2 GPUs and report their losses: `slow` (learning rate 0.01, its
    curve converging near step 8 / 0.01 = 800) was submitted before `quick` (0.05: near step
    160). Two jobs of a higher level take both GPUs (both learners are preempted, and wait with
    the estimates Optimus fitted then); one of them ends, freeing one GPU. Worked out by hand:
    with about 40 steps done each, `slow` has about 760 steps left and `quick` about 120, at the
    same speed (0.05 s of sleep a step): Optimus's key puts `quick` first, and it restarts while
    `slow` waits. fifo (or Optimus with a constant key: the tie-break is submission order)
    restarts `slow`."""
    server = start_server(
        data_dir, gpus=2, policy="optimus", optimus_refit_min_s=0.5, progress_check_s=0.1
    )
    client = api(server.url, admin_token(data_dir))
    jobs: list[str] = []
    try:
        slow = submit(client, **learner("slow", 0.01))
        quick = submit(client, **learner("quick", 0.05))
        jobs += [slow, quick]
        # Enough reported losses for a fit that is past its noisy first points.
        wait_until(
            lambda: step_of(client, slow) >= 40 and step_of(client, quick) >= 40,
            "both learners past step 40",
        )
        go = tmp_path / "go"
        first = submit(client, **until_file("first", go))
        second = submit(client, **until_file("second", tmp_path / "never"))
        jobs += [first, second]
        for blocker in (first, second):
            wait_for(client, blocker, ["RUNNING"])
        for learnt in (slow, quick):
            found = wait_for(client, learnt, ["PENDING"])
            assert found["preemptions"] == 1, found
        # What the waiting learners are keyed by: their fits, shown by the API.
        estimates = {learnt: job(client, learnt)["estimate"] for learnt in (slow, quick)}
        for learnt, estimate in estimates.items():
            assert estimate is not None and estimate["source"] == "fit", (learnt, estimate)
            assert estimate["basis"].startswith("optimus: loss-curve fit of ")
        # ~760 steps against ~120 (a factor 6; the fits are noisy, so a factor 3 is asked).
        assert estimates[slow]["remaining_s"] > 3 * estimates[quick]["remaining_s"], estimates
        # `corral describe` shows the same estimate.
        (line,) = [
            line
            for line in describe_text(job(client, slow)).splitlines()
            if line.strip().startswith("Remaining:")
        ]
        assert "(optimus: loss-curve fit of " in line and ", converging at step " in line

        go.write_text("")  # `first` ends: one GPU is free, `second` keeps the other
        assert wait_for(client, first)["status"] == "SUCCEEDED"
        restarted = wait_until(
            lambda: next((j for j in (slow, quick) if job(client, j)["status"] == "RUNNING"), None),
            "a learner restarted on the freed GPU",
        )
        assert restarted == quick, "the job with the longer estimate took the GPU"
        assert job(client, slow)["status"] == "PENDING"
        # And it stays so: `quick` runs on, the fit keeps it ahead of `slow` at its refits.
        wait_until(lambda: step_of(client, quick) >= 80, "quick past step 80")
        assert job(client, slow)["status"] == "PENDING"
        assert [a["outcome"] for a in job(client, slow)["attempt_history"]] == ["preempted"]
    finally:
        stop_all(client, server, jobs)
