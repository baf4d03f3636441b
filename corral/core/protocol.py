"""The declared interfaces between the core and its shells, and between the scheduler and admission.

`SchedulerCore` is what a shell drives: the simulator's event loop (`corral.sim.engine`) and the
live manager (`corral.server.manager`) depend on it alone, never on a concrete scheduler class, so
every scheduler an admission scheme builds (the plain `Scheduler`, HiveD's `HivedScheduler`,
ElasticFlow's `ElasticScheduler`) is interchangeable under both. mypy checks each of them against
it (`corral.core.admission` assigns each to a `SchedulerCore` variable), so they cannot drift.

`Admission` is what the plain `Scheduler` consults in front of its queue (VCs sharing the
cluster by GPU counts, quota and fairshare; a limit per user): the scheduler imports this protocol,
never a concrete admission.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from corral.core.actions import Decision, Preempt
    from corral.core.cluster import Cluster
    from corral.core.job import Job, JobSpec
    from corral.core.placement.base import Placement
    from corral.core.policy.base import Policy
    from corral.core.reservations import Reservation
    from corral.core.retry import FailureReport


class SchedulerCore(Protocol):
    """What the shells call. Time is an argument; nothing here reads a clock or does I/O."""

    @property
    def jobs(self) -> Mapping[str, Job]:
        """Every job the scheduler knows, by id."""
        ...

    @property
    def cluster(self) -> Cluster:
        """The physical cluster the scheduler allocates."""
        ...

    @property
    def policy(self) -> Policy: ...

    @property
    def placement(self) -> Placement: ...

    @property
    def rounds(self) -> int: ...

    @property
    def preemptions(self) -> int: ...

    @property
    def pending_count(self) -> int: ...

    @property
    def running_count(self) -> int: ...

    def refusal(self, spec: JobSpec) -> str | None:
        """Why `submit` would refuse the job (it could never run here), or None."""
        ...

    def submit(self, spec: JobSpec, now: float) -> Job: ...

    def decide(self, now: float) -> Decision:
        """One round: the actions to carry out (already committed to this state) and when to
        call again at the latest."""
        ...

    def finished(self, job_id: str, now: float) -> Job: ...

    def failed(self, job_id: str, now: float, report: FailureReport | str) -> Job:
        """An attempt failed; the core's retry rule decides whether and when it runs again."""
        ...

    def cancel(self, job_id: str, now: float) -> Job: ...

    def progressed(self, job_id: str, now: float) -> Preempt | None:
        """The running job reported progress for the first time in its attempt (the live
        manager: its first progress report; the simulator: `--precheck-report-s` after the start
        and restore). If the attempt is the job's pre-run (corral.core.precheck), it has passed:
        the returned `Preempt` (`precheck=True`, already committed) stops it and the job waits
        for its whole gang. Else None, and nothing changes."""
        ...

    def explain(self, job_id: str, now: float) -> str: ...

    def adopt(self, job: Job, now: float) -> None:
        """Queue a job with its history (a shell rebuilding the core after a restart)."""
        ...

    def withdraw(self, job_id: str, now: float) -> Job:
        """Take a waiting or running job out of the core (a running one's GPUs freed, its run
        accounted, no preemption counted), to be adopted again later with its history: what a
        shell's gate uses (a job held, or requeued by its owner)."""
        ...

    def restore_running(
        self, job_id: str, gpus: tuple[int, ...], started_at: float, now: float
    ) -> Job:
        """An adopted job is in fact running on these GPUs since `started_at`."""
        ...

    def node_failed(self, node: int, now: float) -> list[Job]:
        """A node died: its attempts end as infrastructure failures, its GPUs go offline."""
        ...

    def node_recovered(self, node: int) -> None: ...

    def evict_node(self, node: int, now: float, by: str) -> list[Preempt]:
        """Preempt every attempt on the node (checkpoint, requeued, `by` their cause): an
        operator's drain with preemption (corral.core.nodes)."""
        ...

    def take_offline(self, gpus: Iterable[int]) -> None:
        """Hold free GPUs out of allocation (a node leaving, processes that would not end)."""
        ...

    def bring_online(self, gpus: Iterable[int]) -> None: ...

    def reserve(self, reservation: Reservation) -> None:
        """Claim GPUs over a time window for some users or VCs (corral.core.reservations);
        ReservationError where it cannot be made (or this scheduler makes none)."""
        ...

    def unreserve(self, name: str) -> Reservation: ...

    def pending_jobs(self) -> Iterable[Job]:
        """Waiting jobs, in the order the scheduler would serve them."""
        ...

    def running_jobs(self) -> Iterable[Job]: ...

    def counters(self) -> dict[str, int]:
        """What the scheduler's mechanisms did (preemptions, migrations, reclaims, grows ...),
        for summaries and metrics."""
        ...


#: The hooks of an `Admission`, in the order the scheduler consults them: an admission built on
#: `corral.core.admission.base.Admission` lists those it has an opinion on (`opinions`), and
#: the scheduler consults only those (corral.core.chain).
ADMISSION_HOOKS = (
    "refusal",
    "capacity",
    "begin_round",
    "walks",
    "check",
    "queue",
    "may_preempt",
    "reclaim",
    "can_reclaim",
    "someone_over_share",
    "describe",
    "on_start",
    "on_stop",
    "on_queue",
    "counters",
)


class Admission(Protocol):
    """Who may start, who may be preempted and for whom, in front of the scheduler (VCs sharing
    the cluster by GPU counts, a limit per user). `corral.core.admission.base.Admission`
    implements every hook with no opinion; several admissions are consulted as one
    (`corral.core.chain.AdmissionChain`)."""

    @property
    def name(self) -> str: ...

    @property
    def volatile(self) -> bool:
        """Its verdicts may change while the jobs running and waiting do not (shares that follow
        time, reclaims that follow who runs where): the scheduler then never skips a round as a
        repeat of the last one and never remembers a failed search for victims."""
        ...

    @property
    def picks_victims(self) -> bool:
        """It restricts or adds preemption victims (`may_preempt`, `reclaim`, `can_reclaim`,
        `someone_over_share`): the victims are then not a slice of the running jobs."""
        ...

    @property
    def counts_gpus(self) -> bool:
        """It counts GPUs per job: jobs that share GPUs (a stage's pairs, shares of one GPU,
        CPU or memory) cannot run with it."""
        ...

    def refusal(self, spec: JobSpec) -> str | None:
        """Why the job could never be admitted (`unknown VC 'x'`), or None."""
        ...

    def capacity(self, spec: JobSpec) -> int | None:
        """The most GPUs the job may ever ask for (None: no bound beyond the cluster's)."""
        ...

    def begin_round(self, now: float) -> None:
        """Called at the start of each round (shares that change with time are settled here)."""
        ...

    def walks(self) -> Iterator[None]:
        """The round's queue walks before its last one: before each, the admission narrows what
        `check` admits (quota: jobs within quotas first, then borrowers, opportunistic jobs
        last); once exhausted it admits everything again for the last walk."""
        ...

    def check(self, job: Job) -> str | None:
        """Why the job may not start now, or None."""
        ...

    def queue(self, job: Job) -> str | None:
        """The queue the job waits in (`VC a`): a blocking policy's head blocks only its queue
        (None: the scheduler's one queue)."""
        ...

    def may_preempt(self, victim: Job, job: Job) -> bool: ...

    def reclaim(self, job: Job, running: Iterable[Job]) -> Iterator[Job]:
        """Of the running jobs (given lowest priority first), those the job may take GPUs back
        from whatever their priority, in the order to take them."""
        ...

    def can_reclaim(self, job: Job) -> bool: ...

    def someone_over_share(self) -> bool:
        """Some running job's GPUs may be reclaimed (a job further back may preempt)."""
        ...

    def describe(self, job: Job) -> str | None:
        """What the job's class means under this admission, for `explain` (None: nothing)."""
        ...

    def on_start(self, job: Job, now: float) -> None: ...

    def on_stop(self, job: Job, now: float) -> None: ...

    def on_queue(self, job: Job, delta: int) -> None: ...

    def counters(self) -> dict[str, int]: ...
