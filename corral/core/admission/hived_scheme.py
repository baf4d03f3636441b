"""The `hived` admission scheme: each VC schedules inside its guaranteed cells
(corral.core.tenancy.hived.HivedScheduler)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from corral.core.admission.base import AdmissionScheme, Assembly
from corral.core.options import option
from corral.core.plugin import PluginError
from corral.core.protocol import SchedulerCore
from corral.core.tenancy.hived import HivedScheduler


@dataclass(frozen=True, slots=True)
class HivedOptions:
    lend: bool = option(
        True,
        help="run a VC's waiting jobs on other VCs' idle cells, evicted when those VCs need them",
    )


class Hived(AdmissionScheme):
    name = "hived"
    summary = "HiveD: each VC owns cells that keep their topology; idle cells are lent"
    Options = HivedOptions
    stages = frozenset()
    why_not = {
        "packing": "each VC schedules on its own virtual cluster",
        "migration": "each VC schedules on its own virtual cluster",
        "cache": "each VC schedules on its own virtual cluster",
    }

    @classmethod
    def unsupported_placement(cls, options: Any, placement: str) -> str | None:
        if placement == "hetero" and options.lend:
            # A lent job the lender's matching would not place bounces back every round.
            return "placement hetero does not run with admission hived lending (hived.lend false)"
        return None

    @classmethod
    def build(cls, options: Any, parts: Assembly) -> SchedulerCore:
        services = parts.services
        if not any(services.vc_cells.values()):
            raise PluginError(
                "admission hived: the VCs need guaranteed cells (a cluster config with "
                "virtual_clusters)"
            )
        return HivedScheduler(
            services.cluster,
            services.vc_cells,
            parts.policy,
            parts.placement,
            speed_model_for=services.speed_model_for,
            restore_s=parts.restore_s,
            backfill=parts.backfill,
            spill=options.lend,
            retry=parts.retry,
        )
