"""The options of the packing stage (corral.core.packing), apart so that they are read (a config's sections, the
CLI flags) without importing the plugin: corral.core.registry."""

from __future__ import annotations

from dataclasses import dataclass

from corral.core.options import option

#: Gandiva keeps a packing when it beats time-slicing, whose total is 1; 10 % more is asked for.
DEFAULT_THRESHOLD = 1.1

#: Each job's speed relative to alone assumed for a pair never measured: 0.6 + 0.6 = 1.2 is above
#: the default threshold, so such a pair is tried (once), and then measured.
DEFAULT_UNMEASURED = 0.6

# Waiting jobs that may look for a host in one scheduling round: bounds a round's work when the
# queue is long and nothing fits.
MAX_TRIES_PER_ROUND = 64


@dataclass(frozen=True, slots=True)
class PackingOptions:
    threshold: float = option(
        DEFAULT_THRESHOLD,
        help="pack two jobs on one GPU only if their summed normalized speed exceeds this",
        low=0,
        low_open=True,
    )
    max_tries_per_round: int = option(MAX_TRIES_PER_ROUND, help="packing attempts per round", low=1)
    unmeasured: float = option(
        DEFAULT_UNMEASURED,
        help="each job's speed relative to alone assumed for a pair never measured: such a pair "
        "is tried once (if twice this exceeds the threshold), then its measurement decides; "
        "0: never pack a pair before it is measured",
        low=0,
        high=1,
    )
