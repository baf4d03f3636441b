"""Jobs: what a user asked for (JobSpec) and what happened to it so far (Job)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TypeVar

from corral.core.compiled import init_fields, rebuilt
from corral.core.retry import Failure, Verdict

R = TypeVar("R")

_set = object.__setattr__
#: This module is the compiled build's (setup.py): `JobSpec.__init__` stores fields natively.
_NATIVE = not __file__.endswith(".py")

#: Why a job waits, formatted only when something reads it: the text, or a template and the
#: values it is filled with (`str.format`), which a failed placement makes at every attempt but
#: only a listing, an explanation or a shell's record reads (`reason_text`).
Reason = str | tuple[object, ...]


def reason_text(reason: Reason) -> str:
    """The words of a reason: the text, or its template filled with its values."""
    if isinstance(reason, str):
        return reason
    template = reason[0]
    assert isinstance(template, str)
    return template.format(*reason[1:])


class JobStatus(enum.Enum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    #: Turned away at submission by an admission control (ElasticFlow: its deadline cannot be
    #: met without breaking those of jobs already admitted); never ran.
    REFUSED = "REFUSED"

    @property
    def finished(self) -> bool:
        return self in _FINISHED


#: Read as module globals: a member looked up on its enum class costs several times as much, and
#: the engine asks whether a job finished at every arrival and end.
_FINISHED = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.REFUSED)
_RUNNING = JobStatus.RUNNING


class Priority(enum.Enum):
    """HiveD's two classes: guaranteed jobs use their VC's cells, opportunistic ones harvest idle GPUs."""

    GUARANTEED = "guaranteed"
    OPPORTUNISTIC = "opportunistic"


@dataclass(slots=True, frozen=True)
class Elastic:
    """An elastic job (ElasticFlow) runs on any GPU count its scheduler allows between `min_gpus`
    and `max_gpus`, resized between attempts; `base_gpus` is the count its `duration_s` refers to."""

    min_gpus: int
    max_gpus: int
    base_gpus: int

    def __reduce__(self) -> tuple[object, ...]:
        return rebuilt, (Elastic, {name: getattr(self, name) for name in _ELASTIC_ARGS})


#: What `Elastic.__init__` takes (`__reduce__`).
_ELASTIC_ARGS = init_fields(Elastic)


@dataclass(slots=True, frozen=True, init=False)
class JobSpec:
    """A gang of `gpus` GPUs that must all run at once.

    `duration_s` is the run time on a consolidated placement of the job's best GPU type, when it is
    known (simulation, or an oracle policy); the live manager leaves it None. `spread_slowdown` is how
    much slower the job runs when its GPUs span several nodes (1.0 = insensitive); the `profile`
    placement uses it to decide which jobs must be consolidated. `gpus_per_worker` is the
    placement's unit: each node a job spans must receive a multiple of it (one worker process
    cannot span machines).
    """

    id: str
    submit_time: float
    gpus: int
    user: str = "user"
    vc: str = "default"
    model: str = ""
    gpu_types: frozenset[str] | None = None
    duration_s: float | None = None
    total_steps: float | None = None
    spread_slowdown: float = 1.0
    priority: Priority = Priority.GUARANTEED
    max_retries: int = 0
    #: The instant (seconds, the trace's clock) by which the job should have finished, if any.
    deadline: float | None = None
    elastic: Elastic | None = None
    #: GPUs of one worker process, which cannot span machines: each node a job spans must
    #: receive a multiple of it (`gpus` is one too). 1: any split of the gang is fine.
    gpus_per_worker: int = 1
    #: The job saves a checkpoint every this many seconds of work, so a failed attempt keeps
    #: the work up to its last one; None: it saves only when signalled (a preemption), and a
    #: failure loses the attempt's work.
    checkpoint_every_s: float | None = None
    #: Milli-GPU on each of its GPUs: below 1000 (with `gpus` 1) a share of one GPU that other
    #: jobs' shares may use too (corral.core.cluster); 1000: whole GPUs.
    gpu_milli: int = 1000
    #: CPU (milli-cores) and memory (MiB) the job takes on its node, where the cluster's nodes
    #: declare them (0: none, as before). A job with `gpus` 0 uses CPU only.
    cpu_milli: int = 0
    memory_mib: int = 0
    #: Run a pre-run first (Philly's lesson: many user errors show in a job's first minutes): the
    #: job starts as one worker (`gpus_per_worker` GPUs), and only once that attempt reports
    #: progress, runs this many seconds, or exits successfully is it queued for its whole gang
    #: (corral.core.precheck). None: the scheduler's default (`CoreOptions.precheck_s`); 0: no
    #: pre-run. Ignored for a job of one worker (`gpus <= gpus_per_worker`).
    precheck_s: float | None = None
    #: An integer priority (Slurm's priority, Kueue's WorkloadPriorityClass value): the first
    #: part of the job's key in the scheduler's queues, before the policy's own order (which
    #: breaks ties). Higher runs first; 0 for every job that names none.
    level: int = 0
    #: Seconds the job may run in all (Slurm's time limit, what the live manager's `time_limit`
    #: enforces: its attempts' run times add up against it); None: unbounded. EASY backfill
    #: (corral.core.backfill) reads it: a job ends by then at the latest.
    time_limit_s: float | None = None
    #: Whole GPUs and nothing else (no share, CPU or memory): what every placement gives. Set
    #: from the fields above (read on every round's hot paths, so kept, not computed).
    plain: bool = field(init=False, repr=False, compare=False)

    def __init__(
        self,
        id: str,
        submit_time: float,
        gpus: int,
        user: str = "user",
        vc: str = "default",
        model: str = "",
        gpu_types: frozenset[str] | None = None,
        duration_s: float | None = None,
        total_steps: float | None = None,
        spread_slowdown: float = 1.0,
        priority: Priority = Priority.GUARANTEED,
        max_retries: int = 0,
        deadline: float | None = None,
        elastic: Elastic | None = None,
        gpus_per_worker: int = 1,
        checkpoint_every_s: float | None = None,
        gpu_milli: int = 1000,
        cpu_milli: int = 0,
        memory_mib: int = 0,
        precheck_s: float | None = None,
        level: int = 0,
        time_limit_s: float | None = None,
    ) -> None:
        # Written out (`init=False`) rather than generated: in the compiled build the generated
        # `__init__` stays interpreted, and a trace makes a spec per job (and moves it). Compiled,
        # the fields are stored directly (mypyc's own attribute stores, which the frozen class's
        # `__setattr__` does not see); in Python as the generated `__init__` stores them.
        if _NATIVE:
            self.id = id  # type: ignore[misc]
            self.submit_time = submit_time  # type: ignore[misc]
            self.gpus = gpus  # type: ignore[misc]
            self.user = user  # type: ignore[misc]
            self.vc = vc  # type: ignore[misc]
            self.model = model  # type: ignore[misc]
            self.gpu_types = gpu_types  # type: ignore[misc]
            self.duration_s = duration_s  # type: ignore[misc]
            self.total_steps = total_steps  # type: ignore[misc]
            self.spread_slowdown = spread_slowdown  # type: ignore[misc]
            self.priority = priority  # type: ignore[misc]
            self.max_retries = max_retries  # type: ignore[misc]
            self.deadline = deadline  # type: ignore[misc]
            self.elastic = elastic  # type: ignore[misc]
            self.gpus_per_worker = gpus_per_worker  # type: ignore[misc]
            self.checkpoint_every_s = checkpoint_every_s  # type: ignore[misc]
            self.gpu_milli = gpu_milli  # type: ignore[misc]
            self.cpu_milli = cpu_milli  # type: ignore[misc]
            self.memory_mib = memory_mib  # type: ignore[misc]
            self.precheck_s = precheck_s  # type: ignore[misc]
            self.level = level  # type: ignore[misc]
            self.time_limit_s = time_limit_s  # type: ignore[misc]
            self.plain = gpu_milli == 1000 and not cpu_milli and not memory_mib  # type: ignore[misc]
            return
        _set(self, "id", id)
        _set(self, "submit_time", submit_time)
        _set(self, "gpus", gpus)
        _set(self, "user", user)
        _set(self, "vc", vc)
        _set(self, "model", model)
        _set(self, "gpu_types", gpu_types)
        _set(self, "duration_s", duration_s)
        _set(self, "total_steps", total_steps)
        _set(self, "spread_slowdown", spread_slowdown)
        _set(self, "priority", priority)
        _set(self, "max_retries", max_retries)
        _set(self, "deadline", deadline)
        _set(self, "elastic", elastic)
        _set(self, "gpus_per_worker", gpus_per_worker)
        _set(self, "checkpoint_every_s", checkpoint_every_s)
        _set(self, "gpu_milli", gpu_milli)
        _set(self, "cpu_milli", cpu_milli)
        _set(self, "memory_mib", memory_mib)
        _set(self, "precheck_s", precheck_s)
        _set(self, "level", level)
        _set(self, "time_limit_s", time_limit_s)
        _set(self, "plain", gpu_milli == 1000 and not cpu_milli and not memory_mib)

    def moved(self, submit_time: float, deadline: float | None) -> JobSpec:
        """This spec submitted at `submit_time` with `deadline`, every other field as it is
        (what `dataclasses.replace` gives, without its look at each field)."""
        return JobSpec(
            self.id,
            submit_time,
            self.gpus,
            self.user,
            self.vc,
            self.model,
            self.gpu_types,
            self.duration_s,
            self.total_steps,
            self.spread_slowdown,
            self.priority,
            self.max_retries,
            deadline,
            self.elastic,
            self.gpus_per_worker,
            self.checkpoint_every_s,
            self.gpu_milli,
            self.cpu_milli,
            self.memory_mib,
            self.precheck_s,
            self.level,
            self.time_limit_s,
        )

    def accepts(self, gpu_type: str) -> bool:
        return self.gpu_types is None or gpu_type in self.gpu_types

    @property
    def shares_gpu(self) -> bool:
        """A share of one GPU (gpu_milli below 1000)."""
        return self.gpus == 1 and self.gpu_milli < 1000

    @property
    def total_gpu_milli(self) -> int:
        """The milli-GPU the job asks for in all (1000 per whole GPU)."""
        return self.gpus * self.gpu_milli

    def request_problem(self) -> str | None:
        """Why the request (GPUs, share, CPU, memory) is malformed, or None."""
        for name in ("gpus", "gpu_milli", "cpu_milli", "memory_mib"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                return f"{name} must be a non-negative integer, got {value!r}"
        if not 1 <= self.gpu_milli <= 1000:
            return f"gpu_milli must be 1..1000, got {self.gpu_milli}"
        if self.gpu_milli < 1000 and self.gpus != 1:
            return f"a share of a GPU (gpu_milli {self.gpu_milli}) needs gpus 1, got {self.gpus}"
        if self.gpus == 0 and not (self.cpu_milli or self.memory_mib):
            return "gpus must be a positive integer, got 0 (or ask for CPU or memory)"
        return None

    def describe_request(self) -> str:
        gpu = (
            "no GPU"
            if self.gpus == 0
            else f"{self.gpu_milli} milli-GPU"
            if self.shares_gpu
            else f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}"
        )
        return f"{gpu}, {self.cpu_milli} milli-CPU, {self.memory_mib} MiB"

    def __reduce__(self) -> tuple[object, ...]:
        return rebuilt, (JobSpec, {name: getattr(self, name) for name in _SPEC_ARGS})


#: What `JobSpec.__init__` takes (`__reduce__`).
_SPEC_ARGS = init_fields(JobSpec)


@dataclass(slots=True, eq=False, init=False)
class Job:
    """Runtime state of one job as the scheduling core sees it.

    Work is counted in ideal seconds: one second of running on a consolidated placement of the
    job's best GPU type does one second of work. `speed` (ideal seconds per wall second) is set by
    the shell when the job starts, from its performance model; `stall_until` covers the time a
    resumed job spends restoring its checkpoint, during which it does no work.
    """

    spec: JobSpec
    seq: int = 0  # the order in which the scheduler received the job; breaks every tie
    status: JobStatus = JobStatus.PENDING
    placement: tuple[int, ...] = ()
    run_started_at: float | None = None
    first_started_at: float | None = None
    finished_at: float | None = None
    queued_since: float = 0.0
    pending_s: float = 0.0
    executed_s: float = 0.0
    attained_gpu_s: float = 0.0
    work_done_s: float = 0.0
    speed: float = 1.0
    stall_until: float = 0.0
    # A speed change mid-attempt (change_speed): work of this attempt done before `speed_since`.
    attempt_work_s: float = 0.0
    speed_since: float = 0.0
    attempts: int = 0
    failures: int = 0
    #: Attempts lost to the infrastructure (a node died): they do not use up `max_retries`.
    infra_failures: int = 0
    #: GPU-seconds of failed attempts not saved by a checkpoint (the GPU time failures wasted).
    lost_gpu_s: float = 0.0
    #: Every failed attempt, infrastructure ones too, oldest first: what the RetryRule judges.
    failure_history: tuple[Failure, ...] = ()
    #: The RetryRule's verdict on the latest failure (its backoff and reason), if any.
    verdict: Verdict | None = None
    preemptions: int = 0
    relaxed: bool = False
    #: Why the waiting job waits (`pending_reason` in words), formatted when read.
    pending_why: Reason = "not yet considered"
    #: A failed job waits at least until then before its retry (the shell's backoff).
    hold_until: float = 0.0
    last_event: str = ""
    # Policy bookkeeping: LAS starvation promotion discounts service attained before it.
    service_offset_gpu_s: float = 0.0
    #: Running on GPUs lent by another VC (a quota's oversubscription): reclaimable.
    borrowed: bool = False
    #: Times the job was moved to make room for another (Gandiva's migration).
    migrations: int = 0
    #: The node whose CPU and memory the running job holds (-1: none; see JobSpec.plain).
    node: int = -1
    #: Each plugin's own state for this job, one typed record per plugin (see `record`); None
    #: until a plugin keeps one (most jobs of a long trace never need any).
    records: dict[type, object] | None = None
    #: The spec's id, kept at hand: read at every event (a job's spec may be replaced, as its
    #: pre-run's or an elastic size's, its id never).
    id: str = field(init=False, repr=False)

    def __init__(
        self,
        spec: JobSpec,
        seq: int = 0,
        status: JobStatus = JobStatus.PENDING,
        placement: tuple[int, ...] = (),
        run_started_at: float | None = None,
        first_started_at: float | None = None,
        finished_at: float | None = None,
        queued_since: float = 0.0,
        pending_s: float = 0.0,
        executed_s: float = 0.0,
        attained_gpu_s: float = 0.0,
        work_done_s: float = 0.0,
        speed: float = 1.0,
        stall_until: float = 0.0,
        attempt_work_s: float = 0.0,
        speed_since: float = 0.0,
        attempts: int = 0,
        failures: int = 0,
        infra_failures: int = 0,
        lost_gpu_s: float = 0.0,
        failure_history: tuple[Failure, ...] = (),
        verdict: Verdict | None = None,
        preemptions: int = 0,
        relaxed: bool = False,
        pending_why: Reason = "not yet considered",
        hold_until: float = 0.0,
        last_event: str = "",
        service_offset_gpu_s: float = 0.0,
        borrowed: bool = False,
        migrations: int = 0,
        node: int = -1,
        records: dict[type, object] | None = None,
    ) -> None:
        # Written out (`init=False`) rather than generated: in the compiled build the generated
        # `__init__` stays interpreted (a job is made at each submission).
        self.spec = spec
        self.seq = seq
        self.status = status
        self.placement = placement
        self.run_started_at = run_started_at
        self.first_started_at = first_started_at
        self.finished_at = finished_at
        self.queued_since = queued_since
        self.pending_s = pending_s
        self.executed_s = executed_s
        self.attained_gpu_s = attained_gpu_s
        self.work_done_s = work_done_s
        self.speed = speed
        self.stall_until = stall_until
        self.attempt_work_s = attempt_work_s
        self.speed_since = speed_since
        self.attempts = attempts
        self.failures = failures
        self.infra_failures = infra_failures
        self.lost_gpu_s = lost_gpu_s
        self.failure_history = failure_history
        self.verdict = verdict
        self.preemptions = preemptions
        self.relaxed = relaxed
        self.pending_why = pending_why
        self.hold_until = hold_until
        self.last_event = last_event
        self.service_offset_gpu_s = service_offset_gpu_s
        self.borrowed = borrowed
        self.migrations = migrations
        self.node = node
        self.records = records
        self.id = spec.id

    def record(self, kind: type[R]) -> R:
        """The job's record of a plugin's state type (created empty on first use): a policy keeps
        what it tracks per job in a dataclass of its own, typed, not under string keys."""
        records = self.records
        if records is None:
            records = self.records = {}
        found = records.get(kind)
        if found is None:
            found = records[kind] = kind()
        # (kept under its type: an R; no `cast`, a call at each read in pure Python)
        return found  # type: ignore[return-value]

    def peek(self, kind: type[R]) -> R | None:
        """The job's record of a plugin's state type, or None: for reading without creating."""
        records = self.records
        if records is None:
            return None
        return records.get(kind)  # type: ignore[return-value]

    @property
    def pending_reason(self) -> str:
        """Why the waiting job waits, in words."""
        why = self.pending_why
        if isinstance(why, str):
            return why
        text = self.pending_why = reason_text(why)
        return text

    @pending_reason.setter
    def pending_reason(self, reason: str) -> None:
        self.pending_why = reason

    @property
    def gpus(self) -> int:
        return self.spec.gpus

    def running_s(self, now: float) -> float:
        """Seconds the current attempt has been running (0 when not running)."""
        started = self.run_started_at
        if self.status is not _RUNNING or started is None:
            return 0.0
        ran = now - started
        return ran if ran > 0.0 else 0.0  # (max(0.0, ran), without its call)

    def attained_at(self, now: float) -> float:
        """Attained service in GPU-seconds (Tiresias's 2D measure: GPUs x time run)."""
        return self.attained_gpu_s + self.spec.gpus * self.running_s(now)

    def executed_at(self, now: float) -> float:
        return self.executed_s + self.running_s(now)

    def work_done_at(self, now: float) -> float:
        started = self.run_started_at
        if self.status is not _RUNNING or started is None:
            return self.work_done_s
        # max(started, stall_until, speed_since) and max(0.0, worked), without their calls
        working_from = started
        if self.stall_until > working_from:
            working_from = self.stall_until
        if self.speed_since > working_from:
            working_from = self.speed_since
        worked = now - working_from
        if worked < 0.0:
            worked = 0.0
        return self.work_done_s + self.attempt_work_s + self.speed * worked

    def change_speed(self, speed: float, now: float) -> None:
        """From `now` on the running job works at `speed`; the work done so far is kept, and
        `work_done_s` still holds the work at the start of the attempt (a failure loses the rest)."""
        self.attempt_work_s = self.work_done_at(now) - self.work_done_s
        self.speed_since = now
        self.speed = speed

    def remaining_work_s(self, now: float) -> float:
        """Ideal seconds of work left; infinite when the job's length is unknown."""
        if self.spec.duration_s is None:
            return float("inf")
        left = self.spec.duration_s - self.work_done_at(now)
        return left if left > 0.0 else 0.0  # (max(0.0, left), without its call)

    def remaining_wall_s(self, now: float) -> float:
        """Wall seconds until the job ends at its current speed (pending jobs: at full speed)."""
        remaining = self.remaining_work_s(now)
        if self.status is not _RUNNING:
            return remaining
        # max(0.0, stall) + remaining / max(speed, 1e-12), without the calls
        stall = self.stall_until - now
        speed = self.speed
        return (stall if stall > 0.0 else 0.0) + remaining / (1e-12 if 1e-12 > speed else speed)

    def limit_left_s(self, now: float) -> float:
        """Seconds the job may still run by its time limit (its attempts' run times add up
        against it, as live); infinite without a limit."""
        limit = self.spec.time_limit_s
        if limit is None:
            return float("inf")
        return max(0.0, limit - self.executed_at(now))

    def __reduce__(self) -> tuple[object, ...]:
        return rebuilt, (Job, {name: getattr(self, name) for name in _JOB_ARGS})


#: What `Job.__init__` takes (`__reduce__`).
_JOB_ARGS = init_fields(Job)
