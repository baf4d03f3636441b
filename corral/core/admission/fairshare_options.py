"""The options of the fairshare admission (corral.core.admission.fairshare), apart so that they are read (a config's sections, the
CLI flags) without importing the plugin: corral.core.registry."""

from __future__ import annotations

import math
from dataclasses import dataclass

from corral.core.options import option

#: Slurm's default PriorityDecayHalfLife (slurm.conf(5)): 7 days.
SLURM_HALF_LIFE_S = 7 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class FairShareOptions:
    weights: tuple[str, ...] = option(
        (),
        help="VC=WEIGHT pairs (default: each VC's guaranteed GPUs, or 1 each)",
    )
    half_life_s: float = option(
        SLURM_HALF_LIFE_S,
        help="past usage counts half after this many seconds (0: shares ignore past usage)",
        low=0,
    )

    def validate(self) -> str | None:
        for pair in self.weights:
            vc, sep, weight = pair.partition("=")
            try:
                ok = bool(sep) and bool(vc) and float(weight) > 0 and math.isfinite(float(weight))
            except ValueError:
                ok = False
            if not ok:
                return f"weights: {pair!r} is not VC=WEIGHT with a positive weight"
        return None

    def parsed_weights(self) -> dict[str, float]:
        return {vc: float(w) for vc, _, w in (p.partition("=") for p in self.weights)}
