"""Gandiva's packing: two jobs share the same GPUs when together they get more done than apart.

Gandiva (Xiao et al., OSDI'18, section 4.2) packs jobs onto the same GPUs only when the cluster is
overloaded, and keeps a packing only when the packed jobs' total throughput beats giving each the
GPUs in turn. Here the throughputs are known in advance: a `PairSpeeds` function (in the simulator,
Gavel's measured co-location table) gives, for two jobs of the same GPU count on one GPU type, each
job's throughput when they share relative to its throughput alone. Sharing beats taking turns when
the two add up to more than 1; a pair is formed only above `threshold` (1 plus a margin for the
interference that the table's averages hide).

The scheduler asks `choose_host` for a waiting job that could neither be placed nor make room by
preemption; the guest then starts on exactly the host's GPUs (a GPU holds two jobs at most, and
stays allocated while either runs). Both run at their packed speeds (`Job.change_speed`); when
one of them stops, the other returns to its speed alone. Preempting a packed job frees no GPU
unless its partner is preempted too (`frees_gpus`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from corral.core.cluster import Cluster
from corral.core.job import Job, JobStatus
from corral.core.options import option
from corral.core.placement.base import Placed
from corral.core.plugin import PluginError, Services
from corral.core.stages import RoundHost, Stage

if TYPE_CHECKING:
    from corral.core.actions import Action

#: (guest, host, GPU type) -> (guest's, host's) throughput when they share their GPUs, each
#: relative to its throughput alone; None when the pair cannot share (not measured, no room).
PairSpeeds = Callable[[Job, Job, str], tuple[float, float] | None]

#: Gandiva keeps a packing when it beats time-slicing, whose total is 1; 10 % more is asked for.
DEFAULT_THRESHOLD = 1.1

# Waiting jobs that may look for a host in one scheduling round: bounds a round's work when the
# queue is long and nothing fits.
MAX_TRIES_PER_ROUND = 64


class PairTable:
    """Measured co-location speeds by (GPU type, GPU count, guest model, host model)."""

    def __init__(self, pairs: Mapping[tuple[str, int, str, str], tuple[float, float]]) -> None:
        self._pairs = dict(pairs)

    def __len__(self) -> int:
        return len(self._pairs)

    def __call__(self, guest: Job, host: Job, gpu_type: str) -> tuple[float, float] | None:
        return self._pairs.get((gpu_type, guest.spec.gpus, guest.spec.model, host.spec.model))


@dataclass(frozen=True, slots=True)
class PackingOptions:
    threshold: float = option(
        DEFAULT_THRESHOLD,
        help="pack two jobs on one GPU only if their summed normalized speed exceeds this",
        low=0,
        low_open=True,
    )
    max_tries_per_round: int = option(MAX_TRIES_PER_ROUND, help="packing attempts per round", low=1)


class Packing(Stage):
    name = "packing"
    summary = "Gandiva's packing: two jobs share GPUs when their pair throughput gains"
    Options = PackingOptions
    point = "share"
    shares_gpus = True

    @classmethod
    def from_options(cls, options: Any, services: Services) -> Packing:
        if services.pair_table is None:
            raise PluginError("stage packing: needs co-location throughputs (a gavel trace's table)")
        return cls(services.pair_table, options.threshold, options.max_tries_per_round)

    def __init__(
        self,
        pair_speeds: PairSpeeds,
        threshold: float = DEFAULT_THRESHOLD,
        max_tries_per_round: int = MAX_TRIES_PER_ROUND,
    ) -> None:
        if not threshold > 0:
            raise ValueError(f"the packing threshold must be positive, got {threshold}")
        self.pair_speeds = pair_speeds
        self.threshold = threshold
        self.max_tries_per_round = max_tries_per_round
        self.partner: dict[str, Job] = {}
        self._alone_speed: dict[str, float] = {}
        self._since: dict[str, float] = {}
        self.pairs_formed = 0
        #: GPU-seconds during which a GPU held two jobs (ended pairs; see `packed_gpu_s_at`).
        self.packed_gpu_s = 0.0
        self._hosts: dict[tuple[int, str], dict[str, list[Job]]] | None = None
        self._refused: set[tuple[str, int, frozenset[str] | None]] = set()
        self._tries = 0

    # -- one scheduling round -----------------------------------------------------------------

    def new_round(self) -> None:
        self._hosts = None
        self._refused.clear()
        self._tries = 0

    def may_try(self) -> bool:
        return self._tries < self.max_tries_per_round

    keeps_walking = may_try

    def try_start(self, host: RoundHost, job: Job, now: float, actions: list[Action]) -> bool:
        """Start the job on the GPUs of a running job it runs well beside."""
        choice = self.choose_host(job, host.running_jobs(), host.cluster)
        if choice is None:
            return False
        partner, guest_speed, host_speed = choice
        host.cluster.release(partner.placement)  # start_on takes them again: once, for two
        host.start_on(job, Placed(partner.placement), now, actions)
        for member, speed in self.pair(job, partner, guest_speed, host_speed, now):
            host.change_speed(member, speed, now)
        job.last_event = f"started sharing the GPUs of job {partner.id}"
        return True

    def shares(self, job: Job) -> bool:
        return job.id in self.partner

    def partner_release(self, job: Job, now: float) -> tuple[Job, float] | None:
        return self.unpair(job, now)

    def counters(self) -> dict[str, int]:
        return {"packed_pairs": self.pairs_formed}

    def choose_host(
        self, guest: Job, running: Iterable[Job], cluster: Cluster
    ) -> tuple[Job, float, float] | None:
        """The running job whose GPUs the guest should share, with the pair's (guest, host)
        relative speeds: the best total above the threshold, ties to the earliest host."""
        if not self.may_try() or not guest.spec.plain:  # Gandiva packs whole-GPU jobs
            return None
        self._tries += 1
        kind = (guest.spec.model, guest.spec.gpus, guest.spec.gpu_types)
        if kind in self._refused:
            return None
        if self._hosts is None:  # running jobs that could host, by size, GPU type and model
            self._hosts = {}
            for job in running:
                if job.id not in self.partner and job.placement and job.spec.plain:
                    gpu_type = cluster.gpus[job.placement[0]].gpu_type
                    by_model = self._hosts.setdefault((job.spec.gpus, gpu_type), {})
                    by_model.setdefault(job.spec.model, []).append(job)
        best: tuple[float, int, Job, float, float] | None = None
        for (gpus, gpu_type), by_model in self._hosts.items():
            if gpus != guest.spec.gpus or not guest.spec.accepts(gpu_type):
                continue
            for jobs in by_model.values():
                host = self._first_free_host(jobs, guest)
                if host is None:
                    continue
                speeds = self.pair_speeds(guest, host, gpu_type)
                if speeds is None or speeds[0] + speeds[1] <= self.threshold:
                    continue
                candidate = (-(speeds[0] + speeds[1]), host.seq, host, *speeds)
                if best is None or candidate[:2] < best[:2]:
                    best = candidate
        if best is None:
            self._refused.add(kind)
            return None
        return best[2], best[3], best[4]

    def _first_free_host(self, jobs: list[Job], guest: Job) -> Job | None:
        while jobs and (jobs[0].status is not JobStatus.RUNNING or jobs[0].id in self.partner):
            jobs.pop(0)  # started sharing or stopped since the round began
        for job in jobs:
            if job is not guest:
                return job
        return None

    # -- pairs ----------------------------------------------------------------------------------

    def pair(
        self, guest: Job, host: Job, guest_speed: float, host_speed: float, now: float
    ) -> list[tuple[Job, float]]:
        """Record the pair; returns each job with its new (packed) speed."""
        changes = []
        for job, other, relative in ((guest, host, guest_speed), (host, guest, host_speed)):
            self.partner[job.id] = other
            self._alone_speed[job.id] = job.speed
            self._since[job.id] = now
            changes.append((job, job.speed * relative))
        self.pairs_formed += 1
        return changes

    def unpair(self, job: Job, now: float) -> tuple[Job, float] | None:
        """The job stops sharing (it stops): its partner, and the partner's speed alone."""
        partner = self.partner.pop(job.id, None)
        if partner is None:
            return None
        del self.partner[partner.id]
        self.packed_gpu_s += job.spec.gpus * (now - self._since.pop(job.id))
        del self._since[partner.id]
        del self._alone_speed[job.id]
        return partner, self._alone_speed.pop(partner.id)

    def frees_gpus(self, victim: Job, chosen: dict[str, Job]) -> bool:
        """Would preempting the victim free its GPUs? Only with its partner, if it has one:
        the first of a pair is remembered in `chosen`, the second frees the pair's GPUs."""
        partner = self.partner.get(victim.id)
        if partner is None or partner.id in chosen:
            return True
        chosen[victim.id] = victim
        return False

    def packed_gpu_s_at(self, now: float) -> float:
        """Packed GPU-seconds so far, counting the pairs still running (each pair once)."""
        running = sum(
            self.partner[job_id].spec.gpus * (now - since) for job_id, since in self._since.items()
        )
        return self.packed_gpu_s + running / 2  # both members are counted
