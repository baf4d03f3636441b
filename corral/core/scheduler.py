"""The scheduling core: the cluster, the jobs and the decisions, with no clock and no I/O.

The shell (the simulator's event loop, or the live control loop) tells the scheduler what happened
(`submit`, `finished`, `failed`, `cancel`) and calls `decide(now)`. Like Kubernetes's scheduler
"assuming" a pod bound before the bind completes, `decide` commits its choices to this state at
once (GPUs taken, jobs running or preempted) and returns the actions the shell must carry out.

`Scheduler` builds the round from its plugins and runs it: the timers due, the plugins' hooks at
the round's start, then the walk of the waiting queue (corral.core.walk), once per narrowing an
admission asks for. What it knows and how that changes is `SchedulerState` (corral.core.state).

A round repeats the last one when nothing it looks at changed since that one ended without an
action: the same walk would again do nothing and leave the same reasons (`_repeats`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

from corral.core.actions import Action, Decision
from corral.core.backfill import make_backfill
from corral.core.chain import AdmissionChain, as_chain
from corral.core.cluster import Cluster
from corral.core.job import JobStatus
from corral.core.lifecycle import Lifecycle
from corral.core.placement.base import Placement
from corral.core.plugin import PluginError, SpeedModel
from corral.core.policy.base import Policy
from corral.core.precheck import PreRuns
from corral.core.preempt import VICTIM_RULES, Preemption
from corral.core.protocol import Admission
from corral.core.reservations import Reservation, Reservations
from corral.core.retry import RetryOptions, RetryRule
from corral.core.stages import Stage
from corral.core.state import SchedulerState, StartHook
from corral.core.timers import Timers
from corral.core.walk import QueueWalk

__all__ = ["Scheduler", "StartHook"]

#: A plugin's hook at a round's start: (now, the round's actions) -> None.
RoundStart = Callable[[float, list[Action]], None]


class Scheduler(SchedulerState):
    def __init__(
        self,
        cluster: Cluster,
        policy: Policy,
        placement: Placement,
        *,
        backfill: str | bool = False,
        speed_model: SpeedModel | None = None,
        restore_s: float = 0.0,
        victims: str = "lowest",
        admission: Admission | Iterable[Admission] | None = None,
        on_start: StartHook | None = None,
        stages: Sequence[Stage] = (),
        retry: RetryRule | None = None,
        precheck_s: float | None = None,
        preempt_exempt_s: float = 0.0,
    ) -> None:
        """`backfill`: which later jobs pass a blocking policy's head (corral.core.backfill:
        none, greedy or easy; True is greedy, False none). `preempt_exempt_s`: a running job is no preemption victim until it has run this long
        since its last start (corral.core.preempt). `retry` judges failed attempts: the backoff before a retry and the user-error rule
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
        super().__init__(
            cluster,
            policy,
            placement,
            chain,
            stages,
            speed_model,
            restore_s,
            on_start,
            retry if retry is not None else RetryRule(RetryOptions()),
        )
        self._narrows = chain.having("walks")
        self._placement_plans = type(placement).begin_round is not Placement.begin_round
        #: GPUs claimed over time windows for some users or VCs (corral.core.reservations).
        self.reservations = Reservations(cluster, placement)
        #: Which later jobs pass a blocking policy's head (corral.core.backfill).
        self.backfill = make_backfill(backfill, cluster, placement, self.reservations)
        self._reserves = self.backfill.reserves and policy.blocking
        self.rounds = 0
        self.blocked_by: str | None = None
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
        #: When to look at a job again without being told (corral.core.timers).
        self.timers = Timers(
            self,
            policy,
            placement,
            self.lifecycle,
            self._by_seq,
            idle_when_running=self._may_repeat,
        )
        self._quiet_at = -math.inf  # that round's instant
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
            exempt_s=preempt_exempt_s,
        )
        self._exempts = preempt_exempt_s > 0
        if self._exempts:
            self._on_start = (*self._on_start, self.preemption.started)
        self.preemption.settle = self.timers.settle  # before it reads running jobs' keys
        if self.timers.holds:
            self.preemption.held_bound = self.timers.held_bound  # no, without taking them
        #: The body of a round (corral.core.walk).
        self._walk = QueueWalk(
            self,
            cluster,
            policy,
            placement,
            chain,
            self.preemption,
            self.stages,
            self._by_seq,
            self.backfill,
            late_preempt_check=self.timers.holds,
        )
        #: What runs as a round begins, before the walk (`_begin_round_hooks`).
        self._round_starts = self._begin_round_hooks(chain)
        self._running_left = self.preemption.running_left
        self._waiting_left = self.preemption.waiting_left
        self._running_rekeyed = self.preemption.rekeyed

    # -- deciding ---------------------------------------------------------------------------

    def decide(self, now: float, *, preempt: bool = True) -> Decision:
        """One scheduling round. With `preempt=False` it only starts jobs on free GPUs (a
        multi-tenant caller may first look for free GPUs elsewhere before preempting)."""
        self.rounds += 1
        actions: list[Action] = []
        self.timers.fire(now, actions)  # a pre-run that passes by its timer is stopped first
        quiet = self._quiet
        if self.timers.held_at and quiet is not None and (quiet[2] or self.pending):
            if quiet[2] or not self._held_below_waiting(now):
                self.timers.settle()  # re-keys held back may tell whether this round repeats
        if self._repeats(now, preempt) and not actions:
            return Decision(
                actions, self._next_wake(now), self._respeeds() if self._speed_changed else []
            )
        for begin in self._round_starts:
            begin(now, actions)
        if self._reserves:
            self.backfill.new_round()
        if self._narrows:
            # Quota: first only what fits within the VCs' quotas, then borrowers, then
            # opportunistic jobs on what is still idle (each walk narrowed by the admission).
            for _ in self.admission.walks():
                self._walk.walk(now, preempt, actions)
        self.preemption.tried = False
        self._walk.walk(now, preempt, actions)
        self._quiet = None
        if self._may_repeat and not actions:
            self._quiet = (self.cluster.version, preempt, self.preemption.tried)
            self._quiet_at = now
        return Decision(
            actions, self._next_wake(now), self._respeeds() if self._speed_changed else []
        )

    def _held_below_waiting(self, now: float) -> bool:
        """Every running job's key, as it is held now and once the key changes held back are
        taken (`Timers.held_bound`), sorts before every waiting job's: taking them would move no
        key past a waiting one, which keeps a quiet round that tried no placement
        (`rekey_each`, by whole keys)."""
        if self.policy.preempt_prefix is not None or not self._running.keys:
            return False
        bound = self.timers.held_bound(now)
        if bound is None:
            return False
        lowest = self._running.keys[-1]
        return (bound if bound > lowest else lowest) < self.pending[0]

    def _begin_round_hooks(self, chain: AdmissionChain) -> list[RoundStart]:
        """The plugins' hooks at a round's start, in order: every stage's `new_round`, every
        stage's `begin_round` (packing splits the pairs it measured not to gain), a placement
        that plans the round's jobs together, the admissions' `begin_round` (fair share's shares
        settle with time). Only the plugins that have such a hook are asked."""
        hooks = [_new_round(s) for s in self.stages if type(s).new_round is not Stage.new_round]
        hooks += [
            _begin_round(s, self)
            for s in self.stages
            if type(s).begin_round is not Stage.begin_round
        ]
        if self._placement_plans:
            hooks.append(self._plan_placement)
        hooks += [_admission_round(hook) for hook in chain.hooks("begin_round")]
        return hooks

    def _plan_placement(self, now: float, actions: list[Action]) -> None:
        self.placement.begin_round(
            self.cluster, self.pending_jobs(), self.running_jobs(), self.speed_model, now
        )

    def _repeats(self, now: float, preempt: bool) -> bool:
        """This round's walk would repeat the last round's, which did nothing: nothing changed
        since (no job queued, re-keyed where it matters, started or stopped, no GPU freed or
        taken), no waiting job is held by a retry backoff (its reason names the time left), and
        no running job started at that round's instant (it was no victim then, it is now), and
        no running job's preemption exemption ended since."""
        quiet = self._quiet
        return (
            quiet is not None
            and quiet[0] == self.cluster.version
            and quiet[1] == preempt
            and not self._held
            and self._last_start_at < self._quiet_at
            and not (self._exempts and self.preemption.exemption_ended(now))
            and not (
                self.reservations.items and self.reservations.boundary_between(self._quiet_at, now)
            )
        )

    def _next_wake(self, now: float) -> float | None:
        wake = self.timers.next_wake(now, bool(self.pending), len(self._running.keys))
        if self.reservations.items and self.pending:  # a window opens or closes: look again
            self.reservations.forget_ended(now)
            boundary = self.reservations.next_boundary(now)
            if boundary != math.inf:
                wake = boundary if wake is None else min(wake, boundary)
        if not self._exempts:
            return wake
        ends = self.preemption.next_exemption_end(now)  # a job may become a victim then
        if not self.pending or ends == math.inf:
            return wake
        return ends if wake is None else min(wake, ends)

    def reserve(self, reservation: Reservation) -> None:
        """Claim GPUs over a time window for some users or VCs (corral.core.reservations);
        ReservationError if it cannot be made so."""
        self.reservations.add(reservation)
        self._quiet = None

    def unreserve(self, name: str) -> Reservation:
        found = self.reservations.remove(name)
        self._quiet = None
        return found

    def start_defragmented(self, job_id: str, now: float) -> list[Action]:
        """Start a waiting job by the defragmenting stages (migration): the moves and the start,
        or [] when none could."""
        actions: list[Action] = []
        job = self.jobs[job_id]
        any(stage.try_start(self, job, now, actions) for stage in self._walk.defragmenters)
        return actions

    # -- reading the state ------------------------------------------------------------------

    def counters(self) -> dict[str, int]:
        counters = {"preemptions": self.preemptions, **self.lifecycle.counters()}
        for stage in self.stages:
            counters.update(stage.counters())
        counters.update(self.admission.counters())
        return counters

    def explain(self, job_id: str, now: float) -> str:
        """Why a job is where it is, in words a user understands."""
        job = self.jobs[job_id]
        if job.status is not JobStatus.PENDING:
            return f"{job.status.value}: {job.last_event}"
        position = self.pending.bisect_left(self._stored[job.seq])
        # What holds the job first (a listing that shortens the text keeps it), then its place
        # in the order: level, the policy's key, the admission's note.
        if self.blocked_by is not None and self.blocked_by != job.id and position > 0:
            cause = f"blocked behind job {self.blocked_by} ({self.policy.name} without backfill)"
        elif job.hold_until > now:  # counted down from `now`, not the last round's text
            cause = f"retry backoff: held for {job.hold_until - now:.0f} s more"
        elif job.hold_until and job.pending_reason.startswith("retry backoff"):
            cause = "retry backoff over: waiting for the next scheduling round"
        elif job.pending_reason == "not yet considered" and position > 0:
            # The queue is sorted by level first (higher first): the job at its head has the
            # highest level waiting. Jobs of the job's own level are ahead by the policy's order.
            if self.pending[0][0] < self._stored[job.seq][0]:
                cause = "behind higher-priority jobs"
            else:
                cause = f"behind jobs of the same priority ahead in the {self.policy.name} order"
        else:
            cause = job.pending_reason
        parts = [f"PENDING, position {position + 1} of {len(self.pending)} in the queue", cause]
        if job.spec.level:
            parts.append(f"level {job.spec.level}")
        priority = self.policy.describe_key(job, now)
        if priority:
            parts.append(priority)
        note = self.admission.describe(job)
        if note:
            parts.append(note)
        return "; ".join(parts)


def _new_round(stage: Stage) -> RoundStart:
    def begin(now: float, actions: list[Action]) -> None:
        stage.new_round()

    return begin


def _begin_round(stage: Stage, host: Scheduler) -> RoundStart:
    def begin(now: float, actions: list[Action]) -> None:
        stage.begin_round(host, now, actions)

    return begin


def _admission_round(hook: Callable[[float], None]) -> RoundStart:
    def begin(now: float, actions: list[Action]) -> None:
        hook(now)

    return begin
