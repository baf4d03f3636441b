"""Gandiva's packing: two jobs share the same GPUs when together they get more done than apart.

Gandiva (Xiao et al., OSDI'18, section 4.2) packs jobs onto the same GPUs only when the cluster is
overloaded, and keeps a packing only when the packed jobs' total throughput beats giving each the
GPUs in turn. A `PairSpeeds` function gives, for two jobs of the same GPU count on one GPU type,
each job's throughput when they share relative to its throughput alone: in the simulator Gavel's
measured co-location table (`PairTable`), in the live manager what it measured of the jobs' models
(`corral.core.profiles.Profiles.pair_speeds`). Sharing beats taking turns when the two add up to
more than 1; a pair is formed only above `threshold` (1 plus a margin for the interference that
the averages hide).

A pair never measured (None) is tried once at the prior `unmeasured` (each job's relative speed;
twice it must exceed the threshold): Gandiva's introspection, pack tentatively and measure. From
then on only its measurement decides: a pair measured at or below the threshold is not packed
again, and a running pair whose measurement arrives or changes is re-judged as each round begins
(`begin_round`): split when it does not gain (the guest is stopped and waits again, "unpacked"),
else both run at the measured speeds. The simulator's table never changes and answers every pair
(one it lacks cannot share), so there neither the prior nor a re-judgement ever applies.

The scheduler asks `choose_host` for a waiting job that could neither be placed nor make room by
preemption; the guest then starts on exactly the host's GPUs (a GPU holds two jobs at most, and
stays allocated while either runs). Both run at their packed speeds (`Job.change_speed`); when
one of them stops, the other returns to its speed alone. Preempting a packed job frees no GPU
unless its partner is preempted too (`frees_gpus`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from corral.core.cluster import Cluster
from corral.core.colocation import PairKey, PairSpeeds
from corral.core.job import Job, JobStatus
from corral.core.packing_options import DEFAULT_THRESHOLD as DEFAULT_THRESHOLD
from corral.core.packing_options import DEFAULT_UNMEASURED as DEFAULT_UNMEASURED
from corral.core.packing_options import MAX_TRIES_PER_ROUND as MAX_TRIES_PER_ROUND
from corral.core.packing_options import PackingOptions as PackingOptions
from corral.core.placement.base import Placed
from corral.core.plugin import PluginError, Services
from corral.core.stages import RoundHost, Stage

if TYPE_CHECKING:
    from corral.core.actions import Action


#: A running pair's speeds follow its measurement when one of them moved by more than this share
#: (a measurement refined by every fold would otherwise change them a little, often).
RESPEED_TOLERANCE = 0.05


@dataclass(slots=True)
class _Pair:
    """Two jobs sharing GPUs of one type: the one that joined (guest) and the one it joined."""

    guest: Job
    host: Job
    gpu_type: str
    #: (guest's, host's) speed relative to alone that they run at now.
    speeds: tuple[float, float]


class Packing(Stage):
    name = "packing"
    summary = "Gandiva's packing: two jobs share GPUs when their pair throughput gains"
    Options = PackingOptions
    point = "share"
    shares_gpus = True

    @classmethod
    def from_options(cls, options: Any, services: Services) -> Packing:
        if services.pair_table is None:
            raise PluginError(
                "stage packing: needs co-location throughputs (a gavel trace's table)"
            )
        return cls(
            services.pair_table,
            options.threshold,
            options.max_tries_per_round,
            unmeasured=options.unmeasured,
        )

    def __init__(
        self,
        pair_speeds: PairSpeeds,
        threshold: float = DEFAULT_THRESHOLD,
        max_tries_per_round: int = MAX_TRIES_PER_ROUND,
        *,
        unmeasured: float = 0.0,
    ) -> None:
        """`unmeasured`: the prior relative speed of each job of a pair `pair_speeds` does not
        know (0, the default here: such a pair is never packed; the plugin's option defaults to
        DEFAULT_UNMEASURED)."""
        if not threshold > 0:
            raise ValueError(f"the packing threshold must be positive, got {threshold}")
        if not 0 <= unmeasured <= 1:
            raise ValueError(f"the unmeasured pair speed must be in [0, 1], got {unmeasured}")
        self.pair_speeds = pair_speeds
        self.threshold = threshold
        self.max_tries_per_round = max_tries_per_round
        self.unmeasured = unmeasured
        self.partner: dict[str, Job] = {}
        self._pairs: dict[str, _Pair] = {}  # by the guest's id
        #: Pairs of models (per GPU type and count) packed once on the prior, never again on it.
        self._tried: set[PairKey] = set()
        self.pairs_unpacked = 0
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

    def begin_round(self, host: RoundHost, now: float, actions: list[Action]) -> None:
        """Re-judge the running pairs by their measurement, if any: split a pair that does not
        gain (its guest waits again), else run both at the measured speeds (when they moved by
        more than RESPEED_TOLERANCE from those they run at)."""
        for pair in list(self._pairs.values()):
            if pair.guest.run_started_at == now:
                continue  # never undo a start of this same instant
            measured = self.pair_speeds(pair.guest, pair.host, pair.gpu_type)
            if measured is None:
                continue  # tried on the prior, not measured yet: it runs on
            if measured[0] + measured[1] <= self.threshold:
                self.pairs_unpacked += 1
                host.requeue(pair.guest, pair.host.id, now, actions, kind="unpacked")
                pair.guest.last_event = (
                    f"unpacked from job {pair.host.id}: sharing, they ran at {measured[0]:.2f} "
                    f"and {measured[1]:.2f} of their speeds alone, not above the packing "
                    f"threshold {self.threshold:g}"
                )
                continue
            if all(
                abs(new - old) <= RESPEED_TOLERANCE * old
                for new, old in zip(measured, pair.speeds, strict=True)
            ):
                continue
            pair.speeds = measured
            for member, relative in ((pair.guest, measured[0]), (pair.host, measured[1])):
                host.change_speed(member, self._alone_speed[member.id] * relative, now)

    def try_start(self, host: RoundHost, job: Job, now: float, actions: list[Action]) -> bool:
        """Start the job on the GPUs of a running job it runs well beside."""
        choice = self.choose_host(job, host.running_jobs(), host.cluster)
        if choice is None:
            return False
        partner, guest_speed, host_speed = choice
        gpu_type = host.cluster.gpus[partner.placement[0]].gpu_type
        if self.pair_speeds(job, partner, gpu_type) is None:
            self._tried.add(self.pair_key(job, partner, gpu_type))  # on the prior: once
        host.cluster.release(partner.placement)  # start_on takes them again: once, for two
        host.start_on(job, Placed(partner.placement), now, actions)
        for member, speed in self.pair(job, partner, guest_speed, host_speed, now, gpu_type):
            host.change_speed(member, speed, now)
        job.last_event = f"started sharing the GPUs of job {partner.id}"
        return True

    def restore_shared(self, host: RoundHost, job: Job, holder: Job, now: float) -> None:
        """A pair found running after a restart: the one that started later is the guest; it
        runs at its measured speeds, else at the prior (half each if the prior is 0)."""
        first, second = holder, job
        if (job.run_started_at or 0.0) < (holder.run_started_at or 0.0):
            first, second = job, holder
        gpu_type = host.cluster.gpus[holder.placement[0]].gpu_type
        speeds = self.pair_speeds(second, first, gpu_type)
        if speeds is None:
            self._tried.add(self.pair_key(second, first, gpu_type))
            prior = self.unmeasured or 0.5
            speeds = (prior, prior)
        for member, speed in self.pair(second, first, *speeds, now, gpu_type):
            host.change_speed(member, speed, now)

    def shares(self, job: Job) -> bool:
        return job.id in self.partner

    def partner_release(self, job: Job, now: float) -> tuple[Job, float] | None:
        return self.unpair(job, now)

    def counters(self) -> dict[str, int]:
        return {"packed_pairs": self.pairs_formed, "unpacked_pairs": self.pairs_unpacked}

    @staticmethod
    def pair_key(guest: Job, host: Job, gpu_type: str) -> PairKey:
        """The pair's models, in either order, on their GPU type and count."""
        first, second = sorted((guest.spec.model, host.spec.model))
        return (gpu_type, guest.spec.gpus, first, second)

    def speeds(self, guest: Job, host: Job, gpu_type: str) -> tuple[float, float] | None:
        """The pair's (guest's, host's) speeds relative to alone: measured, else the prior for
        a pair of named models not tried yet, else None."""
        measured = self.pair_speeds(guest, host, gpu_type)
        if measured is not None:
            return measured
        if (
            self.unmeasured > 0
            and guest.spec.model
            and host.spec.model
            and self.pair_key(guest, host, gpu_type) not in self._tried
        ):
            return (self.unmeasured, self.unmeasured)
        return None

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
                speeds = self.speeds(guest, host, gpu_type)
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
        self,
        guest: Job,
        host: Job,
        guest_speed: float,
        host_speed: float,
        now: float,
        gpu_type: str = "",
    ) -> list[tuple[Job, float]]:
        """Record the pair; returns each job with its new (packed) speed."""
        changes = []
        for job, other, relative in ((guest, host, guest_speed), (host, guest, host_speed)):
            self.partner[job.id] = other
            self._alone_speed[job.id] = job.speed
            self._since[job.id] = now
            changes.append((job, job.speed * relative))
        self._pairs[guest.id] = _Pair(guest, host, gpu_type, (guest_speed, host_speed))
        self.pairs_formed += 1
        return changes

    def unpair(self, job: Job, now: float) -> tuple[Job, float] | None:
        """The job stops sharing (it stops): its partner, and the partner's speed alone."""
        partner = self.partner.pop(job.id, None)
        if partner is None:
            return None
        del self.partner[partner.id]
        if self._pairs.pop(job.id, None) is None:
            del self._pairs[partner.id]
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
