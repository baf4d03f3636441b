"""The options of the timeslice policy (corral.core.policy.timeslice), apart so that they are read (a config's sections, the
CLI flags) without importing the plugin: corral.core.registry."""

from __future__ import annotations

from dataclasses import dataclass

from corral.core.options import option

#: Why 600 s and not Gandiva's quantum of about a minute: Gandiva suspends a job in GPU memory at
#: a mini-batch boundary, which costs well under a second, while corral suspends through the
#: checkpoint contract, whose restore stall (`--restore-s`, 30 s by default) would eat half of a
#: one-minute turn. A 600 s quantum keeps that stall at 5 % of a turn.
DEFAULT_QUANTUM_S = 600.0


@dataclass(frozen=True, slots=True)
class TimeSliceOptions:
    quantum_s: float = option(
        DEFAULT_QUANTUM_S, help="length of a turn in seconds", low=0, low_open=True
    )
