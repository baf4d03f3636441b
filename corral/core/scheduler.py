"""The scheduling core: the cluster, the jobs and the decisions, with no clock and no I/O.

The shell (the simulator's event loop, or the live control loop) tells the scheduler what happened
(`submit`, `finished`, `failed`, `cancel`) and calls `decide(now)`. Like Kubernetes's scheduler
"assuming" a pod bound before the bind completes, `decide` commits its choices to this state at
once (GPUs taken, jobs running or preempted) and returns the actions the shell must carry out.

Pending and running jobs sit in sorted indexes keyed by the policy, so a round walks the queue
from the front and stops as soon as nothing more can change: no free GPUs and no running job of
lower priority than the next waiting one.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace

from sortedcontainers import SortedList

from corral.core.actions import Action, Decision, Preempt, Respeed, Start
from corral.core.chain import as_chain
from corral.core.cluster import Cluster
from corral.core.job import Job, JobSpec, JobStatus
from corral.core.lifecycle import Lifecycle
from corral.core.placement.base import Placed, Placement, not_enough
from corral.core.plugin import PluginError, SpeedModel
from corral.core.policy.base import Key, Policy
from corral.core.precheck import PreRuns
from corral.core.preempt import TOP, VICTIM_RULES, Preemption
from corral.core.protocol import Admission
from corral.core.refusal import Refusals, refuse_new
from corral.core.retry import Failure, FailureReport, RetryOptions, RetryRule, Verdict
from corral.core.stages import Stage
from corral.core.statement import claim, unclaim
from corral.core.text import count_noun

#: Called once per attempt as a job starts (placement, speed and restore stall already set); it
#: may lower `job.speed` and move `job.stall_until` later: a node's data cache (core.cache) is
#: allocated here, not in the SpeedModel, which placements may also call to ask about speeds.
StartHook = Callable[[Job, float], None]

#: The waiting queue is a `_FlatIndex` while it is short and a `SortedList` while it is long
#: (`Scheduler._enqueue`, `_dequeue`): a flat list moves every entry behind an insert, which
#: costs more than SortedList's layers from several thousand entries on (an insert and a remove,
#: pure Python: 1.7 us against 2.1 us at 2,000 entries, 3.8 against 3.1 at 8,000, 33 against 10
#: at 128,000; compiled, the flat list's bisects are C calls). The bounds are apart, so that a
#: queue at one does not switch at every job.
LONG_QUEUE = 8192
SHORT_QUEUE = 2048


class _FlatIndex:
    """A sorted list of the scheduler's keys (each ending with its job's seq, `_index`) with
    SortedList's `add`, `remove` and bisects, for the running jobs and a short waiting queue: the
    running jobs are at most one per GPU (a few thousand), so one flat list moved by memmove
    beats SortedList's layers, and a re-key that leaves the job between its neighbours (most
    do: few running jobs share a key level) replaces it where it is (`replace`).

    The keys are a plain list (`keys`), not this object: `bisect` reads a list subclass's items
    through Python's generic item slot (a method lookup and a call per probe), 1.8 times as
    slow as a list's (550 ns against 984 ns a bisect of 730 keys)."""

    __slots__ = ("keys",)

    def __init__(self, keys: Iterable[Key] = ()) -> None:
        self.keys: list[Key] = list(keys)

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, position: int) -> Key:
        return self.keys[position]

    def __iter__(self) -> Iterator[Key]:
        return iter(self.keys)

    def bisect_left(self, item: Key) -> int:
        return bisect.bisect_left(self.keys, item)

    def bisect_right(self, item: Key) -> int:
        return bisect.bisect_right(self.keys, item)

    def add(self, item: Key) -> None:
        bisect.insort(self.keys, item)

    def remove(self, item: Key) -> None:
        keys = self.keys
        index = bisect.bisect_left(keys, item)
        if index == len(keys) or keys[index] != item:
            raise ValueError(f"{item!r} not in the index")
        del keys[index]

    def replace(self, old: Key, new: Key) -> None:
        """`remove(old)` then `add(new)`, in place when `new` sorts where `old` was."""
        keys = self.keys
        index = bisect.bisect_left(keys, old)
        if index == len(keys) or keys[index] != old:
            raise ValueError(f"{old!r} not in the index")
        if (index == 0 or keys[index - 1] < new) and (
            index + 1 == len(keys) or new < keys[index + 1]
        ):
            keys[index] = new
            return
        del keys[index]
        bisect.insort(keys, new)


class Scheduler:
    def __init__(
        self,
        cluster: Cluster,
        policy: Policy,
        placement: Placement,
        *,
        backfill: bool = False,
        speed_model: SpeedModel | None = None,
        restore_s: float = 0.0,
        victims: str = "lowest",
        admission: Admission | Iterable[Admission] | None = None,
        on_start: StartHook | None = None,
        stages: Sequence[Stage] = (),
        retry: RetryRule | None = None,
        precheck_s: float | None = None,
    ) -> None:
        """`retry` judges failed attempts: the backoff before a retry and the user-error rule
        (default: `RetryRule(RetryOptions())`). `precheck_s`: the pre-run of jobs whose spec
        names none (corral.core.precheck; None or 0: none). `victims`: which running jobs a
        waiting job preempts (corral.core.preempt.VICTIM_RULES). `admission`: the admissions
        in front of the queue, consulted in order (corral.core.chain)."""
        chain = as_chain(admission)
        for stage in stages:
            if stage.shares_gpus and chain.counts_gpus:
                raise PluginError(
                    f"stages: {stage.name}: admission {chain.name} counts GPUs per job, and jobs "
                    f"under {stage.name} share GPUs"
                )
        if victims not in VICTIM_RULES:
            raise PluginError(
                f"victims: unknown victim rule {victims!r}; choose one of {', '.join(VICTIM_RULES)}"
            )
        rule = VICTIM_RULES[victims]()
        if chain.picks_victims and not rule.with_picked_victims:
            raise PluginError(f"victims {victims}: not with admission {chain.name}")
        self.cluster = cluster
        self.admission = chain
        #: What the admissions have opinions on, for the hot paths (nothing, without any).
        self._checks = chain.having("check")
        self._queues = chain.having("queue")
        self._picks_victims = chain.picks_victims
        self._on_queue = chain.hooks("on_queue")
        self._on_start = chain.hooks("on_start")
        self._on_stop = chain.hooks("on_stop")
        self._round_hooks = chain.hooks("begin_round")
        self._narrows = chain.having("walks")
        self.policy = policy
        self.placement = placement
        self._refusals = Refusals(placement, chain)
        self._placement_plans = type(placement).begin_round is not Placement.begin_round
        self.backfill = backfill
        self.speed_model = speed_model
        self.restore_s = restore_s
        self.on_start = on_start
        self.stages = list(stages)
        self._defragmenters = [s for s in self.stages if s.point == "defragment"]
        self._sharers = [s for s in self.stages if s.point == "share"]
        self._shared = [s for s in self.stages if s.shares_gpus]
        self.retry = retry if retry is not None else RetryRule(RetryOptions())
        self._speed_changed: dict[str, None] = {}  # running jobs to report in Decision.respeeds
        self.jobs: dict[str, Job] = {}
        #: Every job the scheduler holds, by `seq`; a job withdrawn (or an ended one forgotten)
        #: leaves it, so that a long run holds only its live jobs.
        self._by_seq: dict[int, Job] = {}
        self._next_seq = 0
        #: Waiting jobs by key: a `_FlatIndex`, or a `SortedList` while many wait.
        self._pending: SortedList | _FlatIndex = _FlatIndex()
        self._running = _FlatIndex()
        self._stored: dict[int, Key] = {}
        self._timers: list[tuple[float, int, int]] = []
        self._lazy_timers: list[tuple[float, int, int]] = []  # not waking (Policy.rekey_wakes)
        #: Key changes of running jobs where a round with no job waiting does nothing
        #: (`_may_repeat`): they wake the scheduler only while a job waits (`_next_wake`), and
        #: are otherwise taken, each at its own instant, at the next round or before the job
        #: stops (`_catch_up`). `_idle_at`: each running job's latest one (instant, version).
        self._idle_timers: list[tuple[float, int, int]] = []
        self._idle_at: dict[int, tuple[float, int]] = {}
        self._timer_version: dict[int, int] = {}
        #: A policy's own wake-ups (`Policy.wakes_at`, where key changes do not wake): per
        #: running job (seq, attempt) its `Policy.wake_bound` from when it was last asked, a heap
        #: searched lazily (`_earliest_wake`). Entries of jobs that stopped wait to be popped.
        self._asks_wakes = not policy.rekey_wakes
        self._wake_bounds: list[tuple[float, int, int]] = []
        self.rounds = 0
        self.preemptions = 0
        self.blocked_by: str | None = None
        self._offline: set[int] = set()  # GPUs of dead nodes, held allocated so no one gets them
        #: Waiting jobs that ask for a share of a GPU, CPU or memory: with none free whole GPUs
        #: may still run them, so the round does not stop when no whole GPU is free.
        self._waiting_shares = 0
        #: Waiting jobs of whole GPUs by GPU count (none of 0): with fewer GPUs free than the
        #: smallest of them asks, no waiting job can start on free GPUs.
        self._waiting_sizes: dict[int, int] = {}
        #: Follows jobs through their lives (the pre-runs, corral.core.precheck); its per-job
        #: hooks are asked of the jobs it follows (`_followed`) only.
        self.lifecycle: Lifecycle = PreRuns(self, precheck_s)
        self._followed = self.lifecycle.jobs
        # A round repeats the last one when nothing it looks at changed since that one ended
        # without an action: the same walk would again do nothing and leave the same reasons.
        # Only with plain jobs, keys fixed between announced instants, a placement that depends
        # on the free GPUs alone, and no admission or stage with state of its own.
        self._may_repeat = (
            not chain.volatile
            and not self.stages
            and not self._placement_plans
            and placement.pure
            and not placement.shares
            and policy.stored_is_key
        )
        #: After a round without actions: (the cluster's version, `preempt`, whether a placement
        #: was tried while preempting); None once anything the walk looks at changed.
        self._quiet: tuple[int, bool, bool] | None = None
        self._quiet_at = -math.inf  # that round's instant
        self._last_start_at = -math.inf
        self._held: set[int] = set()  # waiting jobs queued with a retry backoff
        self.victims = victims
        #: Who gives way to a waiting job that does not fit (corral.core.preempt).
        self.preemption = Preemption(
            self,
            rule,
            chain,
            running=self._running.keys,
            by_seq=self._by_seq,
            stored=self._stored,
            shared=self._shared,
            remembers=self._may_repeat,
        )
        self._no_room = self.preemption.no_room  # failed searches remembered (read only)
        self._running_left = self.preemption.running_left

    # -- what the shell reports ---------------------------------------------------------------

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
        self._finish(job, JobStatus.SUCCEEDED, now, "succeeded")
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
        if job.status is JobStatus.RUNNING:
            self._stop(job, now)
        elif job.status is JobStatus.PENDING:
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
        if job.status is JobStatus.RUNNING:
            self._stop(job, now)
            job.status = JobStatus.PENDING
            job.queued_since = now
        elif job.status is JobStatus.PENDING:
            self._dequeue(job, now)
        else:  # ended: forgotten (a shell queues it again under its id: a requeue)
            del self.jobs[job_id]
            self._by_seq.pop(job.seq, None)
            return job
        self._timer_version.pop(job.seq, None)
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
        if job.status is not JobStatus.PENDING:
            raise ValueError(f"job {job_id} is {job.status.value}, not PENDING")
        if not job.spec.plain and not gpus:
            raise ValueError(f"job {job_id}: a job without GPUs cannot be restored (no node)")
        holder, sharer = self._shared_holder(job, gpus)
        self._dequeue(job, now)
        if holder is None:
            claim(self.cluster, job, gpus, -1)  # CPU and memory, if any, on the node of its GPUs
        job.status = JobStatus.RUNNING
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
        if job.status is not JobStatus.RUNNING or job_id not in self._followed:
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

    # -- for a caller that sizes and places jobs itself (core.elastic) ------------------------

    def set_gpus(self, job_id: str, gpus: int, now: float) -> Job:
        """Give a waiting job another gang size (an elastic job between two attempts); the work
        it has done is kept, as for any job that waits again."""
        job = self.jobs[job_id]
        if job.status is not JobStatus.PENDING:
            raise ValueError(f"job {job_id} is {job.status.value}, not PENDING")
        self._unindex(self._pending, job)
        if job.spec.plain:
            self._count_size(job.spec.gpus, -1)
            self._count_size(gpus, +1)
        job.spec = replace(job.spec, gpus=gpus)
        self._index(self._pending, job, now)
        return job

    def start_placed(self, job_id: str, placed: Placed, now: float) -> Start:
        """Start a waiting job on GPUs the caller's placement chose, outside the queue's order."""
        job = self.jobs[job_id]
        if job.status is not JobStatus.PENDING:
            raise ValueError(f"job {job_id} is {job.status.value}, not PENDING")
        actions: list[Action] = []
        self._start(job, placed, now, actions)
        start = actions[0]
        assert isinstance(start, Start)
        return start

    def start_defragmented(self, job_id: str, now: float) -> list[Action]:
        """Start a waiting job by the defragmenting stages (migration): the moves and the start,
        or [] when none could."""
        actions: list[Action] = []
        job = self.jobs[job_id]
        any(stage.try_start(self, job, now, actions) for stage in self._defragmenters)
        return actions

    # -- deciding -----------------------------------------------------------------------------

    def decide(self, now: float, *, preempt: bool = True) -> Decision:
        """One scheduling round. With `preempt=False` it only starts jobs on free GPUs (a
        multi-tenant caller may first look for free GPUs elsewhere before preempting)."""
        self.rounds += 1
        actions: list[Action] = []
        self._fire_timers(now, actions)  # a pre-run that passes by its timer is stopped first
        if self._repeats(now, preempt) and not actions:
            return Decision(actions, self._next_wake(now), self._respeeds())
        for stage in self.stages:
            stage.new_round()
        for stage in self.stages:  # e.g. packing splits the pairs it measured not to gain
            stage.begin_round(self, now, actions)
        if self._placement_plans:  # a placement that decides for the round's jobs together
            self.placement.begin_round(
                self.cluster, self.pending_jobs(), self.running_jobs(), self.speed_model, now
            )
        for hook in self._round_hooks:  # fair share's shares settle with time
            hook(now)
        if self._narrows:
            # Quota: first only what fits within the VCs' quotas, then borrowers, then
            # opportunistic jobs on what is still idle (each walk narrowed by the admission).
            for _ in self.admission.walks():
                self._walk_queue(now, preempt, actions)
        self.preemption.tried = False
        self._walk_queue(now, preempt, actions)
        self._quiet = None
        if self._may_repeat and not actions:
            self._quiet = (self.cluster.version, preempt, self.preemption.tried)
            self._quiet_at = now
        return Decision(actions, self._next_wake(now), self._respeeds())

    def _repeats(self, now: float, preempt: bool) -> bool:
        """This round's walk would repeat the last round's, which did nothing: nothing changed
        since (no job queued, re-keyed where it matters, started or stopped, no GPU freed or
        taken), no waiting job is held by a retry backoff (its reason names the time left), and
        no running job started at that round's instant (it was no victim then, it is now)."""
        quiet = self._quiet
        return (
            quiet is not None
            and quiet[0] == self.cluster.version
            and quiet[1] == preempt
            and not self._held
            and self._last_start_at < self._quiet_at
        )

    def _walk_queue(self, now: float, preempt: bool, actions: list[Action]) -> None:
        """Start (and preempt for) waiting jobs in the policy's order, as far as anything can
        change: the body of a scheduling round."""
        self.blocked_by = None
        cluster = self.cluster
        # Within a round, a job of the same kind needing at least as many GPUs as one that did not
        # fit cannot fit either (and, being of lower priority, has no more victims to preempt).
        # The kind includes the GPUs per worker: a job of smaller workers fits where larger did not.
        # A job asking for a share, CPU or memory is of the same kind only with the same request.
        no_fit: dict[tuple[object, ...], float] = {}
        # Both bounds on preempting hold for the later jobs with the same victims: of those GPU
        # types, and of that queue when a quota decides who may be preempted (another VC's job,
        # or one beyond its share, may take back other jobs).
        no_room: dict[tuple[object, ...], float] = {}
        too_few_victims: dict[tuple[frozenset[str] | None, str], float] = {}
        blocked_queues: set[str] = set()
        admission = self.admission
        checks, queues, picks = self._checks, self._queues, self._picks_victims
        # Once a job may not preempt, no job behind it may in this round: their keys are higher,
        # jobs started meanwhile have lower keys than theirs, and none is preempted from here
        # on. Not so where an admission or a stage decides otherwise (a reclaim, a move).
        settles = not picks and not self.stages
        may_preempt_for = self.preemption.may_preempt_for
        make_room = self.preemption.make_room
        preempting = preempt
        position = 0
        while position < len(self._pending):
            job = self._by_seq[self._pending[position][-1]]
            can_preempt = preempting and may_preempt_for(job, now)
            if settles and not can_preempt:
                preempting = False
            free = cluster.free_gpus
            if (
                not can_preempt
                and (free == 0 or free < min(self._waiting_sizes, default=0))
                and not self._waiting_shares
                and not any(stage.keeps_walking() for stage in self._sharers)
            ):
                if not picks or not admission.someone_over_share():
                    short = not_enough(cluster, job) if free else None
                    job.pending_reason = (
                        "waiting for free GPUs: all are in use by jobs of equal or higher priority"
                        if short is None
                        else short.reason
                    )
                    break
                # A job further back, of a VC under its share, may still reclaim GPUs.
                job.pending_reason = "waiting for free GPUs"
                position += 1
                continue
            if job.hold_until > now:
                job.pending_reason = f"retry backoff: held for {job.hold_until - now:.0f} s more"
                position += 1
                continue
            if blocked_queues and admission.queue(job) in blocked_queues:
                job.pending_reason = f"blocked behind the head job of {admission.queue(job)}"
                position += 1
                continue
            if checks:
                refusal = admission.check(job)
                if refusal is not None:
                    job.pending_reason = refusal
                    position += 1
                    continue
            spec = job.spec
            kind: tuple[object, ...] = (
                spec.gpu_types,
                self.placement.mode(job, now),
                spec.gpus_per_worker,
            )
            if not spec.plain:
                kind += (spec.gpu_milli, spec.cpu_milli, spec.memory_mib)
            if job.spec.gpus < no_fit.get(kind, math.inf):
                result = self.placement.place(cluster, job, now)
                if isinstance(result, Placed):
                    self._start(job, result, now, actions)
                    continue
                if any(stage.try_start(self, job, now, actions) for stage in self._defragmenters):
                    continue
                no_fit[kind] = job.spec.gpus
                job.pending_reason = result.reason
            else:
                job.pending_reason = (
                    "no room: a job of the same kind needing fewer GPUs did not fit"
                )
            victims_kind = (job.spec.gpu_types, (admission.queue(job) or "") if queues else "")
            if (
                can_preempt
                and job.spec.gpus < no_room.get((kind, victims_kind), math.inf)
                and job.spec.gpus < too_few_victims.get(victims_kind, math.inf)
            ):
                outcome = make_room(job, now, actions)
                if outcome == "started":
                    # Its victims may have freed more GPUs than it took: what did not fit may now.
                    no_fit.clear()
                    continue
                if outcome == "too few victims":
                    too_few_victims[victims_kind] = job.spec.gpus
                else:
                    no_room[(kind, victims_kind)] = job.spec.gpus
            if any(stage.try_start(self, job, now, actions) for stage in self._sharers):
                continue
            if self.policy.blocking and not self.backfill:
                queue = admission.queue(job) if queues else None
                if queue is None:
                    self.blocked_by = job.id
                    break
                blocked_queues.add(queue)  # YARN-CS: a VC's queue blocks itself
            position += 1

    # -- state transitions --------------------------------------------------------------------

    def _start(self, job: Job, placed: Placed, now: float, actions: list[Action]) -> None:
        self._dequeue(job, now)
        if job.spec.plain:
            self.cluster.allocate(placed.gpus)
        else:
            claim(self.cluster, job, placed.gpus, placed.node)
        resumed, trial = self.lifecycle.starting(job)
        job.status = JobStatus.RUNNING
        job.placement = placed.gpus
        job.run_started_at = now
        self._last_start_at = max(self._last_start_at, now)
        job.attempts += 1
        if job.first_started_at is None:
            job.first_started_at = now
        job.relaxed = job.relaxed or placed.relaxed
        job.speed = self.speed_model(job, placed.gpus) if self.speed_model else 1.0
        job.stall_until = now + self.restore_s if resumed else now
        if self.on_start is not None:
            self.on_start(job, now)
        job.pending_reason = ""
        for hook in self._on_start:
            hook(job, now)
        job.last_event = (
            f"started on {count_noun(len(self.cluster.nodes_of(placed.gpus)), 'node')}"
            if placed.gpus
            else f"started on node {self.cluster.nodes[job.node].name} (no GPU)"
        )
        self._index(self._running, job, now)
        if job.spec.plain and not trial:
            actions.append(Start(job.id, placed.gpus, relaxed=placed.relaxed, resumed=resumed))
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
        if self._idle_at:
            self._catch_up(job, now)
        self._unindex(self._running, job)
        job.change_speed(speed, now)
        self._index(self._running, job, now)
        self._speed_changed[job.id] = None

    def _respeeds(self) -> list[Respeed]:
        changed = [self.jobs[job_id] for job_id in self._speed_changed]
        self._speed_changed.clear()
        return [Respeed(job.id, job.speed) for job in changed if job.status is JobStatus.RUNNING]

    # -- what a round stage may do (corral.core.stages.RoundHost) ----------------------------

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

    # -- what a lifecycle plugin may do (corral.core.lifecycle.LifecycleHost) ----------------

    def stop(self, job: Job, now: float) -> None:
        self._stop(job, now)

    def enqueue(self, job: Job, now: float) -> None:
        self._enqueue(job, now)

    def stage(self, name: str) -> Stage | None:
        """The round stage of that name, if this scheduler runs it."""
        return next((stage for stage in self.stages if stage.name == name), None)

    def _account_run(self, job: Job, now: float) -> None:
        if self._idle_at:
            self._catch_up(job, now)
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
        if job.spec.plain:
            self._count_size(job.spec.gpus, +1)
        else:
            self._waiting_shares += 1
        job.status = JobStatus.PENDING
        job.queued_since = now
        job.pending_reason = "not yet considered"
        if job.hold_until > now:
            self._held.add(job.seq)
        self._index(self._pending, job, now)
        if len(self._pending) > LONG_QUEUE and isinstance(self._pending, _FlatIndex):
            self._pending = SortedList(self._pending)

    def _dequeue(self, job: Job, now: float) -> None:
        for hook in self._on_queue:
            hook(job, -1)
        if job.spec.plain:
            self._count_size(job.spec.gpus, -1)
        else:
            self._waiting_shares -= 1
        job.pending_s += now - job.queued_since
        self._held.discard(job.seq)
        self._unindex(self._pending, job)
        if len(self._pending) < SHORT_QUEUE and isinstance(self._pending, SortedList):
            self._pending = _FlatIndex(self._pending)

    def _count_size(self, gpus: int, delta: int) -> None:
        count = self._waiting_sizes.get(gpus, 0) + delta
        if count:
            self._waiting_sizes[gpus] = count
        else:
            del self._waiting_sizes[gpus]

    def _finish(self, job: Job, status: JobStatus, now: float, event: str) -> None:
        if self._followed and job.id in self._followed:
            self.lifecycle.ended(job)
        job.status = status
        job.finished_at = now
        job.last_event = event
        self._timer_version.pop(job.seq, None)

    def _running_job(self, job_id: str) -> Job:
        job = self.jobs[job_id]
        if job.status is not JobStatus.RUNNING:
            raise ValueError(f"job {job_id} is {job.status.value}, not RUNNING")
        return job

    # -- sorted indexes and timers ------------------------------------------------------------

    def _index(self, index: SortedList | _FlatIndex, job: Job, now: float) -> None:
        # The job's integer level comes first (higher first), the policy's order breaks ties:
        # in both queues, so where the policy preempts, a higher level may preempt a lower one.
        # The job's seq comes last: it names the job, and no two keys are equal.
        key = (-job.spec.level, *self.policy.stored_key(job, now), job.seq)
        self._stored[job.seq] = key
        index.add(key)
        self._quiet = None
        self._set_timer(job, now)
        if self._asks_wakes and index is self._running:  # asked at the end of this round
            heapq.heappush(self._wake_bounds, (-math.inf, job.seq, job.attempts))

    def _unindex(self, index: SortedList | _FlatIndex, job: Job) -> None:
        key = self._stored.pop(job.seq)
        index.remove(key)
        self._quiet = None
        if index is self._running:
            self._running_left(job, key)
        elif self._no_room:
            self.preemption.waiting_left(job, key)

    def _rekey_running(self, job: Job, now: float) -> None:
        """Re-key a running job at its timer. The walk of a round is unchanged unless a waiting
        job's key lies between the old and the new one (the job joins or leaves its victims, and
        the lowest running key moves past it only then), or a placement was tried while
        preempting (the victims' order could matter). Where the victim rule compares only the
        keys' leading parts (`Policy.preempt_prefix`: LAS queues), "between" is of those parts:
        a waiting job of the queue the job leaves or enters may preempt it now, or no more."""
        quiet = self._quiet
        old = self._stored[job.seq]
        new = (-job.spec.level, *self.policy.stored_key(job, now), job.seq)  # as `_index` does
        self._stored[job.seq] = new
        self._running.replace(old, new)
        self._quiet = None
        self._set_timer(job, now)
        if self._no_room:  # the waiting jobs that may now preempt it, and could not before
            self.preemption.rekeyed(old, new)
        if quiet is None or quiet[2]:
            return
        cut = self.policy.preempt_prefix
        if cut is None:
            low, high = sorted((old, new))
            between = self._pending.bisect_left(high) - self._pending.bisect_right(low)
        elif old[:cut] == new[:cut]:
            between = 0  # no waiting job's victims change
        else:
            # Every key of a prefix sorts after the prefix alone and before it extended by TOP.
            low_cut, high_cut = sorted((old[:cut], new[:cut]))
            between = self._pending.bisect_left((*high_cut, TOP)) - self._pending.bisect_left(
                low_cut
            )
        if between == 0:
            self._quiet = quiet

    def _set_timer(self, job: Job, now: float) -> None:
        """One timer per job (a later one replaces it): the earliest instant its key, placement
        mode, backoff or pre-run changes. A policy whose key changes do not wake the scheduler
        (`Policy.rekey_wakes`) has them taken at the first round at or after their instant."""
        at = self.policy.key_changes_at(job, now)
        lazy = idle = math.inf
        if not self.policy.rekey_wakes:
            lazy, at = at, math.inf
        if job.status is JobStatus.PENDING:
            at = min(at, self.placement.changes_at(job, now))
            if job.hold_until > now:  # wake when its retry backoff ends
                at = min(at, job.hold_until)
        elif self._followed and job.id in self._followed:
            at = min(at, self.lifecycle.due_at(job))
        elif self._may_repeat:
            idle, at = at, math.inf
        version = self._timer_version.get(job.seq, 0) + 1
        self._timer_version[job.seq] = version
        if at < math.inf:
            heapq.heappush(self._timers, (max(at, now), job.seq, version))
        if lazy < at:
            heapq.heappush(self._lazy_timers, (max(lazy, now), job.seq, version))
        if idle < math.inf:
            idle = max(idle, now)
            heapq.heappush(self._idle_timers, (idle, job.seq, version))
            self._idle_at[job.seq] = (idle, version)

    def _fire_timers(self, now: float, actions: list[Action]) -> None:
        timers, lazy, idle = self._timers, self._lazy_timers, self._idle_timers
        while True:  # the earliest due timer of the three heaps
            heap = timers if timers and timers[0][0] <= now else None
            for other in (lazy, idle):
                if other and other[0][0] <= now and (heap is None or other[0] < heap[0]):
                    heap = other
            if heap is None:
                break
            at, seq, version = heapq.heappop(heap)
            if self._timer_version.get(seq) != version:
                continue
            job = self._by_seq[seq]
            if heap is idle:  # as if each had woken a round of its own at its instant
                self._take_idle(job, at, now)
                continue
            self.policy.on_key_change(job, now)
            if (
                job.status is JobStatus.RUNNING
                and self._followed
                and job.id in self._followed
                and self.lifecycle.due(job, now, actions)
            ):
                continue
            if job.status is JobStatus.PENDING:
                self._unindex(self._pending, job)
                self._index(self._pending, job, now)
            else:
                self._rekey_running(job, now)

    def _take_idle(self, job: Job, at: float, until: float) -> None:
        """Take a running job's key changes from `at` up to `until`, each at its own instant."""
        while True:
            self.policy.on_key_change(job, at)
            self._rekey_running(job, at)  # which sets the job's next one
            due = self._idle_at.get(job.seq)
            if due is None or due[0] > until or self._timer_version[job.seq] != due[1]:
                return
            at = due[0]

    def _catch_up(self, job: Job, now: float) -> None:
        """Before a running job stops or changes outside a round: take its key changes that
        came due before `now` while no job waited, as the rounds they did not wake would have."""
        due = self._idle_at.pop(job.seq, None)
        if due is not None and due[0] < now and self._timer_version.get(job.seq) == due[1]:
            self._take_idle(job, due[0], math.nextafter(now, -math.inf))

    def _next_wake(self, now: float) -> float | None:
        version = self._timer_version
        while self._timers and version.get(self._timers[0][1]) != self._timers[0][2]:
            heapq.heappop(self._timers)
        wake = self._timers[0][0] if self._timers else math.inf
        idle = self._idle_timers
        if self._pending:  # a running job's key change matters only while a job waits
            while idle and version.get(idle[0][1]) != idle[0][2]:
                heapq.heappop(idle)
            if idle:
                wake = min(wake, idle[0][0])
        if self._asks_wakes:
            wake = self._earliest_wake(wake, now)
        return wake if wake < math.inf else None

    def _earliest_wake(self, wake: float, now: float) -> float:
        """The earliest of `wake` and every running job's `Policy.wakes_at`, as the policy's
        owner asks them at each of its events. Only the jobs whose bound lies before the earliest
        found so far are asked (each bound holds for the rest of the job's attempt): the same
        instant as asking every running job, for a handful of them."""
        bounds = self._wake_bounds
        policy = self.policy
        asked: list[tuple[float, int, int]] = []
        while bounds and bounds[0][0] < wake:
            _, seq, attempt = heapq.heappop(bounds)
            job = self._running_attempt(seq, attempt)
            if job is None:
                continue  # that attempt is over
            at = policy.wakes_at(job, now)
            wake = min(wake, at)
            asked.append((policy.wake_bound(job, now, at), seq, attempt))
        for entry in asked:
            heapq.heappush(bounds, entry)
        if len(bounds) > 2 * len(self._running.keys) + 64:  # drop the attempts that are over
            live: dict[int, float] = {}
            for bound, seq, attempt in bounds:
                if self._running_attempt(seq, attempt) is not None:
                    live[seq] = min(bound, live.get(seq, math.inf))
            self._wake_bounds = [
                (bound, seq, self._by_seq[seq].attempts) for seq, bound in live.items()
            ]
            heapq.heapify(self._wake_bounds)
        return wake

    def _running_attempt(self, seq: int, attempt: int) -> Job | None:
        """The job numbered `seq` if it is still running its attempt `attempt`, else None."""
        job = self._by_seq.get(seq)
        if job is None or job.status is not JobStatus.RUNNING or job.attempts != attempt:
            return None
        return job

    # -- reading the state --------------------------------------------------------------------

    def pending_jobs(self) -> Iterable[Job]:
        return (self._by_seq[key[-1]] for key in self._pending)

    def running_jobs(self) -> Iterable[Job]:
        return (self._by_seq[key[-1]] for key in self._running.keys)

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def counters(self) -> dict[str, int]:
        counters = {"preemptions": self.preemptions, **self.lifecycle.counters()}
        for stage in self.stages:
            counters.update(stage.counters())
        counters.update(self.admission.counters())
        return counters

    @property
    def running_count(self) -> int:
        return len(self._running.keys)

    def explain(self, job_id: str, now: float) -> str:
        """Why a job is where it is, in words a user understands."""
        job = self.jobs[job_id]
        if job.status is not JobStatus.PENDING:
            return f"{job.status.value}: {job.last_event}"
        position = self._pending.bisect_left(self._stored[job.seq])
        # What holds the job first (a listing that shortens the text keeps it), then its place
        # in the order: level, the policy's key, the admission's note.
        if self.blocked_by is not None and self.blocked_by != job.id and position > 0:
            cause = f"blocked behind job {self.blocked_by} ({self.policy.name} without backfill)"
        elif job.hold_until > now:  # counted down from `now`, not the last round's text
            cause = f"retry backoff: held for {job.hold_until - now:.0f} s more"
        elif job.hold_until and job.pending_reason.startswith("retry backoff"):
            cause = "retry backoff over: waiting for the next scheduling round"
        elif job.pending_reason == "not yet considered" and position > 0:
            cause = "behind higher-priority jobs"
        else:
            cause = job.pending_reason
        parts = [f"PENDING, position {position + 1} of {len(self._pending)} in the queue", cause]
        if job.spec.level:
            parts.append(f"level {job.spec.level}")
        priority = self.policy.describe_key(job, now)
        if priority:
            parts.append(priority)
        note = self.admission.describe(job)
        if note:
            parts.append(note)
        return "; ".join(parts)
