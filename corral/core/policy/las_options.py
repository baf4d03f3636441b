"""LAS's options (corral.core.policy.las), apart so that the compiled build (setup.py) leaves
them as they are: mypyc would erase the types of their fields, which the options read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from corral.core.options import option

#: Queue boundaries in GPU-seconds: 1 GPU-hour and 10 GPU-hours (three queues).
DEFAULT_THRESHOLDS_GPU_S = (3_600.0, 36_000.0)
#: Whether a waiting job preempts running jobs of its own queue (docs/policies.md: the rule).
PREEMPT_WITHIN_QUEUE = False
QueueOrder = Literal["entered", "started"]


@dataclass(frozen=True, slots=True)
class LasOptions:
    thresholds_gpu_s: tuple[float, ...] = option(
        DEFAULT_THRESHOLDS_GPU_S,
        help="queue boundaries in GPU-seconds of attained service, increasing",
        low=0,
        low_open=True,
    )
    starvation_factor: float | None = option(
        None,
        help="promote a job that waited this many times its executed time to the top queue",
        low=0,
        low_open=True,
    )
    preempt_within_queue: bool = option(
        PREEMPT_WITHIN_QUEUE,
        help="a waiting job may preempt running jobs of its own queue that come after it (off: "
        "only a job of a higher queue preempts, as in Tiresias)",
    )
    queue_order: QueueOrder = option(
        "entered",
        help="order inside a queue: entered (by the instant each job entered it) or started (the "
        "Tiresias simulator's: running jobs by start, the latest gives way first; then waiting "
        "ones, the most recently preempted first)",
    )
    demote_at_rounds: bool = option(
        False,
        help="move jobs between queues only at rounds that happen anyway (arrivals, ends), as "
        "the Tiresias simulator checks them at its events (off: at the instant a job crosses a "
        "threshold)",
    )

    def validate(self) -> str | None:
        thresholds = list(self.thresholds_gpu_s)
        if thresholds != sorted(set(thresholds)):
            return "thresholds_gpu_s must be strictly increasing"
        return None
