"""A Hugging Face `Trainer` callback that reports progress to corral
(`corral.progress.report`).

    from corral.progress.huggingface import CorralCallback
    trainer = transformers.Trainer(..., callbacks=[CorralCallback()])

Importing this module imports transformers; `corral.progress` alone does not.
"""

from __future__ import annotations

import math
from typing import Any

from corral.progress import report

try:
    from transformers import TrainerCallback  # type: ignore[import-not-found, unused-ignore]
except ImportError:
    raise ImportError("corral.progress.huggingface needs transformers installed") from None

__all__ = ["CorralCallback"]


class CorralCallback(TrainerCallback):  # type: ignore[misc, unused-ignore]
    """Reports `state.global_step` every `every_n_steps` steps (`on_step_end`, no loss: the
    Trainer only computes it when it logs) and with `logs["loss"]` each time the Trainer logs
    (`on_log`, every `logging_steps`), on the world's process zero only (the manager reads rank
    0's file)."""

    def __init__(self, every_n_steps: int = 1) -> None:
        super().__init__()
        if (
            isinstance(every_n_steps, bool)
            or not isinstance(every_n_steps, int)
            or every_n_steps < 1
        ):
            raise ValueError(f"every_n_steps: must be a positive integer (got {every_n_steps!r})")
        self.every_n_steps = every_n_steps

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero and state.global_step % self.every_n_steps == 0:
            report(state.global_step, **_epoch(state))

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if not state.is_world_process_zero or not logs:
            return
        loss = _finite(logs.get("loss"))
        if loss is not None:
            report(state.global_step, loss=loss, **_epoch(state))


def _epoch(state: Any) -> dict[str, float]:
    epoch = _finite(getattr(state, "epoch", None))
    return {} if epoch is None else {"epoch": epoch}


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None
