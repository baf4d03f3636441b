"""A real PyTorch DistributedDataParallel job on CPU (gloo) that reports its progress to corral.

Each worker (corral sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; torchrun would too)
joins a gloo process group and trains a small regression network on its shard of a synthetic
dataset; gradients are averaged across workers by DDP every step. Rank 0:

* reports `step`, `loss` and `samples` after every step through `corral.progress.report`
  (a no-op outside corral), so corral measures steps/s and the loss curve;
* saves a checkpoint (model, optimiser, step) to $CORRAL_CHECKPOINT_DIR every CHECKPOINT_EVERY
  steps and when stopped (SIGTERM), so a preempted or resized job resumes where it was — with
  any number of workers: the checkpoint holds no per-worker state.

    python examples/ddp_train.py            # one process, WORLD_SIZE 1
    torchrun --nproc-per-node 2 examples/ddp_train.py

Environment (all optional): TRAIN_STEPS (default 200), BATCH (samples per worker per step,
default 64), STEP_SECONDS (extra sleep per step, to stretch a run; default 0), CHECKPOINT_EVERY
(default 10), FAIL_AT_STEP (rank 0 raises there: a bug in the job).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from corral.progress import report

stop_requested = False


def on_sigterm(signum: int, frame: object) -> None:
    global stop_requested
    stop_requested = True


def batch(step: int, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The worker's shard of step `step`: the same data for a given (step, rank) on every run."""
    generator = torch.Generator().manual_seed(step * 1009 + rank)
    x = torch.rand(size, 8, generator=generator) * 2 - 1
    y = (x * torch.arange(1, 9)).sum(dim=1, keepdim=True) + 0.5
    return x, y


def main() -> int:
    signal.signal(signal.SIGTERM, on_sigterm)
    steps = int(os.environ.get("TRAIN_STEPS", "200"))
    size = int(os.environ.get("BATCH", "64"))
    pause = float(os.environ.get("STEP_SECONDS", "0"))
    every = max(1, int(os.environ.get("CHECKPOINT_EVERY", "10")))
    fail_at = int(os.environ.get("FAIL_AT_STEP", "-1"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    optimiser = torch.optim.SGD(model.parameters(), lr=0.05)
    checkpoint = Path(os.environ.get("CORRAL_CHECKPOINT_DIR", "checkpoint")) / "ddp.pt"
    step = 0
    if checkpoint.exists():
        saved = torch.load(checkpoint)
        model.load_state_dict(saved["model"])
        optimiser.load_state_dict(saved["optimiser"])
        step = int(saved["step"])
        print(f"rank {rank}/{world}: resumed from step {step}", flush=True)
    else:
        print(f"rank {rank}/{world}: starting from step 0", flush=True)
    trained = nn.parallel.DistributedDataParallel(model) if world > 1 else model

    def save() -> None:
        if rank == 0:
            checkpoint.parent.mkdir(parents=True, exist_ok=True)
            state = {"model": model.state_dict(), "optimiser": optimiser.state_dict(), "step": step}
            torch.save(state, checkpoint.with_suffix(".tmp"))
            checkpoint.with_suffix(".tmp").replace(checkpoint)

    loss_value = float("nan")
    while step < steps:
        # Every worker must agree to stop at the same step, or the others wait in all_reduce.
        stopping = torch.tensor([1.0 if stop_requested else 0.0])
        if world > 1:
            dist.all_reduce(stopping)
        if stopping.item() > 0:
            save()
            print(f"rank {rank}: stopped at step {step}", flush=True)
            return 143
        if rank == 0 and step == fail_at:
            raise RuntimeError(f"bug at step {step}")
        x, y = batch(step, rank, size)
        loss = nn.functional.mse_loss(trained(x), y)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        step += 1
        loss_value = float(loss.item())
        if rank == 0:
            report(step=step, loss=loss_value, samples=step * size * world)
        if step % every == 0:
            save()
        if pause:
            time.sleep(pause)
    save()
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    print(f"rank {rank}: done: loss={loss_value:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
