"""Quota with hierarchical queues: VCs under departments, each level with a quota, an over-quota
weight and a limit (the cluster config's `departments` and a VC's `parent`, `weight`, `limit`;
the shares are corral.core.queues's).

`quota` builds this admission instead of the flat one when the cluster config declares any of
those keys; a flat config decides exactly as before. What changes is who is lent idle GPUs and
who gives them back:

- A VC's jobs within its quota are guaranteed, as under flat quota.
- Beyond its quota a VC is lent GPUs up to its *fair share*: its quota, plus its part, by weight,
  of what its department's share leaves over; the department's share is its quota plus its part,
  by weight, of what the cluster leaves over. So a team's idle quota goes to its department's
  other teams first, and only what the department as a whole leaves idle goes to other
  departments. Demand is every VC's running and waiting guaranteed GPUs, so nothing is set aside
  for a queue that asks for nothing.
- Limits cap every level: a job beyond its quota does not start while it would take its VC, or
  any department above it, past its limit.
- Each round walks the queue in the policy's order: jobs within their quotas, then jobs within
  their fair shares, then (with oversubscription) any job on GPUs still idle, opportunistic jobs
  last. A job started beyond its fair share is the first to give its GPUs back.
- A job within its fair share reclaims GPUs from VCs over theirs, where the victim's branch (its
  VC, or its department when the two VCs are in different departments) is over its share too:
  opportunistic jobs first, then borrowers from outside the claimant's department, then those
  within it, each group the VCs furthest over their shares first.

Without oversubscription (`--no-quota-oversubscribe`) idle quota is lent only within a
department: a department (or a VC under no department) gets nothing beyond its quota.
`--quota-lend-last` is how this admission always walks.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from corral.core.admission.quota import Quota, QuotaAdmission
from corral.core.cluster import Cluster
from corral.core.job import Job, JobSpec, Priority
from corral.core.plugin import Services
from corral.core.protocol import Admission as AdmissionHooks
from corral.core.queues import EPSILON, QueueTree

OPPORTUNISTIC = Priority.OPPORTUNISTIC

#: The walks of a round: within quotas, within fair shares, idle GPUs for guaranteed jobs only
#: (when opportunistic jobs wait), and the last one, which admits everything it may.
QUOTA, SHARE, IDLE, ALL = "quota", "share", "idle", "all"


class QueuesAdmission(QuotaAdmission):
    name = "quota"

    def __init__(self, tree: QueueTree, cluster: Cluster, oversubscribe: bool = True) -> None:
        vcs = tree.vcs()
        super().__init__(
            {vc: tree.queues[vc].quota for vc in vcs},
            oversubscribe=oversubscribe,
            lend_last=True,
            opportunistic_last=True,
        )
        self.tree = tree
        self.cluster = cluster
        self.chains = {vc: tree.chain(vc) for vc in vcs}
        #: GPUs of guaranteed jobs running, per VC and department.
        self.level_usage: dict[str, int] = dict.fromkeys(tree.queues, 0)
        self.waiting_gpus: dict[str, int] = dict.fromkeys(vcs, 0)
        self.stage = ALL
        self._shares: dict[str, float] | None = None

    # -- shares ---------------------------------------------------------------------------

    def fair_shares(self) -> dict[str, float]:
        """Every queue's fair share now (recomputed after any start, stop or queue change)."""
        if self._shares is None:
            demand = {vc: self.usage[vc] + self.waiting_gpus[vc] for vc in self.usage}
            self._shares = self.tree.fair_shares(
                demand, self.cluster.total_gpus, across=self.oversubscribe
            )
        return self._shares

    def share(self, vc: str) -> float:
        return self.fair_shares()[vc]

    def _over(self, name: str) -> float:
        """How far the queue is over its fair share (GPUs; 0 or less: not over)."""
        return self.level_usage[name] - self.fair_shares()[name]

    def _branch(self, victim_vc: str, vc: str) -> str:
        """The victim's queue that competes with the claimant's: the one right below the
        department they share (the victim's top-level queue when they share none)."""
        mine = set(self.chains[vc])
        chain = self.chains[victim_vc]
        for lower, upper in zip(chain, chain[1:], strict=False):
            if upper in mine:
                return lower
        return chain[-1]

    def _common(self, victim_vc: str, vc: str) -> int:
        """How many departments the two VCs share (0: none, they meet at the cluster)."""
        return len(set(self.chains[victim_vc][1:]) & set(self.chains[vc][1:]))

    def _lends(self, victim_vc: str, vc: str) -> bool:
        """The victim's VC holds GPUs a job of `vc` may take back: it is over its share, and so
        is its branch against the claimant's."""
        return (
            victim_vc != vc
            and self._over(victim_vc) > EPSILON
            and self._over(self._branch(victim_vc, vc)) > EPSILON
        )

    def _within_share(self, job: Job) -> bool:
        if job.spec.priority is OPPORTUNISTIC:
            return False
        return self.usage[job.spec.vc] + job.spec.gpus <= self.share(job.spec.vc) + EPSILON

    def _past_limit(self, vc: str, gpus: int) -> str | None:
        for name in self.chains[vc]:
            limit = self.tree.queues[name].limit
            if limit is not None and self.level_usage[name] + gpus > limit:
                what = "VC" if name == vc else "department"
                return (
                    f"{what} {name} is at its limit: {self.level_usage[name]} of {limit} GPUs "
                    f"in use, {gpus} more asked"
                )
        return None

    # -- verdicts -------------------------------------------------------------------------

    def capacity(self, spec: JobSpec) -> int | None:
        """The most GPUs a guaranteed job may ask for: the smallest limit above it and, without
        oversubscription, its top-level queue's quota (nothing is lent across)."""
        if spec.priority is OPPORTUNISTIC:
            return None
        chain = self.chains[spec.vc]
        bounds = [q.limit for q in (self.tree.queues[n] for n in chain) if q.limit is not None]
        if not self.oversubscribe:
            bounds.append(self.tree.queues[chain[-1]].quota)
        return min(bounds) if bounds else None

    def walks(self) -> Iterator[None]:
        try:
            self.stage = QUOTA
            yield
            self.stage = SHARE
            yield
            if self.oversubscribe and self.opportunistic_waiting:
                self.stage = IDLE
                yield
        finally:
            self.stage = ALL

    def check(self, job: Job) -> str | None:
        vc, gpus = job.spec.vc, job.spec.gpus
        if job.spec.priority is OPPORTUNISTIC:
            if self.stage == ALL:
                return None
            return (
                "opportunistic: runs only on GPUs idle once the round's guaranteed jobs are placed"
            )
        if self.usage[vc] + gpus <= self.quota[vc]:
            return None
        if self.stage == QUOTA:
            return f"VC {vc} is at its quota; idle GPUs are lent once jobs within quotas are placed"
        past = self._past_limit(vc, gpus)
        if past is not None:
            return past
        if self._within_share(job) or (self.oversubscribe and self.stage != SHARE):
            return None
        return (
            f"VC {vc} is at its fair share: {self.usage[vc]} GPUs in use of a share of "
            f"{self.share(vc):.4g} (quota {self.quota[vc]}), {gpus} more asked"
        )

    def reclaimable(self, victim: Job, job: Job) -> bool:
        if job.spec.priority is OPPORTUNISTIC:
            return False
        if victim.spec.priority is OPPORTUNISTIC:
            return True
        return self._lends(victim.spec.vc, job.spec.vc) and self._within_share(job)

    def reclaim(self, job: Job, running: Iterable[Job]) -> Iterator[Job]:
        """Opportunistic jobs first (lowest priority first, as `running` comes), then the
        borrowers of VCs in fewer departments shared with the job's, each group the VC furthest
        over its share first."""
        if job.spec.priority is OPPORTUNISTIC or not self._within_share(job):
            return
        vc = job.spec.vc
        borrowers: list[tuple[int, float, int, Job]] = []
        for index, victim in enumerate(running):
            if victim.spec.priority is OPPORTUNISTIC:
                yield victim
            elif self._lends(victim.spec.vc, vc):
                w = victim.spec.vc
                borrowers.append((self._common(w, vc), -self._over(w), index, victim))
        borrowers.sort(key=lambda entry: entry[:3])
        yield from (entry[3] for entry in borrowers)

    def someone_over_share(self) -> bool:
        return self.opportunistic_gpus > 0 or any(self._over(vc) > EPSILON for vc in self.usage)

    def can_reclaim(self, job: Job) -> bool:
        if job.spec.priority is OPPORTUNISTIC:
            return False
        return self.opportunistic_gpus > 0 or (
            self._within_share(job) and any(self._lends(w, job.spec.vc) for w in self.usage)
        )

    def describe(self, job: Job) -> str | None:
        plain = super().describe(job)
        if plain is not None:
            return plain
        vc = job.spec.vc
        parents = self.chains[vc][1:]
        where = f" in department {' / '.join(reversed(parents))}" if parents else ""
        return (
            f"VC {vc}{where}: quota {self.quota[vc]} GPUs, fair share now "
            f"{self.share(vc):.4g}, {self.usage[vc]} in use"
        )

    # -- accounting -----------------------------------------------------------------------

    def on_start(self, job: Job, now: float) -> None:
        if job.spec.priority is OPPORTUNISTIC:
            super().on_start(job, now)
            return
        vc = job.spec.vc
        self.usage[vc] += job.spec.gpus
        for name in self.chains[vc]:
            self.level_usage[name] += job.spec.gpus
        job.borrowed = self.usage[vc] > self.quota[vc]
        self.borrowed_starts += job.borrowed
        self._shares = None

    def on_stop(self, job: Job, now: float) -> None:
        if job.spec.priority is OPPORTUNISTIC:
            super().on_stop(job, now)
            return
        vc = job.spec.vc
        self.usage[vc] -= job.spec.gpus
        for name in self.chains[vc]:
            self.level_usage[name] -= job.spec.gpus
        job.borrowed = False
        self._shares = None

    def on_queue(self, job: Job, delta: int) -> None:
        super().on_queue(job, delta)
        if job.spec.priority is not OPPORTUNISTIC:
            self.waiting_gpus[job.spec.vc] += delta * job.spec.gpus
            self._shares = None


class HierarchicalQuota(Quota):
    """`quota` (the registry's entry): flat VCs as `Quota` decides them, and VCs under
    departments, or with weights or limits, by `QueuesAdmission`."""

    queues = True

    @classmethod
    def admission(cls, options: Any, services: Services) -> AdmissionHooks | None:
        if services.vc_tree is None:
            return super().admission(options, services)
        return QueuesAdmission(
            services.vc_tree, services.cluster, oversubscribe=options.oversubscribe
        )
