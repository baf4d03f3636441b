"""Research mechanisms on a live manager with a real PyTorch DDP job (CPU, gloo) that reports its
progress through corral's helper (examples/ddp_train.py): optimus fits its loss curve, and
ElasticFlow resizes it by checkpoint-restart."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.server.helpers import (
    REPO,
    admin_token,
    api,
    job,
    start_server,
    submit,
    wait_for,
    wait_until,
)

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="needs PyTorch (a test dependency)"
)

DDP = str(REPO / "examples" / "ddp_train.py")


def ddp_job(name: str, gpus: int, steps: int, step_s: float, **fields: object) -> dict:
    return {
        "name": name,
        "gpus": gpus,
        "workers": gpus,
        "command": [sys.executable, DDP],
        "env": {"TRAIN_STEPS": steps, "STEP_SECONDS": step_s, "CHECKPOINT_EVERY": 5},
        "grace_seconds": 30,
        **fields,
    }


def log(client, job_id: str, attempt: int, rank: int = 0) -> str:
    return client.get(f"/api/v1/jobs/{job_id}/logs", params={"attempt": attempt, "rank": rank}).text


def test_optimus_fits_a_real_ddp_jobs_reported_loss_curve(data_dir: Path) -> None:
    server = start_server(
        data_dir, gpus=2, policy="optimus", optimus_refit_min_s=0.5, progress_check_s=0.1
    )
    try:
        client = api(server.url, admin_token(data_dir))
        job_id = submit(client, **ddp_job("ddp", 2, 300, 0.02, total_steps=300))

        def fitted() -> dict | None:
            estimate = job(client, job_id)["estimate"]
            return estimate if estimate is not None and estimate["source"] == "fit" else None

        # The API shows the estimate Optimus keys the job by: its fit of the reported losses.
        estimate = wait_until(fitted, "optimus's fit of the reported loss curve")
        assert estimate["basis"].startswith("optimus: loss-curve fit of ")
        assert 0 <= estimate["remaining_s"] < float("inf")
        done = wait_for(client, job_id)
        assert done["status"] == "SUCCEEDED", done
        assert "done: loss=" in log(client, job_id, 1, rank=1)  # both ranks trained
        assert done["progress"]["step"] == 300
    finally:
        server.stop()


def test_elasticflow_resizes_a_real_ddp_job_by_checkpoint_restart(data_dir: Path) -> None:
    server = start_server(data_dir, gpus=2, policy="elasticflow", progress_check_s=0.1)
    try:
        client = api(server.url, admin_token(data_dir))
        # Best effort (no deadline): it grows into both idle GPUs.
        grower = submit(
            client,
            **ddp_job("grower", 1, 100000, 0.02, elastic={"min_gpus": 1, "max_gpus": 2}),
        )
        wait_until(
            lambda: (
                len(job(client, grower)["placement"]) == 2
                and (job(client, grower)["progress"] or {}).get("step", 0) >= 10
            ),
            "the elastic job running on 2 GPUs",
        )
        # A job with a deadline takes its share: the grower shrinks to one GPU, restarting
        # from its checkpoint with one worker.
        urgent = submit(client, **ddp_job("urgent", 1, 50, 0.02, deadline=3600, time_limit=600))
        assert wait_for(client, urgent)["status"] == "SUCCEEDED"

        def shrunk() -> dict | None:
            found = job(client, grower)
            history = found["attempt_history"]
            running = [a for a in history if a["state"] != "ended"]
            return found if running and len(running[-1]["gpus"]) == 1 else None

        found = wait_until(shrunk, "the grower restarted on one GPU")
        history = found["attempt_history"]
        assert any(len(a["gpus"]) == 2 and a["outcome"] == "preempted" for a in history)
        resumed = history[-1]["number"]
        text = wait_until(
            lambda: "resumed from step" in (t := log(client, grower, resumed)) and t,
            "the resized attempt's log",
        )
        assert "rank 0/1: resumed from step" in text
        client.post(f"/api/v1/jobs/{grower}/cancel")
        assert wait_for(client, grower)["status"] == "CANCELLED"
    finally:
        server.stop()
