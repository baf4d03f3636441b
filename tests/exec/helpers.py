"""Builders and waits shared by the executor tests."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from corral.exec.local import (
    AttemptEnded,
    AttemptLaunch,
    LocalExecutor,
    WorkerLaunch,
    free_port,
    worker_envs,
)

PYTHON = sys.executable
#: Seconds a test waits for an attempt's progress: enough for a loaded 2-core machine (each wait
#: polls, and ends as soon as its condition holds).
WAIT_S = 60.0
TRAIN_SCRIPT = str(Path(__file__).resolve().parents[2] / "examples" / "train.py")


def make_launch(
    tmp_path: Path,
    argvs: list[list[str]],
    job_id: str = "1",
    attempt: int = 1,
    gpus: list[int] | None = None,
    extra_env: dict[str, str] | None = None,
    grace_s: float = 0.5,
    stop_signal: int = signal.SIGTERM,
) -> AttemptLaunch:
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    checkpoint_dir = tmp_path / "jobs" / job_id / "checkpoint"
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    envs = worker_envs(
        job_id,
        attempt,
        gpus if gpus is not None else list(range(len(argvs))),
        len(argvs),
        checkpoint_dir,
        free_port(),
        extra_env,
    )
    return AttemptLaunch(
        job_id=job_id,
        attempt=attempt,
        workers=[WorkerLaunch(rank, argv, envs[rank]) for rank, argv in enumerate(argvs)],
        workdir=str(workdir),
        stop_signal=stop_signal,
        grace_s=grace_s,
        attempt_dir=tmp_path / "jobs" / job_id / f"attempt-{attempt}",
    )


def wait_ended(executor: LocalExecutor, timeout: float = WAIT_S) -> AttemptEnded:
    """Poll like the manager does until one attempt ends."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ended = executor.poll()
        if ended:
            assert len(ended) == 1, ended
            return ended[0]
        time.sleep(0.02)
    raise AssertionError(f"no attempt ended within {timeout} s")


def wait_for_text(path: Path, text: str, timeout: float = WAIT_S) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in (content := path.read_text()):
            return content
        time.sleep(0.02)
    raise AssertionError(f"{text!r} did not appear in {path} within {timeout} s")


def sh(script: str) -> list[str]:
    return ["/bin/sh", "-c", script]
