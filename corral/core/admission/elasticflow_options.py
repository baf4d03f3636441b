"""The options of the elasticflow admission (corral.core.admission.elasticflow), apart so that they are read (a config's sections, the
CLI flags) without importing the plugin: corral.core.registry."""

from __future__ import annotations

from dataclasses import dataclass

from corral.core.options import option


@dataclass(frozen=True, slots=True)
class ElasticFlowOptions:
    migrate: bool = option(
        True, help="move running jobs out of the way when free GPUs are too scattered"
    )
