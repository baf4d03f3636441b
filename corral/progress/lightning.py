"""A Lightning callback that reports progress to corral (`corral.progress.report`).

    from corral.progress.lightning import CorralProgress
    trainer = lightning.pytorch.Trainer(..., callbacks=[CorralProgress()])

Importing this module imports Lightning (`lightning`, else `pytorch_lightning`);
`corral.progress` alone does not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from corral.progress import report

try:
    from lightning.pytorch import Callback  # type: ignore[import-not-found, unused-ignore]
except ImportError:
    try:
        from pytorch_lightning import Callback  # type: ignore[import-not-found, no-redef, unused-ignore]
    except ImportError:
        raise ImportError(
            "corral.progress.lightning needs lightning (or pytorch_lightning) installed"
        ) from None

__all__ = ["CorralProgress"]

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
        if (
            isinstance(every_n_steps, bool)
            or not isinstance(every_n_steps, int)
            or every_n_steps < 1
        ):
            raise ValueError(f"every_n_steps: must be a positive integer (got {every_n_steps!r})")
        self.every_n_steps = every_n_steps
        self._last_step = -1

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
        report(step, loss=_loss(outputs, trainer), epoch=int(trainer.current_epoch))


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
