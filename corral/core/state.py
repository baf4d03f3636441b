"""What the scheduler knows, and every change to it: the jobs, their queues, their transitions.

`SchedulerState` holds the jobs (waiting ones in the policy's order, running ones by key) and
applies the transitions: those the shell reports (`submit`, `finished`, `failed`, `cancel`, a
node's failure, `withdraw`, `adopt`, `restore_running`), and those the round's plugins make through
their hosts (a stage's start, move, requeue or speed change; preemption's stops; a lifecycle
plugin's stop and queue). Each transition tells the plugins that follow it (the admissions'
`on_queue`, `on_start`, `on_stop`; the lifecycle plugin's hooks, for the jobs it follows; the
stages that let jobs share GPUs, at a release) and keeps the indexes, the timers and the round's
memory of what changed (`_quiet`) up to date.

The round that decides (corral.core.scheduler.Scheduler, a subclass) builds the plugins and walks
the queue; nothing here decides who runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from sortedcontainers import SortedList

from corral.core.actions import Action, Preempt, Respeed, Start
from corral.core.chain import AdmissionChain
from corral.core.cluster import Cluster
from corral.core.index import LONG_QUEUE, SHORT_QUEUE, FlatIndex, Index
from corral.core.job import Job, JobSpec, JobStatus
from corral.core.lifecycle import Lifecycle
from corral.core.placement.base import Kind, Placed, Placement, placement_kind
from corral.core.plugin import SpeedModel
from corral.core.policy.base import Key, Policy
from corral.core.preempt import TOP, Preemption
from corral.core.refusal import Refusals, refuse_new
from corral.core.retry import Failure, FailureReport, RetryRule, Verdict
from corral.core.stages import Stage
from corral.core.statement import claim, unclaim
from corral.core.text import count_noun
from corral.core.timers import Timers

#: Job states read as module globals: a member looked up on its enum class costs several times as
#: much (as in corral.core.job), and these are asked at every start, stop, timer and key.
_RUNNING = JobStatus.RUNNING
_PENDING = JobStatus.PENDING
_SUCCEEDED = JobStatus.SUCCEEDED

#: Called once per attempt as a job starts (placement, speed and restore stall already set); it
#: may lower `job.speed` and move `job.stall_until` later: a node's data cache (core.cache) is
#: allocated here, not in the SpeedModel, which placements may also call to ask about speeds.
StartHook = Callable[[Job, float], None]

#: Up to this many running jobs moved at once (`rekey_each`) are moved one by one (a bisect each);
#: more, and the running index is sorted again at once.
_FEW_MOVES = 8

#: The `last_event` of a start on one node (most are), as `count_noun` words it.
_ON_ONE_NODE = f"started on {count_noun(1, 'node')}"


class SchedulerState:
    #: Built by the round's class once the state exists (they are given it as their host).
    lifecycle: Lifecycle
    _followed: dict[str, Any]
    timers: Timers
    preemption: Preemption
    #: What the indexes tell the preemption plugin (its failed-search memory, corral.core.preempt):
    #: a running job left, a waiting job left, a running job was re-keyed (old, new).
    _running_left: Callable[[Job, Key], None]
    _waiting_left: Callable[[Job, Key], None]
    _running_rekeyed: Callable[[Key, Key], None]

    def __init__(
        self,
        cluster: Cluster,
        policy: Policy,
        placement: Placement,
        admission: AdmissionChain,
        stages: Sequence[Stage],
        speed_model: SpeedModel | None,
        restore_s: float,
        on_start: StartHook | None,
        retry: RetryRule,
    ) -> None:
        self.cluster = cluster
        self.policy = policy
        self.placement = placement
        self.admission = admission
        #: What the admissions have opinions on, for the hot paths (nothing, without any).
        self._on_queue = admission.hooks("on_queue")
        self._on_start = admission.hooks("on_start")
        self._on_stop = admission.hooks("on_stop")
        self._refusals = Refusals(placement, admission)
        self.stages = list(stages)
        self._shared = [s for s in self.stages if s.shares_gpus]
        self.speed_model = speed_model
        self.restore_s = restore_s
        self.on_start = on_start
        self.retry = retry
        self._speed_changed: dict[str, None] = {}  # running jobs to report in Decision.respeeds
        self.jobs: dict[str, Job] = {}
        #: Every job the scheduler holds, by `seq`; a job withdrawn (or an ended one forgotten)
        #: leaves it, so that a long run holds only its live jobs.
        self._by_seq: dict[int, Job] = {}
        self._next_seq = 0
        #: Waiting jobs by key: a `FlatIndex`, or a `SortedList` while many wait.
        self.pending: Index = FlatIndex()
        self._running = FlatIndex()
        self._stored: dict[int, Key] = {}
        self.preemptions = 0
        self._offline: set[int] = set()  # GPUs of dead nodes, held allocated so no one gets them
        #: Waiting jobs that ask for a share of a GPU, CPU or memory: with none free whole GPUs
        #: may still run them, so the round does not stop when no whole GPU is free.
        self.waiting_shares = 0
        #: Waiting jobs of whole GPUs by GPU count (none of 0): with fewer GPUs free than the
        #: smallest of them asks, no waiting job can start on free GPUs.
        self.waiting_sizes: dict[int, int] = {}
        #: Each waiting job's `placement_kind`, by seq, where the placement is `pure` (its modes
        #: change only at the instants its timers index the job again); else None.
        self.waiting_kinds: dict[int, Kind] | None = {} if placement.pure else None
        #: After a round without actions: (the cluster's version, `preempt`, whether a placement
        #: was tried while preempting); None once anything the walk looks at changed.
        self._quiet: tuple[int, bool, bool] | None = None
        self._last_start_at = -math.inf
        self._held: set[int] = set()  # waiting jobs queued with a retry backoff

    # -- what the shell reports -------------------------------------------------------------

    def refusal(self, spec: JobSpec) -> str | None:
        """Why this job could never run here (so `submit` would refuse it), or None. Depends
        only on the cluster's shape and the VCs, so a shell may ask before it stores the job."""
        return self._refusals.refusal(self.cluster, spec)

    def submit(self, spec: JobSpec, now: float) -> Job:
        refuse_new(self.jobs, spec, self.refusal(spec))
        job = Job(spec=spec, seq=self._next_seq, queued_since=now)
        self._next_seq += 1
        self.jobs[spec.id] = job
        self._by_seq[job.seq] = job
        self.lifecycle.entered(job, adopted=False)
        self._enqueue(job, now)
        return job

    def finished(self, job_id: str, now: float) -> Job:
        """The attempt exited successfully: the job succeeded, unless the attempt was its
        pre-run, which has then passed (the job waits again for its whole gang)."""
        job = self._running_job(job_id)
        self._stop(job, now)
        if self._followed and job.id in self._followed and self.lifecycle.exited(job, now):
            return job
        job.work_done_s = job.spec.duration_s or job.work_done_s
        self._finish(job, _SUCCEEDED, now, "succeeded")
        return job

    def failed(self, job_id: str, now: float, report: FailureReport | str) -> Job:
        """An attempt failed: its work since its last checkpoint is lost. The failure (see
        `FailureReport`) joins the job's history and the `RetryRule` judges it: retry after its
        backoff, or end the job (the same fast failure repeated: a user error). A failure of the
        infrastructure (a node died) is counted apart and never uses up `max_retries`; other
        failures end the job once they exceed it. The verdict is left in `job.verdict`.

        During the job's pre-run, a failure that is not the infrastructure's ends the job at once
        (a user error, whatever `max_retries`); an infrastructure failure retries the pre-run."""
        job = self._running_job(job_id)
        trial = bool(self._followed) and job.id in self._followed  # its attempt is the plugin's
        report = FailureReport.of(report)
        reason, infrastructure = report.reason, report.infrastructure
        ran_s = report.ran_s
        if ran_s is None:  # the shell knows better when its processes really started
            started = job.run_started_at
            ran_s = max(0.0, now - started) if started is not None else 0.0
        kept_work = job.work_done_s
        saved = 0.0  # work of this attempt up to its last periodic checkpoint
        every = job.spec.checkpoint_every_s
        if every and not trial:  # a pre-run's work is never the job's
            saved = math.floor((job.work_done_at(now) - kept_work) / every) * every
        saved_wall = saved / job.speed if job.speed > 0 else 0.0
        self._stop(job, now)
        job.work_done_s = kept_work + saved
        job.lost_gpu_s += job.spec.gpus * max(0.0, ran_s - saved_wall)
        job.failure_history += (Failure(report.signature or reason, ran_s, infrastructure),)
        if infrastructure:
            job.infra_failures += 1
        else:
            job.failures += 1
        verdict = self.retry.judge(job.failure_history, reason)
        if report.retry_after_s is not None:
            verdict = Verdict(verdict.give_up, report.retry_after_s, verdict.reason)
        if report.give_up:  # the shell's own judgement, in its words
            verdict = Verdict(True, verdict.retry_after_s, reason)
        if not verdict.give_up and job.failures > job.spec.max_retries:
            verdict = Verdict(True, verdict.retry_after_s, reason)  # retries used up
        if trial:
            verdict = self.lifecycle.failing(job, report, verdict)
        job.verdict = verdict
        if verdict.give_up:
            self._finish(job, JobStatus.FAILED, now, f"failed: {verdict.reason}")
        else:
            job.last_event = f"attempt {job.attempts} failed ({reason}); retrying"
            job.hold_until = now + verdict.retry_after_s
            self._enqueue(job, now)
        return job

    def cancel(self, job_id: str, now: float) -> Job:
        job = self.jobs[job_id]
        if job.status is _RUNNING:
            self._stop(job, now)
        elif job.status is _PENDING:
            self._dequeue(job, now)
        else:
            return job
        self._finish(job, JobStatus.CANCELLED, now, "cancelled")
        return job

    def node_failed(self, node: int, now: float) -> list[Job]:
        """A node died: the attempts on it end as infrastructure failures and are requeued, and
        its GPUs leave allocation (held as offline) until `node_recovered`."""
        name = self.cluster.nodes[node].name
        hit = [
            job
            for job in self.running_jobs()
            if job.node == node or any(self.cluster.gpu_node[g] == node for g in job.placement)
        ]
        for job in hit:
            self.failed(job.id, now, FailureReport(f"node {name} failed", infrastructure=True))
        self.take_offline(self.cluster.node_gpus[node])
        return hit

    def node_recovered(self, node: int) -> None:
        self.bring_online(self.cluster.node_gpus[node])

    def evict_node(self, node: int, now: float, by: str) -> list[Preempt]:
        """Stop every attempt on the node through its checkpoint contract and queue its job
        again (an operator's drain with preemption, corral.core.nodes): preemptions by `by`, not
        failures, so no retry is used."""
        hit = [
            job
            for job in self.running_jobs()
            if job.node == node or any(self.cluster.gpu_node[g] == node for g in job.placement)
        ]
        return [self.evict(job.id, now, by) for job in hit if job.status is _RUNNING]

    def take_offline(self, gpus: Iterable[int]) -> None:
        """Hold free GPUs out of allocation (GPUs in use must be freed first)."""
        free = [g for g in gpus if self.cluster.gpu_free[g]]
        self.cluster.allocate(free)
        self._offline.update(free)

    def bring_online(self, gpus: Iterable[int]) -> None:
        back = [g for g in gpus if g in self._offline]
        self._offline.difference_update(back)
        self.cluster.release(back)

    def withdraw(self, job_id: str, now: float) -> Job:
        """Take a waiting or running job out of this scheduler, to be adopted again with its
        history (by another scheduler, or by this one once a shell's gate opens: a job held, or
        requeued by its owner). A running job's GPUs are freed and its run accounted, as at a
        preemption, but nothing counts it as one; the job is PENDING, in no queue. An ended job is
        only forgotten (its status kept), so that it may be adopted again under its id, or so
        that a long simulation that has written its result holds it no more."""
        job = self.jobs[job_id]
        if job.status is _RUNNING:
            self._stop(job, now)
            job.status = _PENDING
            job.queued_since = now
        elif job.status is _PENDING:
            self._dequeue(job, now)
        else:  # ended: forgotten (a shell queues it again under its id: a requeue)
            del self.jobs[job_id]
            self._by_seq.pop(job.seq, None)
            return job
        self.timers.forget(job)
        self.lifecycle.withdrawn(job)
        del self.jobs[job_id]
        self._by_seq.pop(job.seq, None)
        return job

    def adopt(self, job: Job, now: float) -> None:
        """Queue a waiting job that another scheduler withdrew, keeping its history. A job in
        the middle of its pre-run (its `PrecheckState.full` set, its spec one worker) goes on
        with it; a job that never started begins one if it should (as at `submit`); any other
        job runs its whole gang (a shell rebuilding the core gives a job found in its pre-run
        that record: `full` its own spec, `job.spec` its `prerun_spec`)."""
        refuse_new(self.jobs, job.spec)
        job.seq = self._next_seq
        self._next_seq += 1
        self.jobs[job.id] = job
        self._by_seq[job.seq] = job
        self.lifecycle.entered(job, adopted=True)
        self._enqueue(job, now)

    def restore_running(
        self, job_id: str, gpus: tuple[int, ...], started_at: float, now: float
    ) -> Job:
        """After the shell restarts: a queued job (adopted with its history, its attempt count
        already counting this attempt) is in fact running on these GPUs since `started_at`."""
        job = self.jobs[job_id]
        if job.status is not _PENDING:
            raise ValueError(f"job {job_id} is {job.status.value}, not PENDING")
        if not job.spec.plain and not gpus:
            raise ValueError(f"job {job_id}: a job without GPUs cannot be restored (no node)")
        holder, sharer = self._shared_holder(job, gpus)
        self._dequeue(job, now)
        if holder is None:
            claim(self.cluster, job, gpus, -1)  # CPU and memory, if any, on the node of its GPUs
        job.status = _RUNNING
        job.placement = gpus
        job.run_started_at = started_at
        self._last_start_at = max(self._last_start_at, started_at, now)
        job.stall_until = started_at
        if job.first_started_at is None:
            job.first_started_at = started_at
        job.speed = self.speed_model(job, gpus) if self.speed_model else 1.0
        job.pending_reason = ""
        job.last_event = "found running after a restart"
        for hook in self._on_start:
            hook(job, now)
        self._index(self._running, job, now)
        if holder is not None and sharer is not None:
            sharer.restore_shared(self, job, holder, now)
        return job

    def progressed(self, job_id: str, now: float) -> Preempt | None:
        """The running job reported progress for the first time in its attempt. If that
        attempt is its pre-run, the pre-run has passed: the attempt is stopped (the returned
        `Preempt`, `precheck=True`, already committed like a round's: its GPUs are free in the
        core, and the shell must not start another job on them before its processes are gone)
        and the job waits for its whole gang, in its place. Else nothing happens (None): a shell
        may report every attempt's first progress."""
        job = self.jobs[job_id]
        if job.status is not _RUNNING or job_id not in self._followed:
            return None
        return self.lifecycle.progressed(job, now)

    def _shared_holder(self, job: Job, gpus: tuple[int, ...]) -> tuple[Job | None, Stage | None]:
        """A job restored on GPUs that a running job already holds: that job and the stage under
        which they share them (packing), or ValueError when no stage lets them share."""
        if not job.spec.plain or all(self.cluster.gpu_free[g] for g in gpus):
            return None, None
        holder = next((other for other in self.running_jobs() if other.placement == gpus), None)
        if holder is not None:
            for stage in self._shared:
                if not stage.shares(holder):
                    return holder, stage
        raise ValueError(f"job {job.id}: its GPUs are held by another running job")

    # -- for a caller that sizes and places jobs itself (core.elastic) ----------------------

    def set_gpus(self, job_id: str, gpus: int, now: float) -> Job:
        """Give a waiting job another gang size (an elastic job between two attempts); the work
        it has done is kept, as for any job that waits again."""
        job = self.jobs[job_id]
        if job.status is not _PENDING:
            raise ValueError(f"job {job_id} is {job.status.value}, not PENDING")
        self._unindex(self.pending, job)
        if job.spec.plain:
            self._count_size(job.spec.gpus, -1)
            self._count_size(gpus, +1)
        job.spec = replace(job.spec, gpus=gpus)
        self._index(self.pending, job, now)
        return job

    def start_placed(self, job_id: str, placed: Placed, now: float) -> Start:
        """Start a waiting job on GPUs the caller's placement chose, outside the queue's order."""
        job = self.jobs[job_id]
        if job.status is not _PENDING:
            raise ValueError(f"job {job_id} is {job.status.value}, not PENDING")
        actions: list[Action] = []
        self._start(job, placed, now, actions)
        start = actions[0]
        assert isinstance(start, Start)
        return start

    # -- what the round's plugins may do (RoundHost, PreemptHost, LifecycleHost) ------------

    def start_on(self, job: Job, placed: Placed, now: float, actions: list[Action]) -> None:
        self._start(job, placed, now, actions)

    def change_speed(self, job: Job, speed: float, now: float) -> None:
        self._change_speed(job, speed, now)

    def is_shared(self, job: Job) -> bool:
        """Another job may use the job's GPUs or node (a stage packed them, or it holds a share
        of a GPU, CPU or memory): migration never moves it."""
        return not job.spec.plain or any(stage.shares(job) for stage in self._shared)

    def move(self, job: Job, node: int, by: str, now: float, actions: list[Action]) -> None:
        """Migrate a running job to free GPUs of another node: stopped through its checkpoint
        contract and started again there, paying the restore stall; not counted as preempted."""
        gpus = job.placement
        self.cluster.release(gpus)
        self._account_run(job, now)
        self._enqueue(job, now)
        actions.append(Preempt(job.id, gpus, by, kind="migrated"))
        self._start(
            job, Placed(tuple(self.cluster.pick_in_node(node, job.spec.gpus))), now, actions
        )
        job.migrations += 1
        job.last_event = f"migrated to make room for job {by}"

    def requeue(
        self, job: Job, by: str, now: float, actions: list[Action], *, kind: str = "preempted"
    ) -> None:
        """Stop a running job through its checkpoint contract and queue it again, for a stage's
        reason (`kind`: a packing stage "unpacked" it); a partner it shared its GPUs with keeps
        them, at its speed alone. Counted as a preemption."""
        self._release(job, now)
        actions.append(replace(self._requeue_preempted(job, by, now), kind=kind))

    def stop_freed(self, job: Job, by: Job, now: float, actions: list[Action]) -> None:
        """Stop a running job whose GPUs a statement already freed in the cluster, with the
        partner it shared them with (see Packing.frees_gpus), and queue it again."""
        shared = self._partner_release(job, now)
        actions.append(self._requeue_preempted(job, by.id, now))
        if shared is not None:
            actions.append(self._requeue_preempted(shared[0], by.id, now))

    def evict(self, job_id: str, now: float, by: str) -> Preempt:
        """Preempt a running job for a reason outside the policy (its GPUs are reclaimed)."""
        job = self._running_job(job_id)
        self._release(job, now)
        return self._requeue_preempted(job, by, now)

    def stop(self, job: Job, now: float) -> None:
        self._stop(job, now)

    def enqueue(self, job: Job, now: float) -> None:
        self._enqueue(job, now)

    def stage(self, name: str) -> Stage | None:
        """The round stage of that name, if this scheduler runs it."""
        return next((stage for stage in self.stages if stage.name == name), None)

    # -- transitions ------------------------------------------------------------------------

    def _start(self, job: Job, placed: Placed, now: float, actions: list[Action]) -> None:
        self._dequeue(job, now)
        gpus = placed.gpus
        plain = job.spec.plain
        if plain:
            self.cluster.allocate(gpus)
        else:
            claim(self.cluster, job, gpus, placed.node)
        resumed, trial = self.lifecycle.starting(job)
        job.status = _RUNNING
        job.placement = gpus
        job.run_started_at = now
        if now > self._last_start_at:
            self._last_start_at = now
        job.attempts += 1
        if job.first_started_at is None:
            job.first_started_at = now
        relaxed = placed.relaxed
        if relaxed:
            job.relaxed = True
        speed_model = self.speed_model
        job.speed = speed_model(job, gpus) if speed_model else 1.0
        job.stall_until = now + self.restore_s if resumed else now
        if self.on_start is not None:
            self.on_start(job, now)
        job.pending_why = ""  # (`pending_reason`, without its setter's call)
        for hook in self._on_start:
            hook(job, now)
        job.last_event = (
            self._started_on(gpus)
            if gpus
            else f"started on node {self.cluster.nodes[job.node].name} (no GPU)"
        )
        self._index(self._running, job, now)
        if plain and not trial:
            actions.append(Start(job.id, gpus, relaxed, resumed))
        else:
            actions.append(
                Start(
                    job.id,
                    placed.gpus,
                    relaxed=placed.relaxed,
                    resumed=resumed,
                    milli=job.spec.gpu_milli,
                    node=job.node,
                    precheck=trial,
                )
            )

    def _started_on(self, gpus: tuple[int, ...]) -> str:
        """A start's `last_event`: on how many nodes (most starts are on one, told without
        building the set of their nodes)."""
        gpu_node = self.cluster.gpu_node
        first = gpu_node[gpus[0]]
        for gpu in gpus:
            if gpu_node[gpu] != first:
                return f"started on {count_noun(len(self.cluster.nodes_of(gpus)), 'node')}"
        return _ON_ONE_NODE

    def _requeue_preempted(self, job: Job, by: str, now: float) -> Preempt:
        gpus = job.placement
        self._account_run(job, now)
        job.preemptions += 1
        self.preemptions += 1
        job.last_event = f"preempted by {by}"
        self._enqueue(job, now)
        return Preempt(job.id, gpus, by)

    def _stop(self, job: Job, now: float) -> None:
        self._release(job, now)
        self._account_run(job, now)

    def _release(self, job: Job, now: float) -> None:
        """Free the job's GPUs, unless a packed partner keeps running on them at its speed alone."""
        shared = self._partner_release(job, now)
        if shared is None:
            unclaim(self.cluster, job)
        else:
            self._change_speed(*shared, now)

    def _partner_release(self, job: Job, now: float) -> tuple[Job, float] | None:
        for stage in self._shared:
            shared = stage.partner_release(job, now)
            if shared is not None:
                return shared
        return None

    def _change_speed(self, job: Job, speed: float, now: float) -> None:
        """A running job's speed changes mid-attempt: keep its work, re-key it (a policy may order
        by projected finish), report it in the next Decision.respeeds."""
        if self.timers.idle_at:
            self.timers.catch_up(job, now)
        if self.timers.held_at:
            self.timers.catch_up_held(job)
        self._unindex(self._running, job)
        job.change_speed(speed, now)
        self._index(self._running, job, now)
        self._speed_changed[job.id] = None

    def _respeeds(self) -> list[Respeed]:
        changed = [self.jobs[job_id] for job_id in self._speed_changed]
        self._speed_changed.clear()
        return [Respeed(job.id, job.speed) for job in changed if job.status is _RUNNING]

    def _account_run(self, job: Job, now: float) -> None:
        if self.timers.idle_at:
            self.timers.catch_up(job, now)
        if self.timers.held_at:
            self.timers.catch_up_held(job)
        for hook in self._on_stop:
            hook(job, now)
        ran = job.running_s(now)
        if not self._followed or job.id not in self._followed or self.lifecycle.ran(job, ran):
            job.work_done_s = job.work_done_at(now)
        job.attempt_work_s = 0.0
        job.executed_s += ran
        job.attained_gpu_s += ran * job.spec.gpus
        self._unindex(self._running, job)
        job.run_started_at = None
        job.placement = ()
        job.node = -1

    def _enqueue(self, job: Job, now: float) -> None:
        for hook in self._on_queue:
            hook(job, +1)
        spec = job.spec
        if spec.plain:  # (`_count_size(gpus, +1)`, without its call)
            sizes = self.waiting_sizes
            gpus = spec.gpus
            count = sizes.get(gpus, 0) + 1
            if count:
                sizes[gpus] = count
            else:
                del sizes[gpus]
        else:
            self.waiting_shares += 1
        job.status = _PENDING
        job.queued_since = now
        job.pending_why = "not yet considered"  # (`pending_reason`, without its setter's call)
        if job.hold_until > now:
            self._held.add(job.seq)
        self._index(self.pending, job, now)
        if len(self.pending) > LONG_QUEUE and isinstance(self.pending, FlatIndex):
            self.pending = SortedList(self.pending)

    def _dequeue(self, job: Job, now: float) -> None:
        for hook in self._on_queue:
            hook(job, -1)
        spec = job.spec
        if spec.plain:  # (`_count_size(gpus, -1)`, without its call)
            sizes = self.waiting_sizes
            gpus = spec.gpus
            count = sizes.get(gpus, 0) - 1
            if count:
                sizes[gpus] = count
            else:
                del sizes[gpus]
        else:
            self.waiting_shares -= 1
        job.pending_s += now - job.queued_since
        self._held.discard(job.seq)
        self._unindex(self.pending, job)
        if len(self.pending) < SHORT_QUEUE and isinstance(self.pending, SortedList):
            self.pending = FlatIndex(self.pending)

    def _count_size(self, gpus: int, delta: int) -> None:
        count = self.waiting_sizes.get(gpus, 0) + delta
        if count:
            self.waiting_sizes[gpus] = count
        else:
            del self.waiting_sizes[gpus]

    def _finish(self, job: Job, status: JobStatus, now: float, event: str) -> None:
        if self._followed and job.id in self._followed:
            self.lifecycle.ended(job)
        job.status = status
        job.finished_at = now
        job.last_event = event
        self.timers.forget(job)

    def _running_job(self, job_id: str) -> Job:
        job = self.jobs[job_id]
        if job.status is not _RUNNING:
            raise ValueError(f"job {job_id} is {job.status.value}, not RUNNING")
        return job

    # -- sorted indexes ---------------------------------------------------------------------

    def _index(self, index: Index, job: Job, now: float) -> None:
        # The job's integer level comes first (higher first), the policy's order breaks ties:
        # in both queues, so where the policy preempts, a higher level may preempt a lower one.
        # The job's seq comes last: it names the job, and no two keys are equal.
        key = (-job.spec.level, *self.policy.stored_key(job, now), job.seq)
        self._stored[job.seq] = key
        index.add(key)
        self._quiet = None
        if self.waiting_kinds is not None and index is not self._running:
            self.waiting_kinds[job.seq] = placement_kind(self.placement, job, now)
        self.timers.set(job, now)
        if index is self._running and self.timers.asks_wakes:  # asked at the end of this round
            self.timers.started(job)

    def _unindex(self, index: Index, job: Job) -> None:
        key = self._stored.pop(job.seq)
        index.remove(key)
        self._quiet = None
        if index is self._running:
            self._running_left(job, key)
        else:
            if self.waiting_kinds is not None:
                del self.waiting_kinds[job.seq]
            self._waiting_left(job, key)

    def rekey(self, job: Job, now: float) -> None:
        """Re-key a job at its timer (corral.core.timers.TimerHost)."""
        if job.status is _PENDING:
            self._unindex(self.pending, job)
            self._index(self.pending, job, now)
        else:
            self._rekey_running(job, now)

    def rekey_to(self, job: Job, now: float, key: Key, changes_at: float) -> None:
        """`rekey`, given the policy's `stored_key` and `key_changes_at` of the job at `now`
        (the timers' held key changes, corral.core.timers)."""
        if job.status is _PENDING:
            self.rekey(job, now)
        else:
            self._rekey_running(job, now, key, changes_at)

    def rekey_each(self, taken: list[tuple[Job, float, Key, float]]) -> None:
        """`rekey_to` of each running job (job, now, key, changes_at), as one after the other
        does (the timers' held key changes, corral.core.timers): the same keys, timers, victims
        forgotten (`_running_rekeyed`) and memory of what changed (`_quiet`), none of which one
        job's re-key reads of another's. The running index moves each job in place where it
        stays between its neighbours, else, where many jobs move, it is sorted again at once
        (the list kept, of the jobs that did not move, and the moved keys: two sorted runs,
        which a sort merges)."""
        if not taken:
            return
        quiet = self._quiet
        still = quiet is not None and not quiet[2]  # as `_rekey_running` keeps it
        stored = self._stored
        rekeyed = self._running_rekeyed
        cut = self.policy.preempt_prefix
        pending = self.pending
        moved: list[tuple[Key, Key]] = []
        for job, _, key, _ in taken:
            seq = job.seq
            old = stored[seq]
            new = (-job.spec.level, *key, seq)  # as `_index` does
            if new == old:
                continue  # (no victim nor waiting job between them)
            stored[seq] = new
            moved.append((old, new))
            rekeyed(old, new)  # who may now preempt it, and could not before
            if not still:
                continue
            if cut is None:
                low, high = (old, new) if old < new else (new, old)
                between = pending.bisect_left(high) - pending.bisect_right(low)
            elif old[:cut] == new[:cut]:
                between = 0
            else:
                low_cut, high_cut = sorted((old[:cut], new[:cut]))
                between = pending.bisect_left((*high_cut, TOP)) - pending.bisect_left(low_cut)
            if between != 0:
                still = False
        self.timers.set_each(taken)
        running = self._running
        if len(moved) <= _FEW_MOVES:
            for old, new in moved:
                running.replace(old, new)
        else:
            keys = running.keys
            gone = {old[-1] for old, _ in moved}
            kept = [key for key in keys if key[-1] not in gone]
            news = [new for _, new in moved]
            news.sort()
            kept += news
            kept.sort()
            keys[:] = kept  # (the list others read)
        self._quiet = quiet if still else None

    def _rekey_running(
        self, job: Job, now: float, key: Key | None = None, changes_at: float | None = None
    ) -> None:
        """Re-key a running job at its timer. The walk of a round is unchanged unless a waiting
        job's key lies between the old and the new one (the job joins or leaves its victims, and
        the lowest running key moves past it only then), or a placement was tried while
        preempting (the victims' order could matter). Where the victim rule compares only the
        keys' leading parts (`Policy.preempt_prefix`: LAS queues), "between" is of those parts:
        a waiting job of the queue the job leaves or enters may preempt it now, or no more."""
        quiet = self._quiet
        old = self._stored[job.seq]
        if key is None:
            key = self.policy.stored_key(job, now)
        new = (-job.spec.level, *key, job.seq)  # as `_index` does
        self._stored[job.seq] = new
        self._running.replace(old, new)
        self._quiet = None
        self.timers.set(job, now, changes_at)
        self._running_rekeyed(old, new)  # who may now preempt it, and could not before
        if quiet is None or quiet[2]:
            return
        cut = self.policy.preempt_prefix
        if cut is None:
            low, high = sorted((old, new))
            between = self.pending.bisect_left(high) - self.pending.bisect_right(low)
        elif old[:cut] == new[:cut]:
            between = 0  # no waiting job's victims change
        else:
            # Every key of a prefix sorts after the prefix alone and before it extended by TOP.
            low_cut, high_cut = sorted((old[:cut], new[:cut]))
            between = self.pending.bisect_left((*high_cut, TOP)) - self.pending.bisect_left(low_cut)
        if between == 0:
            self._quiet = quiet

    # -- reading the state ------------------------------------------------------------------

    def pending_jobs(self) -> Iterable[Job]:
        return (self._by_seq[key[-1]] for key in self.pending)

    def running_jobs(self) -> Iterable[Job]:
        self.timers.settle()  # key changes held back while no job waited (corral.core.timers)
        by_seq = self._by_seq
        return (by_seq[key[-1]] for key in self._running.keys)

    @property
    def pending_count(self) -> int:
        return len(self.pending)

    @property
    def running_count(self) -> int:
        return len(self._running.keys)
