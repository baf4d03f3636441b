"""The options of the hetero placement (corral.core.placement.hetero), apart so that they are read (a config's sections, the
CLI flags) without importing the plugin: corral.core.registry."""

from __future__ import annotations

from dataclasses import dataclass

from corral.core.options import option
from corral.core.placement.named_options import DEFAULT_RELAX_AFTER_S


@dataclass(frozen=True, slots=True)
class HeteroOptions:
    fairness: float | None = option(
        None,
        help="each job's speed at least this fraction of its equal-share speed (Gavel's max-min)",
        low=0,
        high=1,
        low_open=True,
    )
    max_jobs: int = option(32, help="waiting jobs matched to GPU types per round", low=1)
    relax_after_s: float = option(
        DEFAULT_RELAX_AFTER_S,
        help="on the type it matched, a job relaxes locality after waiting this long (s)",
        low=0,
    )
