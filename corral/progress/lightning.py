"""Lightning callbacks for corral: progress reports (`corral.progress.report`) and a checkpoint
that a preempted job resumes from.

    from corral.progress.lightning import CorralCheckpoint, CorralProgress, resume_path
    trainer = lightning.pytorch.Trainer(..., callbacks=[CorralProgress(), CorralCheckpoint()])
    trainer.fit(model, data, ckpt_path=resume_path())

Importing this module imports Lightning (`lightning`, else `pytorch_lightning`);
`corral.progress` alone does not.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from corral.progress import report

try:
    from lightning.pytorch import Callback  # type: ignore[import-not-found, unused-ignore]
    from lightning.pytorch.utilities.exceptions import (  # type: ignore[import-not-found, unused-ignore]
        SIGTERMException,
    )
except ImportError:
    try:
        from pytorch_lightning import Callback  # type: ignore[import-not-found, no-redef, assignment, unused-ignore]
        from pytorch_lightning.utilities.exceptions import (  # type: ignore[import-not-found, no-redef, assignment, unused-ignore]
            SIGTERMException,
        )
    except ImportError:
        raise ImportError(
            "corral.progress.lightning needs lightning (or pytorch_lightning) 2.1 or later "
            "installed"
        ) from None

__all__ = ["CHECKPOINT_NAME", "CorralCheckpoint", "CorralProgress", "resume_path"]

#: The checkpoint's file name in `$CORRAL_CHECKPOINT_DIR`.
CHECKPOINT_NAME = "last.ckpt"

#: Where the loss is looked for in `trainer.callback_metrics` when the step's outputs have none.
LOSS_METRICS = ("loss", "train_loss")


class CorralProgress(Callback):  # type: ignore[misc, unused-ignore]
    """Reports `trainer.global_step` (optimizer steps) and the step's loss every `every_n_steps`
    steps, on global rank 0 only (the manager reads rank 0's file).

    The loss is the `outputs` of `training_step` (a tensor, or a mapping's "loss"), else
    `trainer.callback_metrics["loss"]` or `["train_loss"]`; a step without a finite loss is
    reported without one. Reading a loss on the GPU waits for the step to finish: a larger
    `every_n_steps` makes that rarer."""

    def __init__(self, every_n_steps: int = 1) -> None:
        super().__init__()
        self.every_n_steps = _positive("every_n_steps", every_n_steps)
        self._last_step = -1
        self._total: float | None = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._total = _total_steps(trainer)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not trainer.is_global_zero:
            return
        step = int(trainer.global_step)
        # with gradient accumulation several batches end at one optimizer step: report it once
        # (and none before the first)
        if step == 0 or step == self._last_step or step % self.every_n_steps:
            return
        self._last_step = step
        report(
            step,
            loss=_loss(outputs, trainer),
            total_steps=self._total,
            epoch=int(trainer.current_epoch),
        )


class CorralCheckpoint(Callback):  # type: ignore[misc, unused-ignore]
    """Saves the whole training state (`trainer.save_checkpoint`: model, optimizers, loops,
    callbacks) to `$CORRAL_CHECKPOINT_DIR/last.ckpt` when the job is stopped, and every
    `every_n_steps` optimizer steps if given, so that `trainer.fit(..., ckpt_path=resume_path())`
    resumes a preempted job at the step it was stopped at.

    corral stops a job (preemption, cancel) with the spec's `signal`, SIGTERM by default, then
    SIGKILL after `grace_seconds`. On SIGTERM Lightning finishes the batch it is in and raises
    `SIGTERMException` (on every rank); this callback saves then, before the process exits. The
    spec's `signal` must stay SIGTERM, and `grace_seconds` must leave time for a batch and a save.
    Each save goes to a temporary file renamed over the previous one, so a kill mid-save leaves
    the previous checkpoint whole. Outside corral (`CORRAL_CHECKPOINT_DIR` unset) it does
    nothing."""

    def __init__(self, every_n_steps: int | None = None) -> None:
        super().__init__()
        self.every_n_steps = (
            None if every_n_steps is None else _positive("every_n_steps", every_n_steps)
        )
        self._saved_step = -1

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = int(trainer.global_step)
        if self.every_n_steps and step and step % self.every_n_steps == 0:
            if step != self._saved_step:
                self.save(trainer)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if isinstance(exception, SIGTERMException):  # stopped: a crash resumes from the last save
            self.save(trainer)

    def save(self, trainer: Any) -> Path | None:
        """Save the checkpoint now (on every rank: Lightning writes it from global rank 0); its
        path, or None outside corral."""
        directory = checkpoint_dir()
        if directory is None:
            return None
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / CHECKPOINT_NAME
        partial = directory / (CHECKPOINT_NAME + ".partial")
        trainer.save_checkpoint(partial)
        if trainer.is_global_zero:
            os.replace(partial, target)
        self._saved_step = int(trainer.global_step)
        return target


def checkpoint_dir() -> Path | None:
    """`$CORRAL_CHECKPOINT_DIR`: the job's, the same for every attempt (None outside corral)."""
    value = os.environ.get("CORRAL_CHECKPOINT_DIR", "")
    return Path(value) if value else None


def resume_path() -> str | None:
    """The checkpoint `CorralCheckpoint` saved in `$CORRAL_CHECKPOINT_DIR`, for
    `trainer.fit(..., ckpt_path=resume_path())`; None (start afresh) when there is none yet or
    outside corral."""
    directory = checkpoint_dir()
    if directory is None:
        return None
    path = directory / CHECKPOINT_NAME
    return str(path) if path.is_file() else None


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: must be a positive integer (got {value!r})")
    return value


def _total_steps(trainer: Any) -> float | None:
    """The optimizer steps the whole fit will make (`max_steps`, else what Lightning estimates
    from the epochs and the data); None when unbounded or unknown."""
    try:
        total = float(trainer.estimated_stepping_batches)
    except Exception:  # no length known (an iterable dataset without max_steps)
        return None
    return total if math.isfinite(total) and total > 0 else None


def _loss(outputs: Any, trainer: Any) -> float | None:
    if isinstance(outputs, Mapping):
        loss = _scalar(outputs.get("loss"))
    else:
        loss = _scalar(outputs)
    if loss is not None:
        return loss
    metrics = getattr(trainer, "callback_metrics", None) or {}
    for name in LOSS_METRICS:
        loss = _scalar(metrics.get(name))
        if loss is not None:
            return loss
    return None


def _scalar(value: Any) -> float | None:
    """A finite float from a one-element tensor or a number; None otherwise."""
    if value is None or isinstance(value, bool):
        return None
    if hasattr(value, "numel"):
        if value.numel() != 1:
            return None
        value = value.detach().item()
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    number = float(value)
    return number if math.isfinite(number) else None
