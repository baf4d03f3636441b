"""A Hugging Face `Trainer` job that corral can preempt and resume (CPU; any accelerator the same).

A small regression network, wrapped as the Trainer wants it (its `forward` returns the loss),
learns a fixed linear map on synthetic data: no download, no tokenizer. The corral callbacks do
the rest:

* `CorralCallback` reports the step every step, the loss each time the Trainer logs, and the run's
  total steps (so `corral ls` shows an ETA with no `total_steps` in the spec);
* `CorralCheckpoint` has the Trainer save `checkpoint-<step>` into `$CORRAL_CHECKPOINT_DIR` (the
  Trainer's `output_dir`) and stop when corral stops the job (SIGTERM), and
  `trainer.train(resume_from_checkpoint=resume_path())` resumes from the newest one on the next
  attempt, at the step it was stopped at.

    python examples/hf_train.py     # outside corral: trains from scratch into ./checkpoints
    corral submit --gpus 1 --grace-seconds 60 -- python examples/hf_train.py

Environment (all optional): TRAIN_STEPS (default 200), STEP_SECONDS (an extra sleep per step, to
stretch a run; default 0), SAVE_EVERY (also save every so many steps, against a kill without a
signal; default: only when stopped). Needs transformers and accelerate (the Trainer's own
dependency: `pip install 'transformers[torch]'`).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import torch
from transformers import Trainer, TrainingArguments

from corral.progress.huggingface import CorralCallback, CorralCheckpoint, output_dir, resume_path

FEATURES, SAMPLES, BATCH = 8, 4096, 32


class Regression(torch.nn.Module):
    def __init__(self, step_seconds: float) -> None:
        super().__init__()
        self.step_seconds = step_seconds
        self.net = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
        )

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, Any]:
        if self.step_seconds and self.training:
            time.sleep(self.step_seconds)
        return {"loss": torch.nn.functional.mse_loss(self.net(x), labels)}


def data() -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    y = x @ torch.linspace(-1.0, 1.0, FEATURES).unsqueeze(1)
    return [{"x": x[i], "labels": y[i]} for i in range(SAMPLES)]


def main() -> None:
    steps = int(os.environ.get("TRAIN_STEPS", "200"))
    save_every = os.environ.get("SAVE_EVERY")
    torch.manual_seed(0)
    args = TrainingArguments(
        output_dir=output_dir(),  # $CORRAL_CHECKPOINT_DIR: kept across attempts
        max_steps=steps,
        per_device_train_batch_size=BATCH,
        learning_rate=0.05,
        logging_steps=10,
        save_strategy="steps" if save_every else "no",  # CorralCheckpoint saves when stopped
        save_steps=int(save_every) if save_every else 500,
        save_total_limit=2,
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )
    checkpoint = CorralCheckpoint()
    trainer = Trainer(
        model=Regression(float(os.environ.get("STEP_SECONDS", "0"))),
        args=args,
        train_dataset=data(),
        callbacks=[CorralCallback(), checkpoint],
    )
    path = resume_path()
    print("starting from step 0" if path is None else f"resuming from {path}", flush=True)
    trainer.train(resume_from_checkpoint=path)
    if checkpoint.stopped:
        print(f"stopped at step {trainer.state.global_step}, checkpoint saved", flush=True)
        sys.exit(143)  # as a process ended by SIGTERM
    print(f"done: step {trainer.state.global_step}", flush=True)


if __name__ == "__main__":
    main()
