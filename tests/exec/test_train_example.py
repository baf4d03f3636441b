"""examples/train.py under the executor: stop mid-way, resume from the checkpoint, retry."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from corral.core.estimate import fit_loss_curve, thin
from corral.exec.local import LocalExecutor
from tests.exec.helpers import PYTHON, TRAIN_SCRIPT, make_launch, wait_ended, wait_for_text


def test_stopped_training_resumes_from_its_checkpoint(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    env = {"TRAIN_STEPS": "30", "STEP_SECONDS": "0.04"}
    first = make_launch(tmp_path, [[PYTHON, TRAIN_SCRIPT]] * 2, attempt=1, extra_env=env)
    executor.launch(first)
    wait_for_text(first.attempt_dir / "rank-0.stdout", "step 5/30")
    executor.stop("1", 1)
    stopped = wait_ended(executor)
    assert (stopped.exit_code, stopped.signal, stopped.stopped) == (143, None, True)
    checkpoint = tmp_path / "jobs" / "1" / "checkpoint" / "ckpt.json"
    saved_step = json.loads(checkpoint.read_text())["step"]
    assert 5 <= saved_step < 30
    # Only rank 0 writes the checkpoint, so it starts afresh; rank 1 may start after rank 0's
    # first save (the ranks are not synchronised) and resume from it.
    assert "rank 0: starting from step 0" in (first.attempt_dir / "rank-0.stdout").read_text()

    second = make_launch(tmp_path, [[PYTHON, TRAIN_SCRIPT]] * 2, attempt=2, extra_env=env)
    executor.launch(second)
    finished = wait_ended(executor)
    assert (finished.exit_code, finished.stopped, finished.reason) == (0, False, "exit code 0")
    for rank in (0, 1):
        output = (second.attempt_dir / f"rank-{rank}.stdout").read_text()
        resumed_from = int(re.findall(rf"rank {rank}: resumed from step (\d+)\n", output)[0])
        # The ranks are not synchronised: rank 1 may start after rank 0 saved a newer step.
        assert resumed_from == saved_step if rank == 0 else saved_step <= resumed_from < 30
        assert f"rank {rank}: done: loss=" in output
        steps_run = re.findall(rf"rank {rank}: step (\d+)/30", output)
        assert steps_run[0] == str(resumed_from + 1) and steps_run[-1] == "30"
    assert json.loads(checkpoint.read_text())["step"] == 30


def test_an_injected_failure_fails_once_then_the_retry_resumes(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    env = {"TRAIN_STEPS": "6", "STEP_SECONDS": "0", "FAIL_AT_STEP": "3", "FAIL_TIMES": "1"}
    executor.launch(make_launch(tmp_path, [[PYTHON, TRAIN_SCRIPT]], attempt=1, extra_env=env))
    failed = wait_ended(executor)
    assert (failed.exit_code, failed.stopped, failed.reason) == (1, False, "exit code 1 (rank 0)")
    assert failed.error_tail == "rank 0: injected failure at step 3 (FAIL_AT_STEP)"

    retry = make_launch(tmp_path, [[PYTHON, TRAIN_SCRIPT]], attempt=2, extra_env=env)
    executor.launch(retry)
    assert wait_ended(executor).exit_code == 0
    assert "resumed from step 3" in (retry.attempt_dir / "rank-0.stdout").read_text()


def train_alone(tmp_path: Path, steps: int, learning_rate: str) -> list[tuple[float, float]]:
    """Run train.py outside corral; its progress reports as (step, loss)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "FAIL_", "TRAIN_"))}
    env |= {"STEP_SECONDS": "0", "LEARNING_RATE": learning_rate}
    env["CORRAL_PROGRESS_FILE"] = str(tmp_path / "progress.jsonl")
    run = subprocess.run(
        [PYTHON, TRAIN_SCRIPT, str(steps)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert run.stdout.startswith("rank 0: starting from step 0\n")
    assert "rank 0: done: loss=" in run.stdout.splitlines()[-1]
    state = json.loads((tmp_path / "checkpoint" / "ckpt.json").read_text())
    assert state["step"] == steps and len(state["weights"]) == 16
    reports = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert [r["step"] for r in reports] == list(range(1, steps + 1))
    return [(r["step"], r["loss"]) for r in reports]


def test_training_alone_reports_a_curve_optimus_fits(tmp_path: Path) -> None:
    samples = train_alone(tmp_path, 400, "0.02")
    # The loss starts near the signal's variance, 4 (a mini-batch of 32: 2.45 at step 1) and
    # ends near the noise floor 0.3 ** 2 = 0.09 (the mean of the last 20 batches: about 0.12).
    assert samples[0][1] > 1.5
    assert 0.05 < sum(loss for _, loss in samples[-20:]) / 20 < 0.2
    # Optimus's fit converges near step 8 / 0.02 = 400 (449 from all 400 points), and from the
    # first 50 points alone already within a factor 1.5 of that (343).
    whole = fit_loss_curve(thin(samples, 64))
    early = fit_loss_curve(thin(samples[:50], 64))
    assert whole is not None and early is not None
    converges = whole.converged_step()
    assert 250 < converges < 700
    assert converges / 1.5 < early.converged_step() < converges * 1.5


def test_a_larger_learning_rate_converges_sooner_by_the_fit(tmp_path: Path) -> None:
    # 0.1 is 5 times 0.02: the fit converges near 8 / 0.1 = 80 (70 from 100 points).
    curve = fit_loss_curve(thin(train_alone(tmp_path, 100, "0.1"), 64))
    assert curve is not None and 40 < curve.converged_step() < 160
