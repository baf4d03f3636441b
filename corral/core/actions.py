"""What the core asks its shell (simulator or live manager) to carry out."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class Start:
    """Run the job on exactly these GPUs. `resumed`: it ran before and restores its checkpoint."""

    job_id: str
    gpus: tuple[int, ...]
    relaxed: bool = False
    resumed: bool = False


@dataclass(slots=True, frozen=True)
class Preempt:
    """Stop the job through its checkpoint contract (signal, grace period, kill); it waits again.

    The core already counts its GPUs as free: the shell must not start a job on them before the
    preempted job's processes are gone.
    """

    job_id: str
    gpus: tuple[int, ...]
    by_job_id: str


Action = Start | Preempt


@dataclass(slots=True, frozen=True)
class Decision:
    actions: list[Action]
    #: When the scheduler wants to decide again even if nothing happens (a timer), or None.
    wake_at: float | None
