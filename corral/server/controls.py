"""The live manager's job controls: hold, release, requeue, and the gates on when a job starts.

A job waits at a gate, outside the core, while it is held (`corral hold`), while a job it runs
`after` has not succeeded, or while its array has as many tasks in the core as its cap allows
(`array: "0-99%10"`). The gate lives in the shell: the core is given a job only once it is
eligible, as if it were submitted at that instant (its submit time kept, so a policy that keeps
arrival order puts it back in its place), and the core never knows gates exist. Each round
(`_open_gates`) the manager looks at the gated jobs in id order: a job whose gates are open is
given to the core (submitted, as if it arrived then, when it never ran, so that an admission
such as ElasticFlow's judges it, and may refuse it: REFUSED in the round's transaction; adopted
with its history otherwise); one whose dependency failed, was cancelled or refused fails at once
("dependency 12 failed") and never starts. What a gate needs survives a restart: `held_by`,
`array_id` and `array_index` are columns of the job's row, `after` is in its spec.

Requeue takes a running job out of the core (`SchedulerCore.withdraw`: GPUs freed, no
preemption counted), stops its attempt (outcome "requeued", its checkpoint kept) and queues it
again; a FAILED or CANCELLED job is queued again under its id, with a fresh `max_retries` budget
and `time_limit` (failures and run time reset; attempts, preemptions and the GPU time it
attained kept, so attempt numbers go on).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from corral.core.actions import Start
from corral.core.gates import ENDED, Gates, gate_order, gate_reason
from corral.core.job import Job, JobSpec, JobStatus
from corral.core.protocol import SchedulerCore
from corral.server.metrics import ManagerMetrics
from corral.server.spec import JobSpecModel, array_tasks, parse_job_spec, signal_before
from corral.server.state import Attempt, Executor
from corral.server.store import JobRow, Store
from corral.server.telemetry import Telemetry


class ControlError(ValueError):
    """A control refused (one line); `status` is the HTTP status the API answers with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class JobControls:
    """The part of `Manager` that holds, releases and requeues jobs and keeps the gates."""

    # The manager's state this part uses (Manager.__init__ sets it).
    store: Store
    executor: Executor
    clock: Callable[[], float]
    lock: threading.RLock
    scheduler: SchedulerCore
    telemetry: Telemetry
    metrics: ManagerMetrics
    _attempts: dict[str, Attempt]
    _draining: dict[tuple[str, int], tuple[int, ...]]
    _deferred: dict[str, Start]
    _spec_models: dict[str, JobSpecModel]
    _accounts: dict[str, str]
    _dirty: bool
    _wake: threading.Event
    metrics: ManagerMetrics

    if TYPE_CHECKING:  # the manager's own

        def _changing(self) -> AbstractContextManager[None]: ...
        def _save_progress(self, job: Job, **fields: object) -> None: ...
        def _forget(self, job_id: str) -> None: ...
        def _drop_deferred_start(self, job: Job) -> bool: ...
        def _touch_holders(self, job_id: str) -> None: ...
        def core_spec(
            self, model: JobSpecModel, job_id: str, submit_time: float, user: str
        ) -> JobSpec: ...

    def _init_controls(self) -> None:
        #: Jobs waiting at a gate, outside the core (with their history), by id.
        self._gated: dict[str, Job] = {}
        self._gate_reasons: dict[str, str] = {}
        self._held: dict[str, str] = {}  # job id -> who holds it
        #: Unfinished array tasks: job id -> (array id, index, cap on tasks in the core).
        self._array_of: dict[str, tuple[str, int, int | None]] = {}
        self._ended_status: dict[str, str] = {}  # jobs found ended in the store (dependencies)
        self._warned: set[tuple[str, int]] = set()  # attempts sent their signal_before_limit
        #: The jobs whose spec sets a `time_limit` or a `progress_timeout` (a
        #: `signal_before_limit` needs the first), in the order noted: the only ones the checks
        #: of limits look at (`_limited_attempts`), so that they cost nothing while none does.
        self._limited: dict[str, None] = {}

    def _reset_controls(self) -> None:
        """Before the state is rebuilt from the store (which holds every gate)."""
        self._gated.clear()
        self._gate_reasons.clear()
        self._held.clear()
        self._array_of.clear()
        self._ended_status.clear()
        self._limited.clear()

    # -- what the gates need ---------------------------------------------------------------------

    def _note_controls(self, row: JobRow, model: JobSpecModel) -> None:
        """Remember a stored job's gates (at submission, at a restart, at a requeue)."""
        if row.held_by is not None:
            self._held[row.id] = row.held_by
        if row.array_id is not None and model.array is not None:
            cap = array_tasks(model.array)[1]
            self._array_of[row.id] = (row.array_id, row.array_index or 0, cap)
        if model.time_limit is not None or model.progress_timeout is not None:
            self._limited[row.id] = None

    def _needs_gate(self, job_id: str) -> bool:
        model = self._spec_models.get(job_id)
        capped = job_id in self._array_of and self._array_of[job_id][2] is not None
        return job_id in self._held or capped or (model is not None and bool(model.after))

    def _status_of(self, job_id: str) -> str | None:
        job = self.scheduler.jobs.get(job_id)
        if job is not None:
            return job.status.value
        if job_id in self._gated:
            return "PENDING"
        found = self._ended_status.get(job_id)
        if found is None:
            row = self.store.get_job(job_id)
            if row is None:
                return None
            found = row.status
            if found in ENDED:
                self._ended_status[job_id] = found
        return found

    def _gate(self, job_id: str, in_core: Counter[str]) -> tuple[str | None, bool]:
        """Why the job still waits at a gate (None: it may be queued), and whether that is the
        end of it (a dependency that will never succeed): corral.core.gates, which the
        simulator's replay of an exported history asks too."""
        model = self._spec_models[job_id]
        array = self._array_of.get(job_id)
        gates = Gates(
            after=tuple(map(str, model.after)),
            array=None if array is None else array[0],
            cap=None if array is None else array[2],
        )
        return gate_reason(self._held.get(job_id), gates, self._status_of, in_core)

    def _open_gates(self, now: float) -> None:
        """Queue the gated jobs whose gates are open, in id order; fail those whose dependency
        failed. Called before each round's decision."""
        if not self._gated:
            return
        in_core = Counter(
            array for job_id, (array, _, _) in self._array_of.items() if job_id not in self._gated
        )
        for job_id in gate_order(self._gated):
            reason, fails = self._gate(job_id, in_core)
            if fails:
                assert reason is not None
                spec = self._gated.pop(job_id).spec
                self.store.update_job(job_id, status="FAILED", finished_at=now, reason=reason)
                self.store.add_event(job_id, now, "failed", f"{reason}; never started")
                self.metrics.finished.labels(spec.vc, spec.user, "FAILED").inc()
                self._ended_status[job_id] = "FAILED"
                self._forget(job_id)
                continue
            if reason is not None:
                if self._gate_reasons.get(job_id) != reason:
                    self.store.update_job(job_id, reason=reason)
                self._gate_reasons[job_id] = reason
                continue
            job = self._gated.pop(job_id)
            self._gate_reasons.pop(job_id, None)
            if job.attempts:  # it ran before: queued again with its history
                self.scheduler.adopt(job, now)
                self._touch_holders(job_id)  # (its last attempt may still be stopping)
            else:  # it never ran: queued as if submitted now (ElasticFlow's admission judges it)
                job = self.scheduler.submit(job.spec, now)
                if job.status is JobStatus.REFUSED:
                    self._refused_at_gate(job, now)
                    continue
            if job_id in self._array_of:
                in_core[self._array_of[job_id][0]] += 1
            self._dirty = True

    def _refused_at_gate(self, job: Job, now: float) -> None:
        """The core refused a job whose gate opened: stored REFUSED in the round's transaction."""
        self.store.update_job(job.id, status="REFUSED", finished_at=now, reason=job.last_event)
        self.store.add_event(job.id, now, "refused", job.last_event)
        self.metrics.finished.labels(job.spec.vc, job.spec.user, "REFUSED").inc()
        self._ended_status[job.id] = "REFUSED"
        self._forget(job.id)

    def gate_reason(self, job_id: str) -> str | None:
        """Why a gated job waits (None: it is not gated)."""
        if job_id not in self._gated:
            return None
        if job_id in self._held:
            return f"held by {self._held[job_id]}"
        return self._gate_reasons.get(job_id, "waiting at a gate: checked at the next round")

    def _cancel_gated(self, job_id: str, now: float) -> None:
        """Cancel a job waiting at a gate (the core does not hold it): written first."""
        spec = self._gated[job_id].spec
        with self.store.batch():
            self.store.update_job(
                job_id, status="CANCELLED", finished_at=now, reason="cancelled by request"
            )
            self.store.add_event(job_id, now, "cancelled", "cancelled by request")
        self.metrics.finished.labels(spec.vc, spec.user, "CANCELLED").inc()
        del self._gated[job_id]
        self._ended_status[job_id] = "CANCELLED"
        self._forget(job_id)
        self._dirty = True

    def _forget_controls(self, job_id: str) -> None:
        self._gated.pop(job_id, None)
        self._gate_reasons.pop(job_id, None)
        self._held.pop(job_id, None)
        self._array_of.pop(job_id, None)
        self._limited.pop(job_id, None)

    def _limited_attempts(self) -> list[tuple[str, Attempt]]:
        """The running attempts whose job sets a time limit or a progress timeout: the fewer of
        the jobs that set one and the running attempts is looked through (none while no job
        sets one)."""
        if not self._limited:
            return []
        if len(self._limited) < len(self._attempts):
            return [
                (job_id, attempt)
                for job_id in self._limited
                if (attempt := self._attempts.get(job_id)) is not None
            ]
        return [(job_id, a) for job_id, a in self._attempts.items() if job_id in self._limited]

    def array_members(self, array_id: str) -> list[str]:
        """The unfinished tasks of an array, in index order."""
        with self.lock:
            tasks = [(i, j) for j, (a, i, _) in self._array_of.items() if a == array_id]
            return [job_id for _, job_id in sorted(tasks)]

    # -- hold and release ------------------------------------------------------------------------

    def hold(self, job_id: str, user: str) -> None:
        """Keep a pending job from starting until released (durable: written first). A
        ControlError (409) for a job that is not pending."""
        with self._changing():
            self._hold_locked(job_id, user, self.clock())

    def _hold_locked(self, job_id: str, user: str, now: float) -> None:
        job = self.scheduler.jobs.get(job_id)
        queued = job is not None and job.status is JobStatus.PENDING
        if job_id not in self._gated and not queued:
            status = job.status.value if job is not None else self._status_of(job_id)
            if job_id in self._deferred or status == "RUNNING":
                status = "RUNNING"
            if status != "PENDING":
                raise ControlError(409, f"job {job_id} is {status}: only a pending job can be held")
        if job_id not in self._held:
            with self.store.batch():
                self.store.update_job(job_id, held_by=user, reason=f"held by {user}")
                self.store.add_event(job_id, now, "held", f"held by {user}")
            self._held[job_id] = user
        if queued and job_id not in self._gated:
            self._gated[job_id] = self.scheduler.withdraw(job_id, now)
            self._touch_holders(job_id)  # (a preempted attempt may still be stopping)
            self._dirty = True

    def release(self, job_id: str, user: str) -> None:
        """Let a held job start again (in its place, where the policy keeps arrival order)."""
        with self._changing():
            self._release_locked(job_id, user, self.clock())
        self._wake.set()

    def _release_locked(self, job_id: str, user: str, now: float) -> None:
        if job_id not in self._held:
            raise ControlError(409, f"job {job_id} is not held")
        with self.store.batch():
            self.store.update_job(job_id, held_by=None, reason="released")
            self.store.add_event(job_id, now, "released", f"released by {user}")
        del self._held[job_id]
        self._dirty = True

    # -- requeue ---------------------------------------------------------------------------------

    def requeue(self, job_id: str, user: str) -> None:
        """A running job: stopped (its attempt "requeued", not a failure) and queued again. A
        FAILED or CANCELLED job: PENDING again under its id. Others: ControlError (409)."""
        stop: tuple[str, int] | None = None
        with self._changing():  # (a failed write rebuilds memory from the store)
            now = self.clock()
            job = self.scheduler.jobs.get(job_id)
            status = job.status.value if job is not None else self._status_of(job_id)
            reason = f"requeued by {user}"
            if status == "RUNNING" and job is not None:
                job = self.scheduler.withdraw(job_id, now)
                self._touch_holders(job_id)
                with self.store.batch():
                    if not self._drop_deferred_start(job):
                        attempt = self._attempts.pop(job_id)
                        self.telemetry.unwatch(job_id, now)
                        self._draining[(job_id, attempt.number)] = attempt.gpus
                        self.store.update_attempt(
                            job_id, attempt.number, state="stopping", outcome="requeued"
                        )
                        stop = (job_id, attempt.number)
                    self._save_progress(job, status="PENDING", reason=reason)
                    self.store.add_event(job_id, now, "requeued", reason)
                self._gated[job_id] = job
            elif status in ("FAILED", "CANCELLED"):
                row = self.store.get_job(job_id)
                assert row is not None
                if job is not None:  # the core still knows it, ended: forgotten first
                    self.scheduler.withdraw(job_id, now)
                    self._touch_holders(job_id)  # (a cancelled one may still be stopping)
                model = parse_job_spec(row.spec)
                self._spec_models[job_id] = model
                if row.unix_user is not None:
                    self._accounts[job_id] = row.unix_user
                self._note_controls(row, model)
                self._ended_status.pop(job_id, None)
                fresh = Job(
                    spec=self.core_spec(model, job_id, row.submitted_at, row.user),
                    attempts=row.attempts,
                    preemptions=row.preemptions,
                    attained_gpu_s=row.attained_gpu_s,
                    first_started_at=row.started_at,
                )
                with self.store.batch():
                    self.store.update_job(
                        job_id,
                        status="PENDING",
                        finished_at=None,
                        exit_code=None,
                        failures=0,
                        executed_s=0.0,
                        reason=reason,
                    )
                    self.store.add_event(job_id, now, "requeued", f"{reason} (was {status})")
                self._gated[job_id] = fresh
            elif status is None:
                raise ControlError(404, f"no job {job_id}")
            else:
                raise ControlError(
                    409,
                    f"job {job_id} is {status}: only a running, failed or cancelled job can be "
                    "requeued",
                )
            self._dirty = True
            if stop is not None:
                self.executor.stop(*stop)
        self._wake.set()

    # -- signal_before_limit ---------------------------------------------------------------------

    def _warn_before_limits(self, now: float, limited: list[tuple[str, Attempt]]) -> None:
        """Send each running attempt whose job asks for it its `signal_before_limit`, once, that
        many seconds before its time limit (`limited`: the `_limited_attempts`)."""
        for job_id, attempt in limited:
            model = self._spec_models.get(job_id)
            if model is None or model.signal_before_limit is None or model.time_limit is None:
                continue
            key = (job_id, attempt.number)
            if key in self._warned:
                continue
            number, before = signal_before(model)  # type: ignore[misc]
            ran = self.scheduler.jobs[job_id].executed_at(now)
            if ran < model.time_limit - before:
                continue
            self._warned.add(key)
            self.executor.signal(job_id, attempt.number, number)
            name = model.signal_before_limit.partition("@")[0]
            self.store.add_event(
                job_id,
                now,
                "signal",
                f"sent {name} to attempt {attempt.number}: {model.time_limit - ran:.0f} s before "
                f"its time limit",
            )
