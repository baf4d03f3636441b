"""A PyTorch Lightning job that corral can preempt and resume (CPU; any accelerator the same).

A small regression network learns a fixed linear map on synthetic data. The two corral callbacks
do the rest:

* `CorralProgress` reports the step, the loss and the run's total steps (so `corral ls` shows an
  ETA with no `total_steps` in the spec);
* `CorralCheckpoint` saves the whole training state to `$CORRAL_CHECKPOINT_DIR/last.ckpt` when
  corral stops the job (SIGTERM: Lightning ends the batch it is in, the callback saves, the
  process exits), and `trainer.fit(..., ckpt_path=resume_path())` resumes from it on the next
  attempt, at the step it was stopped at.

    python examples/lightning_train.py     # outside corral: trains from scratch, saves nothing
    corral submit --gpus 1 --grace-seconds 60 -- python examples/lightning_train.py

Environment (all optional): TRAIN_STEPS (optimizer steps, default 200), STEP_SECONDS (an extra
sleep per step, to stretch a run; default 0), SAVE_EVERY (also save every so many steps, against
a kill without a signal; default: only when stopped). Needs `lightning` (or `pytorch_lightning`)
2.1 or later.
"""

from __future__ import annotations

import os
import sys
import time

import torch

try:
    import lightning.pytorch as pl
except ImportError:  # the older package name
    import pytorch_lightning as pl

from corral.progress.lightning import CorralCheckpoint, CorralProgress, resume_path

FEATURES, SAMPLES, BATCH = 8, 4096, 32


class Regression(pl.LightningModule):  # type: ignore[misc]
    def __init__(self, step_seconds: float) -> None:
        super().__init__()
        self.step_seconds = step_seconds
        self.net = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
        )

    def training_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> torch.Tensor:
        if self.step_seconds:
            time.sleep(self.step_seconds)
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def data() -> torch.utils.data.DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    y = x @ torch.linspace(-1.0, 1.0, FEATURES).unsqueeze(1)
    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_size=BATCH, shuffle=True, generator=generator
    )


def main() -> None:
    steps = int(os.environ.get("TRAIN_STEPS", "200"))
    save_every = os.environ.get("SAVE_EVERY")
    torch.manual_seed(0)
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="auto",
        devices=1,
        logger=False,
        enable_checkpointing=False,  # CorralCheckpoint saves what a resume needs
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[
            CorralProgress(),
            CorralCheckpoint(every_n_steps=int(save_every) if save_every else None),
        ],
    )
    path = resume_path()
    if path is None:
        print("starting from step 0", flush=True)
    else:
        step = torch.load(path, map_location="cpu", weights_only=False)["global_step"]
        print(f"resuming from step {step} ({path})", flush=True)
    model = Regression(float(os.environ.get("STEP_SECONDS", "0")))
    try:
        trainer.fit(model, data(), ckpt_path=path)
    except SystemExit:  # Lightning's SIGTERMException: stopped, and CorralCheckpoint saved
        if not trainer.received_sigterm:
            raise
        print(f"stopped at step {trainer.global_step}, checkpoint saved", flush=True)
        sys.exit(143)  # as a process ended by SIGTERM
    print(f"done: step {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
