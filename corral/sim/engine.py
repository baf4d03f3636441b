"""Discrete-event simulation: replay a trace through the scheduling core in virtual time.

Events are arrivals (read in order from the sorted trace), attempt ends (finish or failure), the
scheduler's own timers (LAS queue crossings, starvation promotions, relax deadlines, retry
backoffs) and, with `node_failures`, nodes failing and recovering. An attempt's end is re-timed
when the job's speed changes mid-attempt (Decision.respeeds: packed jobs). All events at one
instant are applied, then the scheduler decides once. Nothing ticks per second, and a run is
deterministic for a given seed.

A failed attempt is reported to the core with a signature; the core's `RetryRule` decides the
backoff before the retry and whether the job ends (`corral.core.retry`). Failures are drawn by
`FailureModel` (`--failure-rate`: random, each failure unlike the last) or `PhillyFailures` (user
errors and infrastructure failures, `corral.sim.failures`); node failures by `NodeFailures`.
Each has its own random stream from the seed, so turning on one leaves the others' draws as
they were.

A job's pre-run (`Start.precheck`, corral.core.precheck) is an attempt like any other: the
failure models draw for it (on its one worker's GPUs), so a failure they place inside it happens
there. The job reports its first progress `precheck_report_s` after the attempt's start and
restore, and the simulator then calls `progressed`, which passes the pre-run (unless it failed,
ended or passed by the core's timer before).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from corral.core.actions import Action, Start
from corral.core.job import Job, JobSpec, JobStatus
from corral.core.nodes import (
    NodeChange,
    NodeDrains,
    absent_from_start,
    apply_change,
    node_index,
)
from corral.core.precheck import PrecheckState
from corral.core.protocol import SchedulerCore
from corral.core.retry import FailureReport
from corral.core.tracefile import JobReplay
from corral.sim.failures import AttemptFailure, NodeFailures, PhillyFailures
from corral.sim.replay import ReplayGates
from corral.sim.result import SimResult, Timeline

if TYPE_CHECKING:
    import numpy as np

_FINISH, _FAIL, _TIMER, _NODE_DOWN, _NODE_UP, _PROGRESS, _HOLD, _NODE_CHANGE = range(8)

#: Seconds after an attempt's start and restore at which a simulated job first reports progress
#: (`--precheck-report-s`): the retry rule's `fast_fail_s` default, the window corral already
#: counts a failure in as early. An assumption, not a measurement.
DEFAULT_PRECHECK_REPORT_S = 60.0

#: Spawn keys of the random streams drawn from the seed besides the job-failure one (which is
#: `default_rng(seed)`, as it always was).
_NODE_STREAM, _JOB_PROPERTY_STREAM, _PRERUN_STREAM = 1, 2, 3


def _stream(seed: int, key: int | None = None) -> np.random.Generator:
    """The run's random stream `key` of its seed (None: `default_rng(seed)` itself); numpy is
    imported here, when a run first draws."""
    import numpy as np

    if key is None:
        return np.random.default_rng(seed)
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(key,)))


class RoundObserver(Protocol):
    """Looks at the cluster after each round (a fragmentation probe, corral.sim.fragmentation)."""

    def after_round(self, now: float, arrived: Sequence[Job]) -> None:
        """A round at `now` is done; `arrived`: the jobs submitted at this instant, in order
        (each placed or not; with `place_or_fail`, one not placed is already given up)."""
        ...


@dataclass(slots=True, frozen=True)
class FailureModel:
    """Per-attempt failures that grow with job size, retried up to a limit as Philly did.

    An attempt of a job on g GPUs fails with probability min(cap, rate x (1 + log2 g)), at a time
    drawn uniformly over what the attempt would have run; the work of a failed attempt is lost.
    """

    rate: float
    max_retries: int = 3
    cap: float = 0.9

    def probability(self, gpus: int) -> float:
        return min(self.cap, self.rate * (1.0 + math.log2(gpus)))

    def draw(
        self, gpus: int, attempt: int, runs_for: float, rng: np.random.Generator
    ) -> AttemptFailure | None:
        """Whether the attempt that would run `runs_for` seconds fails, and when. Each failure
        has its own signature (the attempt's number): they are random, not a user error that
        repeats, so only `max_retries` ends a job for them."""
        if rng.random() < self.probability(gpus):
            reason = "simulated failure"
            return AttemptFailure(runs_for * rng.random(), reason, f"{reason} (attempt {attempt})")
        return None


def drained_idle(scheduler: SchedulerCore, drains: NodeDrains) -> int:
    """GPUs of held-out nodes (drained, unhealthy, absent) that no job runs on (held out of
    allocation, not in use)."""
    cluster = scheduler.cluster
    used = {g for job in scheduler.running_jobs() for g in job.placement}
    return sum(
        1
        for node in cluster.nodes
        if drains.holds(node.name)
        for g in cluster.node_gpus[node.index]
        if g not in used
    )


class Simulation:
    def __init__(
        self,
        jobs: Iterable[JobSpec],
        scheduler: SchedulerCore,
        *,
        failures: FailureModel | PhillyFailures | None = None,
        node_failures: NodeFailures | None = None,
        seed: int = 0,
        measured: set[str] | None = None,
        on_progress: Callable[[int, int], None] | None = None,
        options: dict[str, object] | None = None,
        place_or_fail: bool = False,
        observer: RoundObserver | None = None,
        precheck_report_s: float = DEFAULT_PRECHECK_REPORT_S,
        record_decisions: bool = False,
        on_end: Callable[[Job], None] | None = None,
        on_decision: Callable[[float, Action], None] | None = None,
        keep_ended: bool = True,
        timeline: Timeline | None = None,
        replay: Mapping[str, JobReplay] | None = None,
        node_changes: Sequence[NodeChange] = (),
    ) -> None:
        """Replay `jobs` through `scheduler` (any `SchedulerCore`: corral.core.framework builds
        them). `failures` draws the attempts that fail (and sets every job's `max_retries` to its
        own); `node_failures` makes nodes fail and recover. With `place_or_fail`, a job the
        round at its arrival does not start is given up at once (cancelled: FGD's experiment,
        where a task is placed when it arrives or fails); `observer` looks at every round.
        `precheck_report_s`: when, after its start and restore, an attempt first reports
        progress (`progressed`: what passes a pre-run). `record_decisions`: keep every Start and
        Preempt in the result (`SimResult.decisions`, to compare with a live manager's; off by
        default: a long trace's decisions cost memory).

        Streaming, for traces larger than memory: `jobs` may be any iterable in submission
        order (a generator, a streamed reader), read as the run reaches each arrival (a list or
        other sequence is sorted first, as always). `on_end` is called with each job as it ends
        (its result is final then: write it out), `on_decision` with each Start and Preempt as
        it is decided, and with `keep_ended=False` the job is then
        dropped from the core and from this engine, so that the run holds only the jobs still
        waiting or running (`SimResult.jobs` then lists only those). `timeline` records the
        rounds instead of a `Timeline` that keeps every point (`TimelineTotals` keeps sums).

        `replay`: what a live manager decided each job's fate from besides its spec (a corral
        trace's `JobReplay`s, by job id): gates, holds, failed attempts and restores are then
        replayed (corral.sim.replay; `self.gates.notes`: what it could not replay).

        `node_changes`: operators' drains and resumes of nodes (a live manager's, from its
        trace, or a cluster config's maintenance windows), each applied at its instant
        (corral.core.nodes): a drained node starts nothing new, a drain with `preempt` preempts
        its attempts at once."""
        if not precheck_report_s > 0:
            raise ValueError(f"precheck_report_s must be positive, got {precheck_report_s}")
        self.precheck_report_s = precheck_report_s
        self.node_changes = list(node_changes)
        self.drains = NodeDrains()
        self.record_decisions = record_decisions
        self.on_end = on_end
        self.on_decision = on_decision
        self.keep_ended = keep_ended
        self.timeline = timeline
        #: The trace when it is streamed (read in `run`); `specs` is then empty.
        self.stream: Iterable[JobSpec] | None = None
        if isinstance(jobs, Sequence):
            if failures is not None:
                jobs = [replace(spec, max_retries=failures.max_retries) for spec in jobs]
            self.specs = sorted(jobs, key=lambda s: s.submit_time)
        else:
            if isinstance(failures, PhillyFailures):
                raise ValueError("Philly failures draw per job from the whole trace: pass a list")
            self.specs = []
            self.stream = jobs
        self.cluster = scheduler.cluster
        self.scheduler = scheduler
        self.failures = failures
        self.node_failures = node_failures
        # The random streams, each made when first drawn from (numpy is imported then: a run
        # without failures never imports it): job failures (`rng`, the stream it always was),
        # pre-run attempts' (their own stream, so that turning pre-runs on leaves the draws of
        # the other attempts a sequence of the same numbers) and nodes' (`node_rng`).
        self.seed = seed
        self._rng: np.random.Generator | None = None
        self._prerun_rng: np.random.Generator | None = None
        self._node_rng: np.random.Generator | None = None
        #: Seconds after an attempt's start at which each job's user error shows (PhillyFailures).
        self.user_errors: dict[str, float] = {}
        if isinstance(failures, PhillyFailures):
            property_rng = _stream(seed, _JOB_PROPERTY_STREAM)
            self.user_errors = failures.user_errors(self.specs, property_rng)
        #: (time, node, True: failed / False: recovered), in order, as the run applied them.
        self.node_log: list[tuple[float, int, bool]] = []
        self.measured = measured
        self.on_progress = on_progress
        self.options = options or {}
        self.place_or_fail = place_or_fail
        self.observer = observer
        #: Jobs given up because they could not be placed when they arrived (place_or_fail).
        self.unplaced = 0
        self.gates: ReplayGates | None = None
        if replay:
            ids = {spec.id for spec in self.specs}
            self.gates = ReplayGates(replay, scheduler, trace_ids=ids)

    @property
    def rng(self) -> np.random.Generator:
        """Job failures' random stream."""
        if self._rng is None:
            self._rng = _stream(self.seed)
        return self._rng

    @property
    def prerun_rng(self) -> np.random.Generator:
        """Pre-run attempts' failures' random stream."""
        if self._prerun_rng is None:
            self._prerun_rng = _stream(self.seed, _PRERUN_STREAM)
        return self._prerun_rng

    @property
    def node_rng(self) -> np.random.Generator:
        """Node failures' and recoveries' random stream."""
        if self._node_rng is None:
            self._node_rng = _stream(self.seed, _NODE_STREAM)
        return self._node_rng

    def _draw_failure(self, job: Job, runs_for: float, prerun: bool) -> AttemptFailure | None:
        """How the attempt the job just started fails, if it does (a pre-run: on its one
        worker's GPUs, the job's spec during its pre-run)."""
        failures = self.failures
        if failures is None:
            return None
        rng = self.prerun_rng if prerun else self.rng
        if isinstance(failures, PhillyFailures):
            user_error = self.user_errors.get(job.id)
            return failures.draw(job.spec.gpus, job.attempts, runs_for, user_error, rng)
        return failures.draw(job.spec.gpus, job.attempts, runs_for, rng)

    def _arrivals(self) -> Iterator[JobSpec]:
        """The jobs in submission order (a stream is checked to be in that order)."""
        if self.stream is None:
            yield from self.specs
            return
        failures = self.failures
        last = -math.inf
        for spec in self.stream:
            if spec.submit_time < last:
                raise ValueError(
                    f"job {spec.id}: a streamed trace must be in submission order "
                    f"(submitted at {spec.submit_time} after a job submitted at {last})"
                )
            last = spec.submit_time
            if failures is not None:
                spec = replace(spec, max_retries=failures.max_retries)
            yield spec

    def run(self) -> SimResult:
        started = time.perf_counter()
        scheduler = self.scheduler
        cluster = self.cluster
        arrivals = self._arrivals()
        upcoming = next(arrivals, None)  # the next job to arrive
        arrived_count = 0
        total = len(self.specs) if self.stream is None else None
        node_failures = self.node_failures
        events: list[tuple[float, int, int, str, int]] = []
        order = 0
        job_events = 0  # events in the heap other than node ones, stale ones included
        timers: set[float] = set()
        # The end event that counts for each running job (its order), and, if it is a failure,
        # when and how: a speed change re-times the end, and stale events are skipped.
        end_order: dict[str, int] = {}
        fails_at: dict[str, float] = {}
        failing: dict[str, AttemptFailure] = {}
        down: set[int] = set()  # nodes that failed and have not recovered yet
        offline_gpus = 0
        failed_attempts = infra_failed_attempts = 0
        lost_infra_s = 0.0  # GPU-seconds lost to failures of the infrastructure
        timeline = self.timeline if self.timeline is not None else Timeline()
        decisions: list[tuple[float, Action]] = []  # every Start and Preempt, in order
        ended = 0
        end_totals = EndTotals()  # of the jobs dropped as they ended, then of those kept
        measured_left = len(self.measured) if self.measured is not None else -1
        progress_every = max(1, total // 200) if total is not None else 1000
        watched = self.place_or_fail or self.observer is not None  # the arrivals of each round

        gates = self.gates
        core_restore_s = float(getattr(scheduler, "restore_s", 0.0))
        if gates is not None:
            for at, job_id, held in gates.events():
                order += 1
                job_events += 1
                heapq.heappush(events, (at, order, _HOLD, job_id, int(held)))

        drains = self.drains
        for number, change in enumerate(self.node_changes):  # the number: which change it is
            node_index(cluster, change.node)  # UnknownNode, naming it, before the run
            order += 1
            heapq.heappush(events, (change.at, order, _NODE_CHANGE, "", number))
        for name in sorted(absent_from_start(self.node_changes)):  # joined later
            drains.mark_absent(scheduler, name, True)

        if node_failures is not None:
            for node in range(len(cluster.nodes)):
                order += 1
                up_for = node_failures.up_for(self.node_rng)
                heapq.heappush(events, (up_for, order, _NODE_DOWN, "", node))

        def count_end(job: Job) -> None:
            nonlocal ended, measured_left
            ended += 1
            if gates is not None:
                gates.ended(job)
            if self.measured is not None and job.id in self.measured:
                measured_left -= 1
            if self.on_progress is not None and ended % progress_every == 0:
                self.on_progress(ended, total if total is not None else arrived_count)
            if self.on_end is not None:
                self.on_end(job)
            if not self.keep_ended:  # its result is out: neither the core nor we keep it
                end_totals.add(job)
                scheduler.withdraw(job.id, job.finished_at or 0.0)
                end_order.pop(job.id, None)
                fails_at.pop(job.id, None)
                failing.pop(job.id, None)

        def lose_attempt(job: Job, infrastructure: bool, lost_before: float) -> None:
            """The attempt failed and the core judged it (it counts the GPU time lost,
            `Job.lost_gpu_s`, which was `lost_before` before)."""
            nonlocal failed_attempts, infra_failed_attempts, lost_infra_s
            failed_attempts += 1
            infra_failed_attempts += infrastructure
            if infrastructure:
                lost_infra_s += job.lost_gpu_s - lost_before

        wake_at: float | None = None  # the scheduler's last asked wake-up: any other is stale
        running = JobStatus.RUNNING  # (a local: a member looked up on its enum costs more)

        def stale(event: tuple[float, int, int, str, int]) -> bool:
            """An event that would change nothing: a wake-up the scheduler asked for before its
            last one, or the end (or progress) of an attempt that is over or was re-timed. A
            round is held only for an event that is not (a waiting scheduler may take a change
            of its queues at the next round that happens: corral.core.policy.base.rekey_wakes)."""
            at, event_order, kind, job_id, attempt = event
            if kind == _TIMER:
                return at != wake_at
            if kind in (_NODE_DOWN, _NODE_UP, _HOLD, _NODE_CHANGE):
                return False
            job = scheduler.jobs.get(job_id)
            if job is None or job.status is not running or job.attempts != attempt:
                return True
            return kind != _PROGRESS and end_order.get(job_id) != event_order

        while True:
            while events and stale(events[0]):
                at, _, kind, _, _ = heapq.heappop(events)
                job_events -= 1
                if kind == _TIMER:
                    timers.discard(at)
            arrival_at = upcoming.submit_time if upcoming is not None else math.inf
            event_at = events[0][0] if events else math.inf
            now = min(arrival_at, event_at)
            if now == math.inf or measured_left == 0:
                break
            if upcoming is None and ended == arrived_count:
                break  # only stale timers and node events are left
            if (
                node_failures is not None
                and upcoming is None
                and job_events == 0
                and not down
                and scheduler.running_count == 0
            ):
                break  # only node events are left: failing nodes cannot start a waiting job
            arrived_now: list[Job] = []  # with `watched`: this instant's arrivals
            while upcoming is not None and upcoming.submit_time <= now:
                if gates is not None and gates.arrive(upcoming, now):
                    arrived_count += 1  # it waits at a gate, outside the core
                    upcoming = next(arrivals, None)
                    continue
                arrived = scheduler.submit(upcoming, now)
                arrived_count += 1
                upcoming = next(arrivals, None)
                if watched:
                    arrived_now.append(arrived)
                if arrived.status.finished:  # refused at once by an admission control
                    ended += 1
                    measured_left -= self.measured is not None and arrived.id in self.measured
            while events and events[0][0] <= now:
                _, event_order, kind, job_id, attempt = heapq.heappop(events)
                if kind == _NODE_DOWN:
                    assert node_failures is not None
                    node = attempt
                    down.add(node)
                    offline_gpus += len(cluster.node_gpus[node])
                    self.node_log.append((now, node, True))
                    lost_by_id = {job.id: job.lost_gpu_s for job in scheduler.running_jobs()}
                    for job in scheduler.node_failed(node, now):
                        lose_attempt(job, True, lost_by_id[job.id])
                        if job.status.finished:  # the same fast failure again and again
                            count_end(job)
                    order += 1
                    back_at = now + node_failures.down_for(self.node_rng)
                    heapq.heappush(events, (back_at, order, _NODE_UP, "", node))
                    continue
                if kind == _NODE_CHANGE:
                    change = self.node_changes[attempt]
                    lost_by_id = {job.id: job.lost_gpu_s for job in scheduler.running_jobs()}
                    applied = apply_change(drains, scheduler, change, now)
                    for stop in applied.stops:
                        if self.record_decisions:
                            decisions.append((now, stop))
                        if self.on_decision is not None:
                            self.on_decision(now, stop)
                    for job in applied.failed:  # on a node found unhealthy: the infra's
                        if gates is not None:  # the live failure of this attempt, replayed now
                            gates.failed_by_node(job)
                        lose_attempt(job, True, lost_by_id[job.id])
                        if job.status.finished:
                            count_end(job)
                    for node in down:  # a resume gives back a dead node's GPUs: held again
                        scheduler.take_offline(cluster.node_gpus[node])
                    continue
                if kind == _NODE_UP:
                    assert node_failures is not None
                    node = attempt
                    down.discard(node)
                    offline_gpus -= len(cluster.node_gpus[node])
                    self.node_log.append((now, node, False))
                    scheduler.node_recovered(node)
                    order += 1
                    fails_at_next = now + node_failures.up_for(self.node_rng)
                    heapq.heappush(events, (fails_at_next, order, _NODE_DOWN, "", node))
                    continue
                job_events -= 1
                if kind == _TIMER:
                    timers.discard(now)
                    continue
                if kind == _HOLD:
                    assert gates is not None
                    if attempt:
                        gates.hold(job_id, now)
                    else:
                        gates.release(job_id, now)
                    continue
                found = scheduler.jobs.get(job_id)
                if found is None:
                    continue  # it ended and was dropped (keep_ended=False)
                job = found
                if job.status is not running or job.attempts != attempt:
                    continue  # the attempt this event belonged to was preempted
                if kind == _PROGRESS:  # its first progress report: a pre-run passes
                    scheduler.progressed(job_id, now)  # its Preempt needs nothing here
                    continue
                if end_order.get(job_id) != event_order:
                    continue  # re-timed after a speed change
                if kind == _FINISH:
                    scheduler.finished(job_id, now)
                else:
                    failure = failing.pop(job_id)
                    if gates is not None:
                        gates.failed(job)
                    lost_before = job.lost_gpu_s
                    scheduler.failed(
                        job_id,
                        now,
                        FailureReport(
                            failure.reason,
                            failure.infrastructure,
                            signature=failure.signature,
                            give_up=failure.give_up,
                        ),
                    )
                    lose_attempt(job, failure.infrastructure, lost_before)
                if job.status.finished:
                    count_end(job)

            if gates is not None:
                gates.open(now)
                while gates.failed_at_gate:  # a dependency failed in the replay: never started
                    stopped = scheduler.submit(gates.failed_at_gate.pop().spec, now)
                    if not stopped.status.finished:
                        scheduler.cancel(stopped.id, now)
                    stopped.last_event = "its dependency did not succeed in the replay"
                    count_end(stopped)
            if drains.held:
                drains.hold(scheduler)  # ends on drained nodes freed GPUs there
            decision = scheduler.decide(now)
            for action in decision.actions:
                if self.record_decisions:
                    decisions.append((now, action))
                if self.on_decision is not None:
                    self.on_decision(now, action)
                if isinstance(action, Start):
                    job = scheduler.jobs[action.job_id]
                    if gates is not None:
                        gates.started(job, action, now, core_restore_s)
                    runs_for = job.remaining_wall_s(now)
                    kind = _FINISH
                    drawn = (
                        self._draw_failure(job, runs_for, action.precheck)
                        if self.failures
                        else None
                    )
                    if gates is not None and drawn is None:
                        drawn = gates.failure(job)
                    if job.spec.time_limit_s is not None:
                        drawn = over_limit(job, now, runs_for, drawn)
                    if drawn is not None:
                        kind = _FAIL
                        runs_for = drawn.after_s
                        failing[job.id] = drawn
                    order += 1
                    job_events += 1
                    heapq.heappush(events, (now + runs_for, order, kind, job.id, job.attempts))
                    end_order[job.id] = order
                    if kind == _FAIL:
                        fails_at[job.id] = now + runs_for
                    elif fails_at:
                        fails_at.pop(job.id, None)
                        failing.pop(job.id, None)
                    if action.precheck:
                        order += 1
                        job_events += 1
                        reports_at = max(now, job.stall_until) + self.precheck_report_s
                        heapq.heappush(events, (reports_at, order, _PROGRESS, job.id, job.attempts))
                # A Preempt needs nothing here: the end event of its attempt is now stale.
            for respeed in decision.respeeds:  # the work left now takes another time
                job = scheduler.jobs[respeed.job_id]
                ends_at = now + job.remaining_wall_s(now)
                if fails_at.get(job.id, math.inf) <= ends_at:
                    continue  # it still fails first, at the instant drawn when it started
                if job.limit_left_s(now) < ends_at - now:  # now past its time limit
                    limit = over_limit(job, now, ends_at - now, None)
                    assert limit is not None
                    order += 1
                    job_events += 1
                    heapq.heappush(
                        events, (now + limit.after_s, order, _FAIL, job.id, job.attempts)
                    )
                    end_order[job.id] = order
                    fails_at[job.id] = now + limit.after_s
                    failing[job.id] = limit
                    continue
                fails_at.pop(job.id, None)
                failing.pop(job.id, None)
                order += 1
                job_events += 1
                heapq.heappush(events, (ends_at, order, _FINISH, job.id, job.attempts))
                end_order[job.id] = order
            if arrived_now:
                if self.place_or_fail:
                    for job in arrived_now:
                        if job.status is JobStatus.PENDING:
                            scheduler.cancel(job.id, now)
                            job.last_event = "given up: not placed when it arrived"
                            self.unplaced += 1
                            count_end(job)
                if self.observer is not None:
                    self.observer.after_round(now, arrived_now)
            elif self.observer is not None:
                self.observer.after_round(now, ())
            wake = wake_at = decision.wake_at
            if wake is not None and wake > now and wake not in timers:
                timers.add(wake)
                order += 1
                job_events += 1
                heapq.heappush(events, (wake, order, _TIMER, "", 0))
            free = cluster.free_gpus
            drained_gpus = drained_idle(scheduler, drains) if drains.held else 0
            timeline.record(
                now,
                # a dead node's GPUs, and a drained node's idle ones: not in use
                max(0, cluster.total_gpus - free - offline_gpus - drained_gpus),
                scheduler.pending_count,
                scheduler.running_count,
                free - cluster.free_in_whole_nodes(),
            )

        for job in scheduler.jobs.values():  # close the books of jobs still waiting at the end
            if job.status is JobStatus.PENDING and timeline.time_s:
                job.pending_s += max(0.0, timeline.time_s[-1] - job.queued_since)
        if self.on_progress is not None:
            self.on_progress(ended, total if total is not None else arrived_count)
        jobs = list(scheduler.jobs.values())
        for job in jobs:
            end_totals.add(job)
        annotations: dict[str, object] = {}
        if self.failures is not None or node_failures is not None:
            annotations = failure_summary(
                end_totals,
                node_failures=sum(failed for _, _, failed in self.node_log),
                failed_attempts=failed_attempts,
                infra_failed_attempts=infra_failed_attempts,
                lost_infra_gpu_s=lost_infra_s,
            )
        counters = scheduler.counters()
        if counters.get("prechecks"):
            annotations |= precheck_summary(end_totals, counters)
        return SimResult(
            policy=scheduler.policy.name,
            placement=scheduler.placement.name,
            cluster=cluster.describe(),
            total_gpus=cluster.total_gpus,
            jobs=jobs,
            measured=self.measured,
            timeline=timeline,
            preemptions=scheduler.preemptions,
            rounds=scheduler.rounds,
            wall_s=time.perf_counter() - started,
            options=self.options,
            annotations=annotations,
            decisions=decisions,
            gpu_names=cluster.gpu_names(),
        )


def over_limit(
    job: Job, now: float, runs_for: float, drawn: AttemptFailure | None
) -> AttemptFailure | None:
    """The attempt's failure: `drawn`, or its time limit where that comes first (the job ends
    FAILED, as the live manager stops a job past its `time_limit`)."""
    left = job.limit_left_s(now)
    if left >= runs_for or (drawn is not None and drawn.after_s <= left):
        return drawn
    limit = job.spec.time_limit_s
    return AttemptFailure(
        left, f"time limit: ran past its time_limit {limit:g} s", "time limit", give_up=True
    )


def failed_its_pre_run(job: Job) -> bool:
    """The job ended in its pre-run, never having passed it."""
    state = job.peek(PrecheckState)
    return job.status is JobStatus.FAILED and state is not None and not state.passed_by


@dataclass(slots=True)
class EndTotals:
    """The per-job parts of the failure and pre-run summaries: gathered from every job after
    the run, or as each job ends where the run drops ended jobs (and from those left)."""

    lost_gpu_s: float = 0.0  # GPU-seconds every failed attempt ran for nothing
    precheck_gpu_s: float = 0.0  # GPU-seconds the pre-run attempts held (passed or failed)
    user_error_jobs: int = 0
    lost_jobs: int = 0

    def add(self, job: Job) -> None:
        self.lost_gpu_s += job.lost_gpu_s
        state = job.peek(PrecheckState)
        if state is not None:
            self.precheck_gpu_s += state.gpu_s
        # Ended by the core's retry rule: the same fast failure again and again, or a failure
        # in its pre-run (`lost_jobs` when those failures were the infrastructure's).
        if (
            job.status is JobStatus.FAILED
            and job.failure_history
            and (
                job.failure_history[-1].infrastructure
                or job.failures <= job.spec.max_retries
                or failed_its_pre_run(job)
            )
        ):
            if job.failure_history[-1].infrastructure:
                self.lost_jobs += 1
            else:
                self.user_error_jobs += 1


def precheck_summary(totals: EndTotals, counters: dict[str, int]) -> dict[str, object]:
    """The summary entries of a run with pre-runs: jobs that started one, passed it, and were
    ended by a failure in it, and the GPU-hours the pre-run attempts held (passed or failed)."""
    return {
        "prechecks": counters["prechecks"],
        "precheck_passed": counters["precheck_passed"],
        "precheck_failed": counters["precheck_failed"],
        "precheck_gpu_hours": totals.precheck_gpu_s / 3600.0,
    }


def failure_summary(
    totals: EndTotals,
    *,
    node_failures: int,
    failed_attempts: int,
    infra_failed_attempts: int,
    lost_infra_gpu_s: float = 0.0,
) -> dict[str, object]:
    """The summary entries of a run with failures: node failures, failed attempts (those of
    the infrastructure apart), the GPU-hours their attempts ran for nothing (those lost to the
    infrastructure's failures apart, `lost_infra_gpu_s`), and the jobs the core's retry rule
    ended (`EndTotals`: `user_error_jobs`, and `lost_jobs` when those failures were the
    infrastructure's)."""
    return {
        "node_failures": node_failures,
        "failed_attempts": failed_attempts,
        "infra_failed_attempts": infra_failed_attempts,
        "gpu_hours_lost": totals.lost_gpu_s / 3600.0,
        "gpu_hours_lost_infra": lost_infra_gpu_s / 3600.0,
        "user_error_jobs": totals.user_error_jobs,
        "lost_jobs": totals.lost_jobs,
    }
