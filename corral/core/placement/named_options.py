"""The options of the named placements (corral.core.placement.named), apart so that the compiled
build (setup.py) leaves them as they are: mypyc would erase the types of their fields, which the
options read."""

from __future__ import annotations

from dataclasses import dataclass

from corral.core.options import option

#: Seconds a job waits for a consolidated placement before relax takes the fewest nodes anywhere.
DEFAULT_RELAX_AFTER_S = 600.0


@dataclass(frozen=True, slots=True)
class RelaxOptions:
    after_s: float = option(
        DEFAULT_RELAX_AFTER_S,
        help="seconds a job waits for locality before taking the fewest nodes anywhere",
        low=0,
    )


@dataclass(frozen=True, slots=True)
class ProfileOptions:
    sensitive_above: float = option(
        1.1, help="consolidate a job whose spread slowdown is above this factor", low=1
    )
