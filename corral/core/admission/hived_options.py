"""The options of the hived admission (corral.core.admission.hived), apart so that they are read (a config's sections, the
CLI flags) without importing the plugin: corral.core.registry."""

from __future__ import annotations

from dataclasses import dataclass

from corral.core.options import option


@dataclass(frozen=True, slots=True)
class HivedOptions:
    lend: bool = option(
        True,
        help="run a VC's waiting jobs on other VCs' idle cells, evicted when those VCs need them",
    )
