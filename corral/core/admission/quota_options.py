"""The options of the quota admission (corral.core.admission.quota, .queues), apart so that they are read (a config's sections, the
CLI flags) without importing the plugin: corral.core.registry."""

from __future__ import annotations

from dataclasses import dataclass

from corral.core.options import option


@dataclass(frozen=True, slots=True)
class QuotaOptions:
    oversubscribe: bool = option(
        True, help="lend idle quota to other VCs' jobs, reclaimed by preemption when needed"
    )
    lend_last: bool = option(
        True,
        help="each round, place jobs within their quotas before lending idle GPUs "
        "(and opportunistic jobs after every guaranteed one)",
    )
