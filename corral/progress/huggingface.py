"""Hugging Face `Trainer` callbacks for corral: progress reports (`corral.progress.report`) and a
checkpoint on preemption that the job resumes from.

    from corral.progress.huggingface import CorralCallback, CorralCheckpoint, output_dir, resume_path
    args = transformers.TrainingArguments(output_dir=output_dir(), save_total_limit=2, ...)
    trainer = transformers.Trainer(..., args=args, callbacks=[CorralCallback(), CorralCheckpoint()])
    trainer.train(resume_from_checkpoint=resume_path())

Importing this module imports transformers; `corral.progress` alone does not. The `Trainer`
needs `accelerate` besides (`pip install 'transformers[torch]'`, or `accelerate` itself).
"""

from __future__ import annotations

import math
import os
import re
import signal
import threading
import warnings
from pathlib import Path
from typing import Any

from corral.progress import report

try:
    from transformers import TrainerCallback  # type: ignore[import-not-found, unused-ignore]
except ImportError:
    raise ImportError("corral.progress.huggingface needs transformers installed") from None

__all__ = ["CorralCallback", "CorralCheckpoint", "output_dir", "resume_path"]

#: The Trainer's checkpoint folders: checkpoint-<global step> in its output_dir.
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
#: What the Trainer writes last into a checkpoint folder: a folder without it is incomplete.
_STATE = "trainer_state.json"


class CorralCallback(TrainerCallback):  # type: ignore[misc, unused-ignore]
    """Reports `state.global_step` every `every_n_steps` steps (`on_step_end`, no loss: the
    Trainer only computes it when it logs) and with `logs["loss"]` each time the Trainer logs
    (`on_log`, every `logging_steps`), with the run's total steps (`state.max_steps`), on the
    world's process zero only (the manager reads rank 0's file; it shows the last loss reported,
    so the step-only reports between two logs keep it)."""

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
            report(state.global_step, total_steps=_total(state), **_epoch(state))

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if not state.is_world_process_zero or not logs:
            return
        loss = _finite(logs.get("loss"))
        if loss is not None:
            report(state.global_step, loss=loss, total_steps=_total(state), **_epoch(state))


class CorralCheckpoint(TrainerCallback):  # type: ignore[misc, unused-ignore]
    """Has the Trainer save a checkpoint and stop when corral stops the job, so that
    `trainer.train(resume_from_checkpoint=resume_path())` resumes it at the step it was stopped
    at.

    corral stops a job (preemption, cancel) with the spec's `signal` (`stop_signal` here: SIGTERM
    by default), then SIGKILL after `grace_seconds`. From `on_train_begin` on, the signal only
    marks the stop; at the end of the step it came in (`on_step_end`) the Trainer is told to
    save (`checkpoint-<step>` in its `output_dir`, which must be `output_dir()`) and to stop:
    `train()` returns, and the script exits. Under several processes (torchrun, accelerate) the
    mark is shared at each step's end (one all-reduce of one number), so that every rank saves
    at the same step. The signal's former handler is put back at `on_train_end`."""

    def __init__(self, stop_signal: int = signal.SIGTERM) -> None:
        super().__init__()
        self.stop_signal = signal.Signals(stop_signal)
        #: The stop signal came in (the Trainer saves and stops at the step's end).
        self.stopping = False
        #: A checkpoint was saved because of it: the job stopped early.
        self.stopped = False
        self._previous: Any = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.stopping = self.stopped = False
        if threading.current_thread() is not threading.main_thread():
            warnings.warn(
                "corral.progress.huggingface.CorralCheckpoint: train() runs outside the main "
                "thread, where no signal handler can be set: no checkpoint when stopped",
                RuntimeWarning,
                stacklevel=2,
            )
            return
        self._previous = signal.signal(self.stop_signal, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if _any_rank(self.stopping, args):
            control.should_save = True
            control.should_training_stop = True
            self.stopped = True

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._previous is not None:
            signal.signal(self.stop_signal, self._previous)
            self._previous = None


def output_dir() -> str:
    """`$CORRAL_CHECKPOINT_DIR` (the job's, the same for every attempt) for
    `TrainingArguments(output_dir=...)`; "checkpoints" outside corral."""
    return os.environ.get("CORRAL_CHECKPOINT_DIR", "") or "checkpoints"


def resume_path(directory: str | os.PathLike[str] | None = None) -> str | None:
    """The newest complete checkpoint the Trainer saved in `directory` (default: `output_dir()`),
    for `trainer.train(resume_from_checkpoint=resume_path())`; None (start afresh) when there
    is none. A folder the Trainer had not finished (no trainer_state.json, which it writes
    last: the job was killed mid-save) is passed over."""
    folder = Path(output_dir() if directory is None else directory)
    try:
        names = [entry.name for entry in folder.iterdir() if entry.is_dir()]
    except OSError:
        return None
    found = sorted(
        (int(match.group(1)), name) for name in names if (match := _CHECKPOINT.match(name))
    )
    for _, name in reversed(found):
        if (folder / name / _STATE).is_file():
            return str(folder / name)
    return None


def _any_rank(flag: bool, args: Any) -> bool:
    """`flag` on any process of the run (itself when there is one)."""
    try:
        import torch.distributed as dist
    except ImportError:
        return flag
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return flag
    import torch

    shared = torch.tensor([1 if flag else 0], device=getattr(args, "device", "cpu"))
    dist.all_reduce(shared, op=dist.ReduceOp.MAX)
    return bool(shared.item())


def _total(state: Any) -> float | None:
    total = _finite(getattr(state, "max_steps", None))
    return total if total is not None and total > 0 else None


def _epoch(state: Any) -> dict[str, float]:
    epoch = _finite(getattr(state, "epoch", None))
    return {} if epoch is None else {"epoch": epoch}


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None
