"""ElasticFlow (Gu et al., "ElasticFlow: An Elastic Serverless Training Platform for Distributed
Deep Learning", ASPLOS'23): elastic jobs with deadlines, admission control, resizing.

A job names its work and a deadline; the scheduler chooses how many GPUs it runs on and may change
that between attempts: a resize is a checkpoint-restart (`Preempt`, then `Start` on the new count,
which restores the checkpoint; the work done is kept). From the paper's design (§4):

* **Scaling curve.** A job's throughput on g GPUs comes from an injected `throughput(job, g)` (the
  simulator reads Gavel's measured table). Counts are powers of two, as the paper's buddy
  placement wants, plus the count the job asked for; a count not faster than a smaller one is
  never used (Gavel measured some models slower on 4 GPUs than on 2).
* **Minimum satisfactory share.** The fewest GPUs with which a job meets its deadline. With
  several jobs what matters is the GPUs left over time: jobs are planned in deadline order on a
  profile of free GPUs over time, each running at every instant on the fastest useful count within
  min(its cap, what is free) until it is done, a change of count costing a restore; its share is
  the smallest cap that ends by the deadline. The paper plans on time slots; this plan is the same
  in continuous time, with breakpoints where planned jobs end.
* **Admission control.** A job is admitted only if, planned with every admitted job, all of them
  still meet their deadlines; otherwise it is refused at once (`JobStatus.REFUSED`) and never runs.
* **Allocation.** Each admitted job gets its share for now; GPUs left over go one step at a time
  (to its next useful count) to the job whose throughput gains most per extra GPU, relative to its
  per-GPU throughput at its smallest count (diminishing returns).

Choices of this implementation. Jobs without a deadline, and admitted jobs that can no longer meet
theirs (restore stalls, a spread placement), are best effort: no share, planned after the others,
GPUs only from the leftover. Re-planning happens at every event (arrival, end), so a running job
keeps its count when the shares leave room for it, grows only when the time saved exceeds the
restore it costs, and shrinks only when other jobs' shares need its GPUs. Placement is corral's
(`Placement`, largest jobs first): when free GPUs are too scattered for a share, running jobs are
migrated out of the way (Gandiva's migration, core.migration), else the job takes fewer GPUs of its
curve. One GPU type per cluster.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from corral.core.actions import Action, Decision, Preempt
from corral.core.cluster import Cluster
from corral.core.job import Job, JobSpec, JobStatus
from corral.core.migration import Migration
from corral.core.placement.base import Placed, Placement
from corral.core.plugin import SpeedModel
from corral.core.policy.base import Policy
from corral.core.policy.edf import ElasticFlowOrder, deadline_of
from corral.core.refusal import JobRefused, refuse_new
from corral.core.reservations import Reservation, ReservationError
from corral.core.retry import FailureReport, RetryRule
from corral.core.scheduler import Scheduler
from corral.core.statement import Statement

#: A job's training throughput on a number of GPUs, consolidated, in any unit (only ratios matter).
Throughput = Callable[[Job, int], float]

_SLACK_S = 1e-6  # finishing this close after the deadline still counts as on time


@dataclass(slots=True, frozen=True)
class Curve:
    """The GPU counts worth using for one job, ascending, each faster than every smaller one, with
    the speed there in ideal seconds of work per wall second (1.0 at the count it asked for)."""

    sizes: tuple[int, ...]
    speeds: tuple[float, ...]


def allowed_sizes(min_gpus: int, max_gpus: int, base_gpus: int) -> list[int]:
    """Powers of two between min and max, and the count the job asked for."""
    sizes = {base_gpus} if min_gpus <= base_gpus <= max_gpus else set()
    size = 1
    while size <= max_gpus:
        if size >= min_gpus:
            sizes.add(size)
        size *= 2
    return sorted(sizes)


def scaling_curve(
    job: Job,
    throughput: Throughput,
    capacity: int,
    placed_speed: Callable[[int], float] | None = None,
) -> Curve:
    """The job's useful counts up to `capacity`; a fixed-size job has only its own.
    `placed_speed(g)`, when given, is the factor a placement of g GPUs costs it (GPU type, spread
    over nodes when g is larger than a node): the plan must count on the speed it will get."""
    elastic = job.spec.elastic
    if elastic is None:
        return Curve((job.spec.gpus,), (1.0,)) if job.spec.gpus <= capacity else Curve((), ())
    reference = throughput(job, elastic.base_gpus)
    if not reference > 0:
        raise ValueError(
            f"job {job.id}: throughput on its {elastic.base_gpus} GPUs must be positive, got {reference}"
        )
    sizes: list[int] = []
    speeds: list[float] = []
    for size in allowed_sizes(elastic.min_gpus, min(elastic.max_gpus, capacity), elastic.base_gpus):
        speed = throughput(job, size) / reference
        if placed_speed is not None:
            speed *= placed_speed(size)
        if speed > (speeds[-1] if speeds else 0.0):
            sizes.append(size)
            speeds.append(speed)
    return Curve(tuple(sizes), tuple(speeds))


@dataclass(slots=True, frozen=True)
class Demand:
    """What the planner needs to know of one admitted job."""

    job_id: str
    deadline: float  # inf: no deadline
    work_s: float  # ideal seconds of work left
    curve: Curve
    running_gpus: int = 0  # its current count, 0 when it is not running
    stall_s: float = 0.0  # restore still ahead of it on its current count
    restore_s: float = 0.0  # no work for this long after a resume or a resize
    ran_before: bool = False  # a start (not a first start) resumes from a checkpoint
    best_effort: bool = False  # planned after every job that can meet its deadline

    def delay_s(self, gpus: int) -> float:
        if self.running_gpus and gpus == self.running_gpus:
            return self.stall_s
        return self.restore_s if self.running_gpus or self.ran_before else 0.0


@dataclass(slots=True, frozen=True)
class Share:
    """One job's part of a plan."""

    min_share: int  # the cap it was planned with: the fewest GPUs that meet its deadline
    now_gpus: int  # GPUs the plan gives it from now (0: later, once earlier deadlines are served)
    finish: float  # when it ends under the plan
    feasible: bool  # it meets its deadline


class _FreeProfile:
    """Free GPUs over time from `now`: free[i] holds on [times[i], times[i+1]), the last for ever."""

    def __init__(self, now: float, capacity: int) -> None:
        self.times = [now]
        self.free = [capacity]

    def simulate(
        self, demand: Demand, cap: int, until: float = math.inf
    ) -> tuple[float, list[tuple[int, int]]]:
        """Run the job with at most `cap` GPUs on what is free: its finish time and the
        (segment, GPUs) it holds; inf when it has not finished by `until`, or when the last
        segment leaves too little for it. Every change of its count is a restart: it holds its
        GPUs and does no work for `restore_s`."""
        left = demand.work_s
        sizes, speeds = demand.curve.sizes, demand.curve.speeds
        times, free = self.times, self.free
        last = len(times) - 1
        held: list[tuple[int, int]] = []
        stall_end = -math.inf
        for index, begin in enumerate(times):
            if begin > until:
                break
            pick = bisect.bisect_right(sizes, cap if cap < free[index] else free[index]) - 1
            if pick < 0:
                continue
            gpus, speed = sizes[pick], speeds[pick]
            if not held:
                stall_end = begin + demand.delay_s(gpus)
            elif held[-1][0] != index - 1 or held[-1][1] != gpus:
                stall_end = begin + demand.restore_s
            held.append((index, gpus))
            working_from = begin if begin > stall_end else stall_end
            end = times[index + 1] if index < last else math.inf
            if end > working_from:
                can_do = speed * (end - working_from)
                if left <= can_do:
                    return working_from + left / speed, held
                left -= can_do
        return math.inf, held

    def reserve(self, held: list[tuple[int, int]], finish: float) -> None:
        times, free = self.times, self.free
        held = [(index, gpus) for index, gpus in held if times[index] < finish]
        if not held:
            return
        last = held[-1][0]
        if finish < math.inf and (last + 1 == len(times) or times[last + 1] > finish):
            times.insert(last + 1, finish)
            free.insert(last + 1, free[last])
        for index, gpus in held:
            free[index] -= gpus

    def min_share(self, demand: Demand) -> tuple[int, float, list[tuple[int, int]]] | None:
        """The smallest cap that meets the deadline (index in the curve, finish, holdings), or
        None. Counts slower than the work over the time left cannot; over the others that need a
        restart a bigger cap is never slower, so a binary search finds it; the count a running
        job has now needs no restart and is tried on its own."""
        sizes, speeds = demand.curve.sizes, demand.curve.speeds
        deadline = demand.deadline + _SLACK_S
        time_left = deadline - self.times[0]
        if time_left <= 0:
            return None

        def meets(index: int) -> tuple[float, list[tuple[int, int]]] | None:
            finish, held = self.simulate(demand, sizes[index], until=deadline)
            return (finish, held) if finish <= deadline else None

        needed = demand.work_s / time_left
        candidates = [
            i for i, size in enumerate(sizes) if size != demand.running_gpus and speeds[i] >= needed
        ]
        best: tuple[int, float, list[tuple[int, int]]] | None = None
        if candidates:
            found = meets(candidates[-1])
            if found is not None:
                low, high = 0, len(candidates) - 1
                best = (candidates[high], *found)
                while low < high:
                    middle = (low + high) // 2
                    trial = meets(candidates[middle])
                    if trial is None:
                        low = middle + 1
                    else:
                        high = middle
                        best = (candidates[middle], *trial)
        if demand.running_gpus in sizes:
            current = sizes.index(demand.running_gpus)
            if (best is None or current < best[0]) and speeds[current] >= needed:
                kept = meets(current)
                if kept is not None:
                    best = (current, *kept)
        return best


def plan(demands: Iterable[Demand], capacity: int, now: float) -> dict[str, Share]:
    """Each job's share. Jobs are planned in deadline order at their minimum satisfactory share;
    those that cannot meet their deadline, and best-effort ones, afterwards on what is left, in
    deadline order, at their largest count."""
    profile = _FreeProfile(now, capacity)
    shares: dict[str, Share] = {}
    after: list[Demand] = []
    for demand in sorted(demands, key=lambda d: (d.best_effort, d.deadline)):
        if demand.best_effort or not demand.curve.sizes:
            after.append(demand)
            continue
        found = profile.min_share(demand)
        if found is None:
            after.append(demand)
            continue
        index, finish, held = found
        profile.reserve(held, finish)
        now_gpus = held[0][1] if held and held[0][0] == 0 else 0
        shares[demand.job_id] = Share(demand.curve.sizes[index], now_gpus, finish, True)
    for demand in sorted(after, key=lambda d: d.deadline):
        if not demand.curve.sizes:
            shares[demand.job_id] = Share(0, 0, math.inf, False)
            continue
        cap = demand.curve.sizes[-1]
        finish, held = profile.simulate(demand, cap)
        profile.reserve(held, finish)
        now_gpus = held[0][1] if held and held[0][0] == 0 else 0
        shares[demand.job_id] = Share(cap, now_gpus, finish, finish <= demand.deadline + _SLACK_S)
    return shares


@dataclass(slots=True)
class _Elastic:
    """What the elastic scheduler keeps per admitted job."""

    curve: Curve
    best_effort: bool
    share: Share | None = None


@dataclass(slots=True)
class ElasticCounters:
    admitted: int = 0
    refused: int = 0
    refused_alone: int = 0  # of those, jobs that could not meet their deadline on an empty cluster
    grows: int = 0
    shrinks: int = 0
    suspensions: int = 0  # running jobs stopped because earlier deadlines needed all their GPUs
    refusals: dict[str, str] = field(default_factory=dict)


class ElasticScheduler:
    """The scheduler interface (`submit`, `decide`, `finished`, `failed`, `cancel`, `explain`)
    with ElasticFlow's admission control and allocation, over a `Scheduler` that keeps the jobs'
    state (queues in deadline order, GPUs, attempts, work) and carries out starts and stops."""

    name = "elasticflow"

    def __init__(
        self,
        cluster: Cluster,
        placement: Placement,
        throughput: Throughput,
        *,
        speed_model: SpeedModel | None = None,
        restore_s: float = 0.0,
        policy: Policy | None = None,
        migrate: bool = True,
        retry: RetryRule | None = None,
    ) -> None:
        """`speed_model` gives a job's speed on its GPUs at the count it asked for (GPU type,
        spread); the scheduler multiplies it by the job's scaling curve at the count it runs on.
        `migrate`: when free GPUs are too scattered for a job's share, move running jobs out of
        the way (Gandiva's migration, core.migration) before trying fewer GPUs."""
        self.cluster = cluster
        self.placement = placement
        self.throughput = throughput
        self.restore_s = restore_s
        self.capacity = cluster.total_gpus
        self.speed_model = speed_model
        # The first g of these GPUs are a placement as consolidated as g GPUs can be.
        self._packed_gpus = tuple(g for gpus in cluster.node_gpus for g in gpus)

        def speed(job: Job, gpus: tuple[int, ...]) -> float:
            base = speed_model(job, gpus) if speed_model is not None else 1.0
            return base * self._relative_speed(job, len(gpus))

        self.migration = Migration() if migrate else None
        self.inner = Scheduler(
            cluster,
            policy or ElasticFlowOrder(),
            placement,
            speed_model=speed,
            restore_s=restore_s,
            stages=[self.migration] if self.migration is not None else [],
            retry=retry,
        )
        self.policy = self.inner.policy
        self.jobs: dict[str, Job] = {}
        self._elastic: dict[str, _Elastic] = {}
        self.tally = ElasticCounters()
        self.rounds = 0

    # -- the scheduler interface ------------------------------------------------------------

    @property
    def preemptions(self) -> int:
        return self.inner.preemptions

    @property
    def pending_count(self) -> int:
        return self.inner.pending_count

    @property
    def running_count(self) -> int:
        return self.inner.running_count

    def _curve(self, job: Job) -> Curve:
        return scaling_curve(job, self.throughput, self.capacity, self._placed_speed(job))

    def refusal(self, spec: JobSpec) -> str | None:
        if not self._curve(Job(spec=spec, seq=len(self.jobs), queued_since=0.0)).sizes:
            smallest = spec.elastic.min_gpus if spec.elastic is not None else spec.gpus
            return f"needs at least {smallest} GPUs but the cluster has only {self.capacity} GPUs"
        return None

    def submit(self, spec: JobSpec, now: float) -> Job:
        refuse_new(self.jobs, spec)
        probe = Job(spec=spec, seq=len(self.jobs), queued_since=now)
        curve = self._curve(probe)
        if not curve.sizes:
            raise JobRefused(f"job {spec.id}: {self.refusal(spec)}")
        no_plan = spec.deadline is None or spec.duration_s is None
        if not no_plan:
            verdict = self._admission(probe, curve, now)
            if verdict is not None:
                refusal, alone = verdict
                self.tally.refused_alone += alone
                probe.status = JobStatus.REFUSED
                probe.finished_at = now
                probe.pending_reason = ""
                probe.last_event = f"refused: {refusal}"
                self.jobs[spec.id] = probe
                self.tally.refused += 1
                self.tally.refusals[spec.id] = refusal
                return probe
        self.tally.admitted += 1
        # No pre-run: ElasticFlow sizes and restarts every gang itself (see `progressed`).
        job = self.inner.submit(replace(spec, gpus=curve.sizes[-1], precheck_s=0.0), now)
        self.jobs[spec.id] = job
        self._elastic[spec.id] = _Elastic(curve, best_effort=no_plan)
        return job

    def decide(self, now: float) -> Decision:
        self.rounds += 1
        if self.migration is not None:
            self.migration.new_round()
        shares = self._plan(now)
        targets = self._allocate(shares, now)
        actions: list[Action] = []
        growing: list[Job] = []
        shrunk: list[Job] = []
        for job in list(self.inner.running_jobs()):
            target = targets[job.id]
            if target > job.gpus:
                growing.append(job)
            elif target < job.gpus:  # other jobs' shares need its GPUs
                before = job.gpus
                actions.append(self.inner.evict(job.id, now, by="elasticflow resize"))
                if target == 0:
                    self.tally.suspensions += 1
                    job.last_event = "suspended by elasticflow: earlier deadlines need its GPUs"
                else:
                    self.tally.shrinks += 1
                    job.last_event = f"shrunk from {before} to {target} GPUs by elasticflow"
                    shrunk.append(job)
        # Shrunk jobs first: the GPUs they just freed hold them (best fit keeps nodes packed).
        resized = {job.id for job in shrunk}
        wakes: list[float] = []
        held = [j for j in self.inner.pending_jobs() if j.hold_until > now]  # retry backoff
        for job in held:
            job.pending_reason = f"retry backoff: held for {job.hold_until - now:.0f} s more"
            wakes.append(job.hold_until)
        waiting = sorted(
            (
                j
                for j in self.inner.pending_jobs()
                if targets[j.id] > 0 and j.id not in resized and j.hold_until <= now
            ),
            key=lambda j: (-targets[j.id], deadline_of(j), j.seq),
        )
        for job in [*sorted(shrunk, key=lambda j: (-targets[j.id], j.seq)), *waiting]:
            actions.extend(self._place(job, targets[job.id], now))
            if job.status is JobStatus.PENDING:
                wakes.append(self.placement.changes_at(job, now))
        for job in sorted(growing, key=lambda j: (-targets[j.id], j.seq)):
            actions.extend(self._grow(job, targets[job.id], now))
        for job in self.inner.pending_jobs():
            if targets[job.id] == 0:
                job.pending_reason = "admitted; GPUs go first to jobs with earlier deadlines"
        wake = min((w for w in wakes if now < w < math.inf), default=None)
        return Decision(actions, wake)

    def finished(self, job_id: str, now: float) -> Job:
        return self._ended(self.inner.finished(job_id, now))

    def failed(self, job_id: str, now: float, report: FailureReport | str) -> Job:
        return self._ended(self.inner.failed(job_id, now, report))

    def progressed(self, job_id: str, now: float) -> Preempt | None:
        """A no-op (None): ElasticFlow runs no pre-runs. It chooses every job's GPU count and
        restarts jobs to resize them, so a one-worker start would be one more size its plan does
        not know; its jobs are submitted without one (`precheck_s` 0), and `build_scheduler`
        refuses a `precheck_s` default with this admission."""
        return self.inner.progressed(job_id, now)

    def node_failed(self, node: int, now: float) -> list[Job]:
        """As `Scheduler.node_failed`: the attempts on the node end as infrastructure failures
        (requeued, or ended by the retry rule) and its GPUs leave allocation until it recovers."""
        hit = self.inner.node_failed(node, now)
        for job in hit:
            self._ended(job)
        return hit

    def node_recovered(self, node: int) -> None:
        self.inner.node_recovered(node)

    def evict_node(self, node: int, now: float, by: str) -> list[Preempt]:
        """As `Scheduler.evict_node`: the jobs are planned again as they wait."""
        return self.inner.evict_node(node, now, by)

    def cancel(self, job_id: str, now: float) -> Job:
        if self.jobs[job_id].status is JobStatus.REFUSED:
            return self.jobs[job_id]
        return self._ended(self.inner.cancel(job_id, now))

    def explain(self, job_id: str, now: float) -> str:
        job = self.jobs[job_id]
        if job.status is JobStatus.REFUSED:
            return f"REFUSED: {job.last_event}"
        text = self.inner.explain(job_id, now)
        state = self._elastic.get(job_id)
        if state is None or state.share is None:
            return text
        if state.best_effort:
            late = job.spec.deadline is not None and job.spec.duration_s is not None
            return f"{text}; best effort ({'deadline out of reach' if late else 'no deadline'})"
        share = state.share
        return (
            f"{text}; minimum satisfactory share {share.min_share} GPUs, "
            f"{share.now_gpus} planned now, planned to end in {share.finish - now:.0f}s"
        )

    def adopt(self, job: Job, now: float) -> None:
        """Queue an admitted job with its history (a shell rebuilding the core)."""
        curve = self._curve(job)
        self.inner.adopt(job, now)
        self.jobs[job.id] = job
        no_plan = job.spec.deadline is None or job.spec.duration_s is None
        self._elastic[job.id] = _Elastic(curve, best_effort=no_plan)

    def withdraw(self, job_id: str, now: float) -> Job:
        """Take a job out (see SchedulerCore.withdraw); adopted again, it is planned anew. A
        refused job, which the inner scheduler never had, is only forgotten."""
        if self.jobs[job_id].status is JobStatus.REFUSED:
            return self.jobs.pop(job_id)
        job = self.inner.withdraw(job_id, now)
        del self.jobs[job_id]
        self._elastic.pop(job_id, None)
        return job

    def restore_running(
        self, job_id: str, gpus: tuple[int, ...], started_at: float, now: float
    ) -> Job:
        return self.inner.restore_running(job_id, gpus, started_at, now)

    def reserve(self, reservation: Reservation) -> None:
        raise ReservationError(
            "reservations: not with admission elasticflow (it sizes and places every gang itself)"
        )

    def unreserve(self, name: str) -> Reservation:
        raise ReservationError(f"name: no reservation {name!r}")

    def take_offline(self, gpus: Iterable[int]) -> None:
        self.inner.take_offline(gpus)

    def bring_online(self, gpus: Iterable[int]) -> None:
        self.inner.bring_online(gpus)

    def pending_jobs(self) -> Iterable[Job]:
        return self.inner.pending_jobs()

    def running_jobs(self) -> Iterable[Job]:
        return self.inner.running_jobs()

    def counters(self) -> dict[str, int]:
        counters = self.tally
        return {
            "preemptions": self.preemptions,
            "admitted": counters.admitted,
            "refused": counters.refused,
            "refused_alone": counters.refused_alone,
            "grows": counters.grows,
            "shrinks": counters.shrinks,
            "suspensions": counters.suspensions,
            **{
                name: self.inner.counters()[name]
                for name in ("prechecks", "precheck_passed", "precheck_failed")
            },
            **({"migrations": self.migration.migrations} if self.migration is not None else {}),
        }

    def share_of(self, job_id: str) -> Share | None:
        """The job's part of the last plan (None before its first round, or once it ended)."""
        state = self._elastic.get(job_id)
        return None if state is None else state.share

    # -- planning ---------------------------------------------------------------------------

    def _placed_speed(self, job: Job) -> Callable[[int], float] | None:
        speed_model = self.speed_model
        if speed_model is None:
            return None
        return lambda gpus: speed_model(job, self._packed_gpus[:gpus])

    def _relative_speed(self, job: Job, gpus: int) -> float:
        elastic = job.spec.elastic
        if elastic is None or gpus == elastic.base_gpus:
            return 1.0
        return self.throughput(job, gpus) / self.throughput(job, elastic.base_gpus)

    def _demand(self, job: Job, state: _Elastic, now: float) -> Demand:
        running = job.status is JobStatus.RUNNING
        return Demand(
            job_id=job.id,
            deadline=deadline_of(job),
            work_s=job.remaining_work_s(now),
            curve=state.curve,
            running_gpus=job.gpus if running else 0,
            stall_s=max(0.0, job.stall_until - now) if running else 0.0,
            restore_s=self.restore_s,
            ran_before=job.attempts > 0,
            best_effort=state.best_effort,
        )

    def _admitted(self) -> list[tuple[Job, _Elastic]]:
        return [(self.jobs[job_id], state) for job_id, state in self._elastic.items()]

    def _plan(self, now: float) -> dict[str, Share]:
        """Plan the admitted jobs; those that cannot meet their deadline become best effort (the
        plan already put them after the others)."""
        shares = self._demote_late(now)
        for job_id, share in shares.items():
            self._elastic[job_id].share = share
        return shares

    def _demote_late(self, now: float) -> dict[str, Share]:
        """Plan the admitted jobs and make those that can no longer meet their deadline best
        effort."""
        demands = [self._demand(job, state, now) for job, state in self._admitted()]
        shares = plan(demands, self.capacity, now)
        for demand in demands:
            if not demand.best_effort and not shares[demand.job_id].feasible:
                self._elastic[demand.job_id].best_effort = True
        return shares

    def _admission(self, job: Job, curve: Curve, now: float) -> tuple[str, bool] | None:
        """None to admit the job, else why not and whether it could not make it even alone:
        planned with the admitted jobs, it and every admitted job that could make it without it
        must meet their deadlines."""
        assert job.spec.deadline is not None
        new = Demand(job.id, job.spec.deadline, job.remaining_work_s(now), curve)

        def check() -> tuple[bool, list[str]]:
            demands = [self._demand(other, state, now) for other, state in self._admitted()]
            shares = plan([*demands, new], self.capacity, now)
            broken = [
                d.job_id for d in demands if not d.best_effort and not shares[d.job_id].feasible
            ]
            return shares[job.id].feasible, broken

        fits, broken = check()
        if fits and not broken:
            return None
        if broken:  # those that are late even without it become best effort
            self._demote_late(now)
            fits, broken = check()
            if fits and not broken:
                return None
        if not plan([new], self.capacity, now)[job.id].feasible:
            return (
                f"its deadline (in {job.spec.deadline - now:.0f}s) cannot be met even on "
                f"{curve.sizes[-1]} GPUs of an empty cluster",
                True,
            )
        if not fits:
            return "too few GPUs free before its deadline once admitted jobs get theirs", False
        return f"admitting it would make {len(broken)} admitted job(s) miss their deadlines", False

    def _allocate(self, shares: dict[str, Share], now: float) -> dict[str, int]:
        """GPUs per admitted job now: its share; running jobs keep their size where the shares
        leave room; the rest one step at a time by marginal return."""
        targets = {
            job_id: 0 if self._elastic[job_id].best_effort else share.now_gpus
            for job_id, share in shares.items()
        }
        free = self.capacity - sum(targets.values())
        running = sorted(self.inner.running_jobs(), key=lambda j: (deadline_of(j), j.seq))
        for job in running:
            extra = job.gpus - targets[job.id]
            if 0 < extra <= free:
                targets[job.id] = job.gpus
                free -= extra
        steps: list[tuple[float, float, int, str, int]] = []

        def offer(job: Job) -> None:
            state = self._elastic[job.id]
            step = self._next_step(job, state.curve, targets[job.id], now)
            if step is not None:
                gain, size = step
                heapq.heappush(steps, (-gain, deadline_of(job), job.seq, job.id, size))

        for job, _ in self._admitted():
            offer(job)
        while steps and free > 0:
            _, _, _, job_id, size = heapq.heappop(steps)
            extra = size - targets[job_id]
            if extra > free:
                continue  # free GPUs only go down: it will not fit later in this round either
            targets[job_id] = size
            free -= extra
            offer(self.jobs[job_id])
        return targets

    def _next_step(self, job: Job, curve: Curve, gpus: int, now: float) -> tuple[float, int] | None:
        """(throughput gained per extra GPU, relative to the job's per-GPU throughput at its
        smallest count; the next useful count), or None if it cannot or should not grow."""
        index = bisect.bisect_right(curve.sizes, gpus)
        if index >= len(curve.sizes):
            return None
        size, speed = curve.sizes[index], curve.speeds[index]
        before = curve.speeds[index - 1] if index > 0 and curve.sizes[index - 1] == gpus else 0.0
        if gpus and before == 0.0:
            return None  # not on its curve (cannot happen for counts the plan chose)
        if job.status is JobStatus.RUNNING and gpus == job.gpus:
            work = job.remaining_work_s(now)
            if self.restore_s + work / speed >= work / before:
                return None  # the restart would cost more time than the extra GPUs save
        unit = curve.speeds[0] / curve.sizes[0]
        return (speed - before) / (size - gpus) / unit, size

    # -- carrying it out --------------------------------------------------------------------

    def _place(self, job: Job, target: int, now: float) -> list[Action]:
        """Start the job on `target` GPUs, migrating running jobs out of the way if its GPUs are
        too scattered, else on fewer of its counts."""
        curve = self._elastic[job.id].curve
        reason = ""
        actions: list[Action] = []
        for size in reversed([s for s in curve.sizes if s <= target]):
            if job.gpus != size:
                self.inner.set_gpus(job.id, size, now)
            result = self.placement.place(self.cluster, job, now)
            if isinstance(result, Placed):
                actions.append(self.inner.start_placed(job.id, result, now))
                return actions
            if size == target and self.migration is not None:
                actions.extend(self.inner.start_defragmented(job.id, now))
                if job.status is JobStatus.RUNNING:
                    return actions
            reason = result.reason
        job.pending_reason = f"admitted for {target} GPUs; {reason}"
        return actions

    def _grow(self, job: Job, target: int, now: float) -> list[Action]:
        """Restart a running job on more GPUs if a placement holds it there (consolidated, as a
        job that has just started to wait); if none does, it keeps running as it is."""
        curve = self._elastic[job.id].curve
        statement = Statement(self.cluster)  # its GPUs, as if free, while the sizes are tried
        statement.free(job)
        placed: Placed | None = None
        for size in reversed([s for s in curve.sizes if job.gpus < s <= target]):
            probe = Job(spec=replace(job.spec, gpus=size), seq=job.seq, queued_since=now)
            result = self.placement.place(self.cluster, probe, now)
            if isinstance(result, Placed):
                placed = result
                break
        statement.discard()  # the resize below stops and starts it through the scheduler
        if placed is None:
            return []
        before = job.gpus
        stop = self.inner.evict(job.id, now, by="elasticflow resize")
        self.inner.set_gpus(job.id, len(placed.gpus), now)
        start = self.inner.start_placed(job.id, placed, now)
        self.tally.grows += 1
        job.last_event = f"grown from {before} to {job.gpus} GPUs by elasticflow"
        return [stop, start]

    def _ended(self, job: Job) -> Job:
        if job.status.finished:
            self._elastic.pop(job.id, None)
            if job.spec.elastic is not None:  # reports show the count it asked for
                job.spec = replace(job.spec, gpus=job.spec.elastic.base_gpus)
        return job


__all__ = [
    "Curve",
    "Demand",
    "ElasticScheduler",
    "Share",
    "Throughput",
    "allowed_sizes",
    "plan",
    "scaling_curve",
]
