"""A PyTorch Lightning job and a Hugging Face Trainer job, preempted on a live manager, resume
from their checkpoints at the step they were stopped at (CPU; examples/lightning_train.py and
examples/hf_train.py, with corral's callbacks, unchanged).

One declared GPU under las: a job of a higher level preempts the training job (SIGTERM, its
grace period), runs, and the training job starts again on the same `CORRAL_CHECKPOINT_DIR`.
Each attempt's reports are in its own progress file (attempt-N/rank-0.progress), so the steps
each attempt made are read from there, as the job wrote them.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.server.helpers import (
    REPO,
    admin_token,
    api,
    job,
    python_job,
    start_server,
    submit,
    wait_for,
    wait_until,
)

#: Optimizer steps of each run, and the step the preemption waits for (then a measured rate).
STEPS, PREEMPT_AFTER = 80, 15


def installed(*modules: str) -> bool:
    return all(importlib.util.find_spec(module) is not None for module in modules)


def reported_steps(data_dir: Path, job_id: str, attempt: int) -> list[float]:
    path = data_dir / "jobs" / job_id / f"attempt-{attempt}" / "rank-0.progress"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def preempt_and_resume(data_dir: Path, script: str) -> str:
    """Run `script`, preempt it once it has made PREEMPT_AFTER steps, check what is shown while
    it waits, and return the job's id once it has succeeded."""
    server = start_server(data_dir, gpus=1, policy="las", progress_check_s=0.1)
    try:
        client = api(server.url, admin_token(data_dir))
        spec = {
            "name": "trainer",
            "gpus": 1,
            "command": [sys.executable, str(REPO / "examples" / script)],
            # no total_steps: the callbacks report the run's total
            "env": {"TRAIN_STEPS": STEPS, "STEP_SECONDS": 0.1, "HF_HUB_OFFLINE": "1"},
            "grace_seconds": 60,
        }
        job_id = submit(client, **spec)

        def training() -> dict[str, Any] | None:
            progress = job(client, job_id)["progress"] or {}
            return progress if progress.get("step", 0) >= PREEMPT_AFTER else None

        shown = wait_until(training, f"step {PREEMPT_AFTER} reported", timeout=300)
        assert shown["total_steps"] == STEPS  # from the callback's reports
        high = submit(client, **python_job("high", "import time; time.sleep(3)", level=1))
        waiting = wait_for(client, job_id, ["PENDING"])  # preempted: waits for the GPU
        assert waiting["preemptions"] == 1
        progress = waiting["progress"]
        # The last loss reported stays shown (the Trainer logs one every 10 steps: the
        # step-only reports in between carry none).
        assert progress["loss"] is not None, progress
        # Waiting, the job makes no progress: its ETA is the time its steps left take at the
        # rate measured (over its 1.5 s or more of reports), not counted down to 0 s.
        assert progress["steps_per_s"], progress
        left = (STEPS - progress["step"]) / progress["steps_per_s"]
        assert progress["eta_s"] == pytest.approx(left, rel=1e-9), progress
        assert wait_for(client, high)["status"] == "SUCCEEDED"
        done = wait_for(client, job_id, timeout=600)
        assert done["status"] == "SUCCEEDED", done
        assert [a["outcome"] for a in done["attempt_history"]] == ["preempted", "succeeded"]
        assert done["progress"]["step"] == STEPS and done["progress"]["total_steps"] == STEPS
        return job_id
    finally:
        server.stop()


def check_resumed(data_dir: Path, job_id: str) -> int:
    """Attempt 1 was stopped after its last reported step N (the framework finishes the step
    the signal came in, reports it, then saves): attempt 2 restores step N, and its first step
    is N + 1 (from step 0 again, it would be 1). Returns N."""
    first, second = reported_steps(data_dir, job_id, 1), reported_steps(data_dir, job_id, 2)
    stopped_at = int(max(first))
    assert stopped_at >= PREEMPT_AFTER, first
    assert second[0] == stopped_at + 1, (first[-3:], second[:3])
    assert second[-1] == STEPS
    return stopped_at


@pytest.mark.skipif(
    not (installed("torch") and (installed("lightning") or installed("pytorch_lightning"))),
    reason="needs PyTorch and Lightning (test dependencies)",
)
def test_a_preempted_lightning_job_resumes_at_the_step_it_was_stopped_at(data_dir: Path) -> None:
    job_id = preempt_and_resume(data_dir, "lightning_train.py")
    stopped_at = check_resumed(data_dir, job_id)
    attempts = data_dir / "jobs" / job_id
    first = (attempts / "attempt-1" / "rank-0.stdout").read_text()
    assert "starting from step 0" in first
    assert f"stopped at step {stopped_at}, checkpoint saved" in first
    second = (attempts / "attempt-2" / "rank-0.stdout").read_text()
    assert f"resuming from step {stopped_at} (" in second and f"done: step {STEPS}" in second


@pytest.mark.skipif(
    not installed("torch", "transformers", "accelerate"),
    reason="needs PyTorch, transformers and accelerate (test dependencies)",
)
def test_a_preempted_huggingface_trainer_job_resumes_at_the_step_it_was_stopped_at(
    data_dir: Path,
) -> None:
    job_id = preempt_and_resume(data_dir, "hf_train.py")
    stopped_at = check_resumed(data_dir, job_id)
    attempts = data_dir / "jobs" / job_id
    first = (attempts / "attempt-1" / "rank-0.stdout").read_text()
    assert "starting from step 0" in first
    assert f"stopped at step {stopped_at}, checkpoint saved" in first
    second = (attempts / "attempt-2" / "rank-0.stdout").read_text()
    assert f"resuming from {attempts / 'checkpoint' / f'checkpoint-{stopped_at}'}" in second
    assert f"done: step {STEPS}" in second
