"""Co-location speeds: what two jobs sharing the same GPUs get done, each relative to alone.

What a shell offers Gandiva's packing (corral.core.packing) through `Services.pair_table`: in the
simulator a measured table (`PairTable`, read by corral.sim.colocation), in the live manager what
it measured of the jobs' models (`corral.core.profiles.Profiles.pair_speeds`). Kept apart from the
stage that uses them so that the shells and `Services` name them without importing a plugin.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from corral.core.job import Job

#: (guest, host, GPU type) -> (guest's, host's) throughput when they share their GPUs, each
#: relative to its throughput alone; None when the pair cannot share (not measured, no room).
PairSpeeds = Callable[[Job, Job, str], tuple[float, float] | None]

#: (GPU type, GPU count, guest's model, host's model).
PairKey = tuple[str, int, str, str]


class PairTable:
    """Measured co-location speeds by (GPU type, GPU count, guest model, host model).

    `complete`: the table is all that will ever be known (the simulator's, which measures
    nothing): a pair it lacks cannot share, (0, 0), rather than unknown (None), so the stage's
    prior for pairs never measured does not apply to it."""

    def __init__(
        self, pairs: Mapping[PairKey, tuple[float, float]], *, complete: bool = False
    ) -> None:
        self._pairs = dict(pairs)
        self._missing = (0.0, 0.0) if complete else None

    def __len__(self) -> int:
        return len(self._pairs)

    def __call__(self, guest: Job, host: Job, gpu_type: str) -> tuple[float, float] | None:
        key = (gpu_type, guest.spec.gpus, guest.spec.model, host.spec.model)
        return self._pairs.get(key, self._missing)
