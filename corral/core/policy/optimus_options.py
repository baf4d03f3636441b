"""The options of the optimus policy (corral.core.policy.optimus), apart so that they are read (a config's sections, the
CLI flags) without importing the plugin: corral.core.registry."""

from __future__ import annotations

from dataclasses import dataclass

from corral.core.estimate import DEFAULT_CONVERGE_FRACTION, MIN_POINTS
from corral.core.options import option

#: Expected length of a job before any job has finished (ideal seconds).
DEFAULT_PRIOR_S = 3_600.0


@dataclass(frozen=True, slots=True)
class OptimusOptions:
    converge_fraction: float = option(
        DEFAULT_CONVERGE_FRACTION,
        help="a job is done when its loss is within this fraction of its fitted floor",
        low=0,
        high=1,
        low_open=True,
    )
    prior_s: float = option(
        DEFAULT_PRIOR_S,
        help="expected job length before any job finished (s)",
        low=0,
        low_open=True,
    )
    max_points: int = option(64, help="loss samples kept per job for the fit", low=MIN_POINTS)
    refit_min_s: float = option(
        300.0, help="shortest time between two fits of a running job (s)", low=0, low_open=True
    )
    refit_growth: float = option(
        0.5, help="refit after this fraction of the job's run time so far", low=0
    )

    def validate(self) -> str | None:
        return "converge_fraction must be below 1" if self.converge_fraction >= 1 else None
