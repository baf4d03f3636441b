"""The options of the sharing placements fgd and random-fit (corral.core.placement.sharing), apart so that they are read (a config's sections, the
CLI flags) without importing the plugin: corral.core.registry."""

from __future__ import annotations

from dataclasses import dataclass

from corral.core.options import option


@dataclass(frozen=True, slots=True)
class FgdOptions:
    coverage: float = option(
        1.0,
        help="the target workload keeps the most popular task types covering this share of "
        "tasks (the paper's artifact uses 0.95)",
        low=0,
        high=1,
        low_open=True,
    )


@dataclass(frozen=True, slots=True)
class RandomFitOptions:
    seed: int | None = option(
        None, help="seed of the draws (none: the run's seed, --seed of corral simulate)", low=0
    )
