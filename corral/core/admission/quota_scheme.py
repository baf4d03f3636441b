"""The `quota` and `fairshare` admission schemes: one scheduler over the physical cluster that
consults a GPU-count admission (corral.core.admission.quota, .fairshare)."""

from __future__ import annotations

from typing import Any

from corral.core.admission.base import AdmissionScheme, Assembly
from corral.core.admission.fairshare import FairShareAdmission, FairShareOptions
from corral.core.admission.quota import QuotaAdmission, QuotaOptions
from corral.core.plugin import PluginError
from corral.core.protocol import SchedulerCore

_PACKING = "a packed pair shares GPUs that a quota would count twice"


class Quota(AdmissionScheme):
    name = "quota"
    summary = "each VC owns a GPU count (YARN-CS, as Philly ran it); idle quota is lent"
    Options = QuotaOptions
    stages = frozenset({"migration", "cache"})
    why_not = {"packing": _PACKING}

    @classmethod
    def build(cls, options: Any, parts: Assembly) -> SchedulerCore:
        quota = parts.services.vc_quota_or_whole()
        admission = QuotaAdmission(
            quota, oversubscribe=options.oversubscribe, lend_last=options.lend_last
        )
        return parts.scheduler(admission=admission)


class FairShare(AdmissionScheme):
    name = "fairshare"
    summary = "VCs share by weight, discounted by decayed past usage (Slurm's fair-share)"
    Options = FairShareOptions
    stages = frozenset({"migration", "cache"})
    why_not = {"packing": _PACKING}

    @classmethod
    def build(cls, options: Any, parts: Assembly) -> SchedulerCore:
        services = parts.services
        weights = options.parsed_weights()
        vcs = set(services.vc_cells)
        unknown = sorted(set(weights) - vcs)
        if unknown:
            raise PluginError(
                f"fairshare.weights: unknown VC {unknown[0]!r}; VCs are {', '.join(sorted(vcs))}"
            )
        quota = services.vc_quota_or_whole()
        for vc in vcs - set(weights):  # default weight: the VC's guaranteed GPUs
            weights[vc] = float(quota.get(vc, 0)) or 1.0
        admission = FairShareAdmission(weights, services.cluster.total_gpus, options.half_life_s)
        return parts.scheduler(admission=admission)
