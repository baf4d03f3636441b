"""A training stand-in whose speed depends on who shares its GPU (tests/server/test_gandiva_live.py).

Like examples/train.py it steps, reports progress to $CORRAL_PROGRESS_FILE, checkpoints every step
to $CORRAL_CHECKPOINT_DIR and resumes from it, and stops cleanly on SIGTERM (exit 143). Besides:

  MARK=path        create this file while running (removed on exit): "I am on the GPU"
  SLOW_WHILE=path  while this file exists, each step takes SLOW_STEP_SECONDS instead of
                   STEP_SECONDS: interference from the job that creates it

It prints "visible=<CUDA_VISIBLE_DEVICES>" first.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

stop = False


def on_sigterm(signum: int, frame: object) -> None:
    global stop
    stop = True


def main() -> int:
    signal.signal(signal.SIGTERM, on_sigterm)
    print(f"visible={os.environ.get('CUDA_VISIBLE_DEVICES')}", flush=True)
    steps = int(os.environ.get("TRAIN_STEPS", "100000"))
    fast = float(os.environ.get("STEP_SECONDS", "0.02"))
    slow = float(os.environ.get("SLOW_STEP_SECONDS", "0.5"))
    slow_while = os.environ.get("SLOW_WHILE")
    mark = os.environ.get("MARK")
    checkpoint = Path(os.environ["CORRAL_CHECKPOINT_DIR"]) / "ckpt.json"
    progress = os.environ.get("CORRAL_PROGRESS_FILE")
    step = json.loads(checkpoint.read_text())["step"] if checkpoint.exists() else 0
    print(f"resumed from step {step}" if step else "starting from step 0", flush=True)
    if mark:
        Path(mark).touch()
    try:
        while step < steps and not stop:
            seconds = slow if slow_while and os.path.exists(slow_while) else fast
            deadline = time.monotonic() + seconds
            while not stop and time.monotonic() < deadline:
                time.sleep(min(0.01, max(0.0, deadline - time.monotonic())))
            if stop:
                break
            step += 1
            checkpoint.write_text(json.dumps({"step": step}))
            if progress:
                with open(progress, "a", encoding="utf-8") as out:
                    out.write(json.dumps({"step": step, "time": time.time()}) + "\n")
    finally:
        if mark:
            Path(mark).unlink(missing_ok=True)
    if stop:
        print(f"stopped at step {step}", flush=True)
        return 143
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
