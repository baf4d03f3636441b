"""A CPU stand-in for a training job: checkpoints every step, stops cleanly, resumes.

It fits a linear model to a synthetic regression problem by mini-batch SGD, sleeping between steps
as if each took real work, so that corral's preemption path (signal, grace, kill, requeue, resume)
can be tried without a GPU:

    python examples/train.py [STEPS]

The problem is ill-conditioned on purpose, as real ones are: 16 features whose variances are
spread evenly over (0, 1], each carrying an equal share of the signal (4 in all), plus label noise
of variance 0.09. Gradient descent fits the large features within a few steps and the small ones
ever more slowly, so the loss falls from about 4 towards its floor roughly as 1/(a*k + b) + c, the
shape Optimus fits (docs/optimus.md), over a few hundred steps: Optimus's fit of this curve
converges (excess loss at 5 %) near step 8 / LEARNING_RATE, about 400 at the default.

Environment (all optional):
  TRAIN_STEPS            number of steps (default 400; a STEPS argument wins)
  STEP_SECONDS           time per step (default 0.1)
  LEARNING_RATE          SGD's learning rate (default 0.02): the curve converges in about
                         8 / LEARNING_RATE steps (0.1: about 80, 0.01: about 800)
  CHECKPOINT_EVERY       write the checkpoint every K steps (default 1)
  CORRAL_CHECKPOINT_DIR  where ckpt.json lives (default ./checkpoint); set by corral
  RANK                   this worker's rank (default 0); only rank 0 writes the checkpoint
                         (each rank runs its own loop, unsynchronised: a rank that starts late
                         may resume from a newer step than rank 0 did)
  FAIL_AT_STEP=k         the worker of rank FAIL_RANK (default 0) exits with code 1 and a message
                         on stderr when it reaches step k ...
  FAIL_TIMES=n           ... but only the first n times (counted in CORRAL_CHECKPOINT_DIR/
                         failures.count), so a retry resumes and succeeds; unset = every time
  HANG_AT_STEP=k         at step k, stop making progress (as a stuck collective would) but keep
                         running, until stopped
  CORRAL_PROGRESS_FILE   where each step appends its progress report, a JSON line
                         {"step", "loss", "time"}: the mini-batch loss before the step (set by
                         corral; docs/progress.md): written here by hand, as a program in any
                         language can

On SIGTERM (corral's default stop signal) rank 0 writes a checkpoint and every rank exits with
code 143 within one short sleep. On start every rank reads ckpt.json if present and prints
"resumed from step K" (else "starting from step 0"). At the end it prints "done: loss=..." and
exits 0.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import sys
import time
from pathlib import Path

#: The problem: FEATURES features, feature i of variance (i + 1) / FEATURES, the signal (of
#: variance SIGNAL) shared equally among them, and label noise of sd NOISE: the loss's floor is
#: NOISE ** 2.
FEATURES, SIGNAL, NOISE, BATCH = 16, 4.0, 0.3, 32
SCALES = [math.sqrt((i + 1) / FEATURES) for i in range(FEATURES)]
TRUE_WEIGHTS = [math.sqrt(SIGNAL / FEATURES) / scale for scale in SCALES]
# The longest one sleep lasts, so that a stop request is seen promptly even with long steps.
SLEEP_SLICE_S = 0.02

stop_requested = False


def on_sigterm(signum: int, frame: object) -> None:
    global stop_requested
    stop_requested = True


def batch(step: int) -> list[tuple[list[float], float]]:
    """Step `step`'s mini-batch of (x, y): the same for a given step on every run, so a resumed
    job sees the data it would have seen."""
    rng = random.Random(step * 7919)
    samples = []
    for _ in range(BATCH):
        x = [rng.gauss(0.0, scale) for scale in SCALES]
        y = sum(w * v for w, v in zip(TRUE_WEIGHTS, x, strict=True)) + rng.gauss(0.0, NOISE)
        samples.append((x, y))
    return samples


def sgd_step(
    weights: list[float], samples: list[tuple[list[float], float]], learning_rate: float
) -> tuple[list[float], float]:
    """One gradient step on the batch's mean squared error; returns (weights, loss before)."""
    grad = [0.0] * len(weights)
    loss = 0.0
    for x, y in samples:
        error = sum(w * v for w, v in zip(weights, x, strict=True)) - y
        loss += error * error
        for i, v in enumerate(x):
            grad[i] += 2 * error * v
    n = len(samples)
    return [w - learning_rate * g / n for w, g in zip(weights, grad, strict=True)], loss / n


def save_checkpoint(path: Path, step: int, weights: list[float], loss: float) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"step": step, "weights": weights, "loss": loss}))
    os.replace(tmp, path)


def should_fail(step: int, rank: int, checkpoint_dir: Path) -> bool:
    fail_at = os.environ.get("FAIL_AT_STEP")
    if fail_at is None or step != int(fail_at) or rank != int(os.environ.get("FAIL_RANK", "0")):
        return False
    limit = os.environ.get("FAIL_TIMES")
    if limit is None:
        return True
    counter = checkpoint_dir / "failures.count"
    failures = int(counter.read_text()) if counter.exists() else 0
    if failures >= int(limit):
        return False
    counter.write_text(str(failures + 1))
    return True


def sleep_unless_stopped(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not stop_requested:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        time.sleep(min(remaining, SLEEP_SLICE_S))


def report_progress(step: int, loss: float) -> None:
    """Append one progress report (the protocol of docs/progress.md, without corral's helper)."""
    path = os.environ.get("CORRAL_PROGRESS_FILE")
    if path:
        line = json.dumps({"step": step, "loss": loss, "time": time.time()}) + "\n"
        with open(path, "a", encoding="utf-8") as progress:
            progress.write(line)


def main() -> int:
    signal.signal(signal.SIGTERM, on_sigterm)
    steps = int(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("TRAIN_STEPS", "400"))
    step_seconds = float(os.environ.get("STEP_SECONDS", "0.1"))
    learning_rate = float(os.environ.get("LEARNING_RATE", "0.02"))
    every = max(1, int(os.environ.get("CHECKPOINT_EVERY", "1")))
    rank = int(os.environ.get("RANK", "0"))
    checkpoint_dir = Path(os.environ.get("CORRAL_CHECKPOINT_DIR", "checkpoint"))
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = checkpoint_dir / "ckpt.json"

    step, weights, loss = 0, [0.0] * FEATURES, float("nan")
    if checkpoint.exists():
        state = json.loads(checkpoint.read_text())
        step, weights, loss = (
            int(state["step"]),
            [float(w) for w in state["weights"]],
            state["loss"],
        )
        print(f"rank {rank}: resumed from step {step}", flush=True)
    else:
        print(f"rank {rank}: starting from step 0", flush=True)

    while step < steps:
        if stop_requested:
            break
        if should_fail(step, rank, checkpoint_dir):
            print(f"rank {rank}: injected failure at step {step} (FAIL_AT_STEP)", file=sys.stderr)
            return 1
        if os.environ.get("HANG_AT_STEP") == str(step):
            print(f"rank {rank}: hanging at step {step} (HANG_AT_STEP)", flush=True)
            while not stop_requested:
                sleep_unless_stopped(1.0)
            break
        sleep_unless_stopped(step_seconds)
        weights, loss = sgd_step(weights, batch(step), learning_rate)
        step += 1
        if rank == 0:
            report_progress(step, loss)
        if rank == 0 and (step % every == 0 or step == steps):
            save_checkpoint(checkpoint, step, weights, loss)
        print(f"rank {rank}: step {step}/{steps} loss={loss:.6f}", flush=True)

    if stop_requested:
        if rank == 0:
            save_checkpoint(checkpoint, step, weights, loss)
        print(f"rank {rank}: stopped at step {step}, checkpoint saved", flush=True)
        return 143
    print(f"rank {rank}: done: loss={loss:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
