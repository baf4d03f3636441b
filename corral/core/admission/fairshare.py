"""Fair share: VCs split the cluster by weight, discounted by their recent usage, as Slurm does.

Among the VCs with running or waiting jobs (with one resource, GPUs, this is what DRF reduces
to), a VC's share is the cluster's GPUs in proportion to `weight x factor`, recomputed as VCs come
and go. Idle shares are always lent, and a VC below its share reclaims GPUs from VCs above theirs.

`factor` is Slurm's classic fair-share factor `2^(-U/S)` (Slurm's "Classic Fairshare Algorithm"
page): S is the VC's normalized weight (its weight over all weights) and U its normalized usage,
its GPU-seconds decayed with a half-life (`PriorityDecayHalfLife`, 7 days by default in Slurm)
over every VC's. A VC that used more than its weight in the recent past gets less now and the
others more, so fairness holds over time and not only at one instant. With `half_life_s` 0 no
usage is remembered and every factor is 1: shares are the weights alone.

Opportunistic jobs (`priority: opportunistic`) are treated as under `quota` (idle GPUs only,
preempted by any guaranteed job before any guaranteed borrower, never preempting) and are not
charged, as HiveD does not charge them to a VC: their GPU-seconds add nothing to the VC's decayed
usage, and a VC whose only work is opportunistic takes no share (it is not active). Uncharged work
is safe because it never holds a GPU a guaranteed job wants. Fair share has no `lend_last`
(guaranteed jobs are lent idle GPUs in the queue's order); opportunistic jobs are always placed
after the round's guaranteed ones.

Decayed usage is exact between events: a VC running r GPUs since t0 with usage U0 has, at t,
`U0 2^-(t-t0)/H + r H/ln2 (1 - 2^-(t-t0)/H)`. Shares are settled at the start of each round
(`begin_round`) and at each start and stop, so one round sees one set of shares.
"""

from __future__ import annotations

import math
from typing import Any

from corral.core.admission.fairshare_options import SLURM_HALF_LIFE_S as SLURM_HALF_LIFE_S
from corral.core.admission.fairshare_options import FairShareOptions as FairShareOptions
from corral.core.admission.quota import Quota, QuotaAdmission
from corral.core.job import Job
from corral.core.plugin import PluginError, Services
from corral.core.protocol import Admission as AdmissionHooks


class FairShareAdmission(QuotaAdmission):
    name = "fairshare"

    def __init__(
        self, weights: dict[str, float], total_gpus: int, half_life_s: float = 0.0
    ) -> None:
        super().__init__(
            {vc: total_gpus for vc in weights}, oversubscribe=True, opportunistic_last=True
        )
        if half_life_s < 0:
            raise ValueError("half_life_s must not be negative")
        self.weights = dict(weights)
        self.total_gpus = total_gpus
        self.half_life_s = half_life_s
        self._active: set[str] = set()  # VCs with running or waiting jobs
        self._weight_sum = sum(self.weights.values())
        self.decayed_gpu_s: dict[str, float] = {vc: 0.0 for vc in weights}
        self._settled_at: float | None = None
        self._effective: dict[str, float] = dict(self.weights)  # weight x fair-share factor
        self._active_effective = 0.0

    def share(self, vc: str) -> float:
        weight = self._effective[vc]
        active = self._active_effective + (0.0 if vc in self._active else weight)
        return self.total_gpus * weight / active if active > 0 else float(self.total_gpus)

    def factor(self, vc: str) -> float:
        """Slurm's classic fair-share factor 2^(-U/S) of the VC, as last settled."""
        return self._effective[vc] / self.weights[vc]

    def begin_round(self, now: float) -> None:
        self._settle(now)

    def on_start(self, job: Job, now: float) -> None:
        self._settle(now)
        super().on_start(job, now)
        self._recount(job.spec.vc)

    def on_stop(self, job: Job, now: float) -> None:
        self._settle(now)
        super().on_stop(job, now)
        self._recount(job.spec.vc)

    def on_queue(self, job: Job, delta: int) -> None:
        super().on_queue(job, delta)
        self._recount(job.spec.vc)

    def _settle(self, now: float) -> None:
        """Decay usage up to `now`, add what ran meanwhile, and recompute the factors."""
        half_life = self.half_life_s
        since = self._settled_at
        self._settled_at = now
        if half_life <= 0 or since is None or now <= since:
            return
        kept = 2.0 ** (-(now - since) / half_life)
        gained = half_life / math.log(2.0) * (1.0 - kept)
        for vc, used in self.decayed_gpu_s.items():
            self.decayed_gpu_s[vc] = used * kept + self.usage[vc] * gained
        total_usage = sum(self.decayed_gpu_s.values())
        if total_usage <= 0:
            return
        for vc, weight in self.weights.items():
            normalized_usage = self.decayed_gpu_s[vc] / total_usage
            normalized_share = weight / self._weight_sum
            self._effective[vc] = weight * 2.0 ** (-normalized_usage / normalized_share)
        self._active_effective = sum(self._effective[vc] for vc in self._active)

    def _recount(self, vc: str) -> None:
        active = self.usage[vc] > 0 or self.waiting[vc] > 0
        if active and vc not in self._active:
            self._active.add(vc)
        elif not active and vc in self._active:
            self._active.discard(vc)
        else:
            return
        self._active_effective = sum(self._effective[v] for v in self._active)


class FairShare(Quota):
    """Quota's scheme (the same stages) with shares that follow weights and usage."""

    name = "fairshare"
    summary = "VCs share by weight, discounted by decayed past usage (Slurm's fair-share)"
    Options = FairShareOptions

    @classmethod
    def admission(cls, options: Any, services: Services) -> AdmissionHooks | None:
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
        return FairShareAdmission(weights, services.cluster.total_gpus, options.half_life_s)
