"""Gittins's options (corral.core.policy.gittins), apart so that the compiled build (setup.py)
leaves them as they are: mypyc would erase the types of their fields, which the options read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from corral.core.options import option
from corral.core.policy.las_options import DEFAULT_THRESHOLDS_GPU_S


@dataclass(frozen=True, slots=True)
class GittinsOptions:
    thresholds_gpu_s: tuple[float, ...] = option(
        DEFAULT_THRESHOLDS_GPU_S,
        help="service levels (GPU-seconds) where the index is evaluated, besides the quantiles",
        low=0,
        low_open=True,
    )
    quantiles: int = option(
        20,
        help="quantiles of the job-size distribution used as index levels (at least the number "
        "of samples: every sample is a level)",
        low=1,
    )
    queues: bool = option(
        False,
        help="order by LAS queue first (thresholds_gpu_s), by index inside a queue (Tiresias's "
        "dlas-gpu-gittins)",
    )
    delta_gpu_s: float | None = option(
        None,
        help="the index for this one quantum of service instead of the best quantum (none: the "
        "best)",
        low=0,
        low_open=True,
    )
    formula: Literal["gittins", "tiresias"] = option(
        "gittins",
        help="gittins (the index above) or tiresias (the Tiresias simulator's own: expected "
        "service from the samples' sizes, not what remains of them, rounded; needs "
        "delta_gpu_s)",
    )
    demote_at_rounds: bool = option(
        False,
        help="take index and queue changes only at rounds that happen anyway (arrivals, ends), "
        "as the Tiresias simulator does at its events (off: at the instant they happen)",
    )
