"""The options of the migration stage (corral.core.migration), apart so that they are read (a config's sections, the
CLI flags) without importing the plugin: corral.core.registry."""

from __future__ import annotations

from dataclasses import dataclass

from corral.core.options import option

MAX_MOVES = 3
MAX_NODES = 16
MAX_PLANS_PER_ROUND = 8


@dataclass(frozen=True, slots=True)
class MigrationOptions:
    max_moves: int = option(MAX_MOVES, help="running jobs one plan may move", low=1)
    max_nodes: int = option(MAX_NODES, help="nodes a plan may consider", low=1)
    max_plans_per_round: int = option(MAX_PLANS_PER_ROUND, help="plans tried per round", low=1)
