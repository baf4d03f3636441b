"""The live manager's recovery and node changes: the core's state rebuilt from the store.

On start, `recover` adopts every unfinished job the store holds and asks the executor about each
attempt the store calls running: alive (found again: `restore_running`), ended meanwhile (its end
is recorded), or never started (requeued). `resync` rebuilds the core the same way when a round
failed half-way, and `rebuild` does it on a new cluster when nodes joined or left
(`_refresh_nodes`, for a cluster whose nodes come and go). Until a node that left can be dropped
its free GPUs are held out of allocation (`_hold_unusable`), and so are the GPUs that an ended
attempt's leftover processes still use (`_hold_tainted`).
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Literal

from corral.core.actions import Start
from corral.core.cluster import Cluster, NodeDef
from corral.core.job import Job, JobSpec
from corral.core.precheck import PrecheckState, precheck_timeout, prerun_spec
from corral.core.profiles import Shape
from corral.core.protocol import SchedulerCore
from corral.core.retry import Failure, RetryRule
from corral.exec.local import AttemptEnded
from corral.server.holders import GpuHolders
from corral.server.metrics import ManagerMetrics
from corral.server.spec import JobSpecModel, parse_job_spec
from corral.server.state import Attempt, Executor, ManagerSettings, gpu_ids_by_name
from corral.server.store import AttemptRow, JobRow, Store
from corral.server.telemetry import Telemetry, progress_file

if TYPE_CHECKING:
    from pathlib import Path

#: How many attempts recovery asks the executor about at once.
FIND_THREADS = 16
#: What the executor finds of an attempt after a restart (Executor.recover).
Found = Literal["running", "never-started"] | AttemptEnded

log = logging.getLogger("corral.manager")


class Recovery:
    """The part of `Manager` that rebuilds the core from the store (`recover`, `resync`,
    `rebuild`) and follows the cluster's nodes and the GPUs held out of allocation."""

    # The manager's state this part uses (Manager.__init__ sets it).
    store: Store
    executor: Executor
    cluster: Cluster
    settings: ManagerSettings
    clock: Callable[[], float]
    lock: threading.RLock
    scheduler: SchedulerCore
    vc_quota: dict[str, int]
    _quota_follows_cluster: bool
    _pristine_cluster: Cluster
    _nodes: Callable[[], list[NodeDef]] | None
    _fixed_cluster: bool
    _gpu_ids: dict[str, int]
    _rebuilding: bool
    _unusable: set[str]
    _tainted: dict[tuple[str, int], tuple[int, ...]]
    metrics: ManagerMetrics
    _next_taint_check: float
    _attempts: dict[str, Attempt]
    _draining: dict[tuple[str, int], tuple[int, ...]]
    _holders: GpuHolders | None
    _deferred: dict[str, Start]
    _retrying: set[str]
    _spec_models: dict[str, JobSpecModel]
    _accounts: dict[str, str]
    _dirty: bool
    telemetry: Telemetry

    if TYPE_CHECKING:  # the manager's own, and the scheduler factory's

        def _make_scheduler(self) -> SchedulerCore: ...
        def shares_gpus(self) -> bool: ...
        def _note_holder(self, job_id: str, number: int, gpus: tuple[int, ...]) -> None: ...
        def _drop_holder(self, job_id: str, number: int) -> None: ...
        def record_nodes(self) -> None: ...
        def gpu_ids(self, names: Iterable[str | int]) -> tuple[int, ...]: ...
        def attempt_dir(self, job_id: str, attempt: int) -> Path: ...
        def _attempt_ended(self, end: AttemptEnded, now: float) -> None: ...
        def _save_progress(self, job: Job, **fields: object) -> None: ...
        def _forget(self, job_id: str) -> None: ...
        def _restore_cache_readers(self, now: float) -> None: ...
        def shape_of(self, job: Job, gpus: tuple[int, ...]) -> Shape: ...
        def _reset_controls(self) -> None: ...
        def _note_controls(self, row: JobRow, model: JobSpecModel) -> None: ...
        def _needs_gate(self, job_id: str) -> bool: ...

        _gated: dict[str, Job]

        def core_spec(
            self, model: JobSpecModel, job_id: str, submit_time: float, user: str
        ) -> JobSpec: ...

    # -- node changes -------------------------------------------------------------------------

    def _refresh_nodes(self) -> None:
        """Read the live nodes again; rebuild the cluster when they changed. A node that left
        stays (its free GPUs offline) until the executor has reported the end of every attempt
        that ran there, so that no job is requeued while a worker of it may still run."""
        assert self._nodes is not None
        try:
            live = self._nodes()
        except Exception as error:  # e.g. Ray's head is unreachable: keep what we know
            log.warning("cannot read the cluster's nodes: %s", error)
            return
        known = {c.name: (c.total_gpus, c.gpu_type) for c in self._pristine_cluster.nodes}
        shape = {node.name: (node.gpus, node.gpu_type) for node in live}
        if self._fixed_cluster:  # its nodes are held out while they are not live as declared
            missing = {name for name, declared in known.items() if shape.get(name) != declared}
            if missing != self._unusable:
                if missing:
                    log.warning("nodes not live as declared: %s", ", ".join(sorted(missing)))
                self._bring_back()
                self._unusable = missing
                self._hold_unusable()
            return
        if shape == known:
            self._bring_back()  # nodes held out came back before they were dropped
            return
        gone = {name for name in known if name not in shape}
        busy = {self.cluster.nodes[self.cluster.gpu_node[g]].name for g in self._busy_gpus()}
        if not live or gone & busy:
            # Keep the cluster until the executor has reported the end of every attempt that
            # ran on a node that left; nothing new starts on those nodes meanwhile.
            unusable = gone if live else set(known)
            if not live and unusable != self._unusable:
                log.warning("the cluster has no node with GPUs; nothing starts until one joins")
            self._bring_back()
            self._unusable = unusable
            self._hold_unusable()
            return
        log.info("nodes changed: %s", ", ".join(sorted(shape)))
        self._unusable = set()
        self.rebuild(Cluster.from_nodes(live))

    def _hold_unusable(self) -> None:
        """Keep the free GPUs of nodes that left out of allocation (again after each round's
        ends, which free GPUs there)."""
        if self._unusable:
            for node in self.cluster.nodes:
                if node.name in self._unusable:
                    self.scheduler.take_offline(self.cluster.node_gpus[node.index])

    def _bring_back(self) -> None:
        if self._unusable:
            for node in self.cluster.nodes:
                if node.name in self._unusable:
                    self.scheduler.bring_online(self.cluster.node_gpus[node.index])
            self._dirty = True
        self._unusable = set()

    def _hold_tainted(self, now: float) -> None:
        """GPUs still used by processes of ended attempts stay out of allocation; those whose
        processes are gone now come back."""
        if not self._tainted:
            return
        if now >= self._next_taint_check:
            self._next_taint_check = now + self.settings.node_check_s
            for (job_id, number), gpus in list(self._tainted.items()):
                left = self.executor.leftover(job_id, number, self.attempt_dir(job_id, number))
                if left == 0:
                    del self._tainted[(job_id, number)]
                    self.scheduler.bring_online(gpus)
                    self._dirty = True
                    with self.store.batch():
                        self.store.add_event(
                            job_id, now, "released", f"attempt {number}'s last processes are gone"
                        )
        for gpus in self._tainted.values():
            self.scheduler.take_offline(gpus)

    def _busy_gpus(self) -> set[int]:
        """GPUs whose processes may still run: live attempts and stopping ones."""
        busy = {g for attempt in self._attempts.values() for g in attempt.gpus}
        busy.update(g for gpus in self._draining.values() for g in gpus)
        return busy

    def rebuild(self, cluster: Cluster) -> None:
        """Take a new cluster (nodes joined or left) and rebuild the core's state on it."""
        with self.lock:
            self._pristine_cluster = copy.deepcopy(cluster)
            if self._quota_follows_cluster:
                self.vc_quota = {"default": cluster.total_gpus}
            self._rebuilding = True
            try:
                self.resync()
            finally:
                self._rebuilding = False
            self.record_nodes()  # for export-trace: the nodes jobs may run on from now

    def resync(self) -> None:
        """Rebuild the core's state from the store (as after a restart), when a round failed
        half-way and memory may disagree with what was committed."""
        with self.lock:
            self.cluster = copy.deepcopy(self._pristine_cluster)
            self._gpu_ids = gpu_ids_by_name(self.cluster)
            self.scheduler = self._make_scheduler()
            self._attempts.clear()
            self._draining.clear()
            self._deferred.clear()
            self._retrying.clear()
            self._reset_controls()
            self.recover()

    # -- recovery -----------------------------------------------------------------------------

    def recover(self) -> None:
        """Rebuild the core's state from the store after a (clean or abrupt) restart."""
        now = self.clock()
        with self.lock:
            unfinished = self.store.unfinished_jobs()
            found = self._find_attempts(unfinished, self.store.open_attempts_of_ended_jobs())
            with self.store.batch():
                self._recover_all(unfinished, found, now)

    def _find_attempts(
        self,
        unfinished: list[tuple[JobRow, list[AttemptRow]]],
        leftovers: list[tuple[str, AttemptRow]],
    ) -> dict[tuple[str, int], Found]:
        """What the executor finds of every attempt the store does not record as ended, asked
        before recovery's writes open their transaction: on Ray a lookup may take seconds, and
        a leader sharing PostgreSQL may not idle in a transaction that long (docs/ha.md)."""
        recorded = [(row.id, a) for row, attempts in unfinished for a in attempts] + leftovers
        wanted = [(job_id, a.number) for job_id, a in recorded if a.state != "ended"]
        if not wanted:
            return {}

        # Side by side: on Ray each lookup waits for its actors' answers, and an actor whose
        # worker is still starting answers only once it has started (seconds at load).
        with ThreadPoolExecutor(min(FIND_THREADS, len(wanted))) as pool:
            return dict(zip(wanted, pool.map(self._find, wanted), strict=True))

    def _find(self, key: tuple[str, int]) -> Found:
        job_id, number = key
        return self.executor.recover(job_id, number, self.attempt_dir(job_id, number))

    def _recover_all(
        self,
        unfinished: list[tuple[JobRow, list[AttemptRow]]],
        found: dict[tuple[str, int], Found],
        now: float,
    ) -> None:
        # Who holds which GPU, from what is found: kept on if GPUs may be shared here, or if
        # some are (attempts a manager that let jobs share GPUs started before its restart).
        self._holders = GpuHolders()
        for job_id, live in self._attempts.items():
            self._holders.add(job_id, live.number, live.gpus)
        for (job_id, number), gpus in self._draining.items():
            self._holders.add(job_id, number, gpus)
        for row, attempts in unfinished:
            try:
                self._recover_job(row, attempts, found, now)
            except (ValueError, KeyError) as error:  # its VC or spec is no longer valid
                self._unrecoverable(row, now, error)
        # Attempts of jobs that ended (cancelled, say) whose processes may still be stopping:
        # their GPUs are not free until they are gone, and the stop may never have been sent.
        # (Read again: a job failed just now, one that cannot be recovered, has them too.)
        for job_id, attempt in self.store.open_attempts_of_ended_jobs():
            key = (job_id, attempt.number)
            if key not in found:  # (its job ended after the lookups: asked now)
                found[key] = self._find(key)
            self._drain_leftover(job_id, attempt, found[key], now)
        self._restore_cache_readers(now)  # they read their data sets' directories
        if not self.shares_gpus() and not self._holders.shared:
            self._holders = None
        self._dirty = True
        # Every label set known now counts from 0 (a series first scraped at 0, not at its
        # first event: increase() and rate() see that event).
        waiting = (*self.scheduler.pending_jobs(), *self.scheduler.running_jobs())
        self.metrics.know_from(self.store, self.vc_quota, waiting)

    def _unrecoverable(self, row: JobRow, now: float, error: Exception) -> None:
        log.warning("job %s cannot be recovered: %s", row.id, error)
        if row.id in self.scheduler.jobs:  # adopted, then something else failed
            self.scheduler.cancel(row.id, now)
        attempt = self._attempts.pop(row.id, None)
        if attempt is not None:
            self._drop_holder(row.id, attempt.number)
        reason = f"could not be recovered after a restart: {error}"
        self.store.update_job(row.id, status="FAILED", finished_at=now, reason=reason)
        self.store.add_event(row.id, now, "failed", reason)
        self.metrics.finished.labels(row.vc, row.user, "FAILED").inc()

    def _known_gpus(self, names: Iterable[str | int]) -> tuple[int, ...]:
        return tuple(
            name if isinstance(name, int) else self._gpu_ids[name]
            for name in names
            if isinstance(name, int) or name in self._gpu_ids
        )

    def _recover_off_cluster(
        self, job: Job, row: AttemptRow, found: str | AttemptEnded, now: float
    ) -> None:
        """An attempt that ran on a node which has left: what may still run of it is stopped
        (its GPUs elsewhere stay held until it is gone), and the job waits for a new start."""
        number = row.number
        if found == "running":
            self._draining[(job.id, number)] = gpus = self._known_gpus(row.gpus)
            self._note_holder(job.id, number, gpus)
            self.executor.stop(job.id, number)
            if row.state != "stopping":
                reason = "lost: a node it ran on left the cluster"
                self.store.update_attempt(
                    job.id, number, state="stopping", outcome="lost", reason=reason
                )
        else:
            fields: dict[str, object] = {"state": "ended", "ended_at": now}
            if row.state != "stopping":
                fields.update(outcome="lost", reason="lost: a node it ran on left the cluster")
            if isinstance(found, AttemptEnded):
                fields.update(ended_at=found.ended_at, exit_code=found.exit_code)
                if row.state != "stopping" and found.exit_code == 0 and not found.stopped:
                    self.scheduler.cancel(job.id, now)  # out of the queue: it is done
                    self.store.update_attempt(
                        job.id, number, **(fields | {"outcome": "succeeded", "reason": ""})
                    )
                    self._save_progress(
                        job, status="SUCCEEDED", finished_at=now, exit_code=0, reason="succeeded"
                    )
                    self.store.add_event(job.id, now, "succeeded", f"attempt {number} exited 0")
                    self.metrics.finished.labels(job.spec.vc, job.spec.user, "SUCCEEDED").inc()
                    self._forget(job.id)
                    return
            self.store.update_attempt(job.id, number, **fields)
        if row.state != "stopping":
            self.metrics.failed(job.spec.vc, "infrastructure", retried=True)
            self.store.update_job(job.id, status="PENDING", reason="requeued: its node left")
            self.store.add_event(
                job.id, now, "requeued", f"attempt {number} ran on a node that left; requeued"
            )

    def _drain_leftover(self, job_id: str, row: AttemptRow, found: Found, now: float) -> None:
        if found == "running":
            self._draining[(job_id, row.number)] = gpus = self._known_gpus(row.gpus)
            self._note_holder(job_id, row.number, gpus)
            self.executor.stop(job_id, row.number)
            return
        fields: dict[str, object] = {"state": "ended", "ended_at": now}
        if isinstance(found, AttemptEnded):
            fields.update(ended_at=found.ended_at, exit_code=found.exit_code, reason=found.reason)
        self.store.update_attempt(job_id, row.number, **fields)

    def _recover_job(
        self,
        row: JobRow,
        attempts: list[AttemptRow],
        found: dict[tuple[str, int], Found],
        now: float,
    ) -> None:
        model = parse_job_spec(row.spec)
        self._spec_models[row.id] = model
        if row.unix_user is not None:
            self._accounts[row.id] = row.unix_user
        self._note_controls(row, model)  # held, array (corral.server.controls)
        spec = self.core_spec(model, row.id, row.submitted_at, row.user)
        refusal = self.scheduler.refusal(spec)  # e.g. its VC left the config
        # Too big for the nodes there are now: on a cluster whose nodes come and go, it waits.
        if refusal is not None and (self._nodes is None or spec.vc not in self.vc_quota):
            raise ValueError(refusal)
        job = Job(
            spec=spec,
            attempts=row.attempts,
            failures=row.failures,
            preemptions=row.preemptions,
            attained_gpu_s=row.attained_gpu_s,
            executed_s=row.executed_s,
            first_started_at=row.started_at,
        )
        self._recover_failures(job, attempts)
        self._recover_prerun(job, attempts)
        # A waiting job keeps the time it has waited (placement relaxes after a while), over a
        # restart and over a rebuild when nodes come or go.
        since = now
        if row.status == "PENDING":
            ends = [a.ended_at for a in attempts if a.ended_at is not None]
            since = min(now, max([row.submitted_at, *ends]))
        if all(a.state == "ended" for a in attempts) and self._needs_gate(row.id):
            self._gated[row.id] = job  # held, or waiting: queued when its gates open
            return
        self.scheduler.adopt(job, since)
        for attempt in attempts:
            if attempt.state != "ended":
                self._recover_attempt(job, attempt, found[(job.id, attempt.number)], now)

    def _recover_prerun(self, job: Job, attempts: list[AttemptRow]) -> None:
        """A job whose pre-run was running goes on with it (corral.core.precheck): the core is
        given the record it keeps, its own spec kept, the one-worker spec the job's. (A pre-run
        that passed, or ended otherwise, leaves the job to run its whole gang.)"""
        running = [a for a in attempts if a.prerun and a.state in ("starting", "running")]
        default = self.settings.scheduler.core.precheck_s
        timeout = precheck_timeout(job.spec, default)
        if not running or timeout is None:
            return
        state = job.record(PrecheckState)
        state.full, state.timeout_s, state.attempts = job.spec, timeout, 1
        job.spec = prerun_spec(job.spec)

    def _recover_failures(self, job: Job, attempts: list[AttemptRow]) -> None:
        """The failure history the backoff and the user-error rule count, from the attempts the
        store recorded; a job that failed last waits out its backoff as it would have."""
        history = [
            Failure(
                f"{a.exit_code}|{a.reason}",
                (a.ended_at or a.started_at) - a.started_at,
                infrastructure=a.outcome == "lost",
            )
            for a in attempts
            if a.outcome in ("failed", "lost") and a.reason != "never started"
        ]
        if not history:
            return
        job.failure_history = tuple(history)
        last = attempts[-1]
        if last.outcome in ("failed", "lost") and last.ended_at is not None:
            self._retrying.add(job.id)
            rule = RetryRule(self.settings.scheduler.section("retry"))
            job.hold_until = last.ended_at + rule.backoff(len(history))

    def _recover_attempt(self, job: Job, row: AttemptRow, found: Found, now: float) -> None:
        number = row.number
        started_at = row.started_at
        stopping = row.state == "stopping"
        try:
            gpus = self.gpu_ids(row.gpus)
        except KeyError:  # a node it ran on has left the cluster
            self._recover_off_cluster(job, row, found, now)
            return
        if found == "never-started":
            self.store.update_attempt(
                job.id, number, state="ended", outcome="lost", ended_at=now, reason="never started"
            )
            if not stopping:
                self.store.update_job(job.id, status="PENDING", reason="requeued after a restart")
                self.store.add_event(
                    job.id, now, "recovered", f"attempt {number} never started; requeued"
                )
            return
        if found == "running":
            if stopping:  # the stop may not have been sent before the crash: send it again
                self._draining[(job.id, number)] = gpus
                self._note_holder(job.id, number, gpus)
                self.executor.stop(job.id, number)
                return
            self.scheduler.restore_running(job.id, gpus, started_at, now)
            self._attempts[job.id] = Attempt(number, gpus, started_at)
            self._note_holder(job.id, number, gpus)
            if job.id not in self.telemetry.watches:  # (a rebuild keeps what it read)
                attempt_dir = self.attempt_dir(job.id, number)
                shape = self.shape_of(job, gpus)
                spec = self._spec_models.get(job.id)
                self.telemetry.watch(
                    job.id,
                    number,
                    progress_file(attempt_dir),
                    shape,
                    now,
                    resumed=True,
                    declared_total=spec is not None and spec.total_steps is not None,
                )
            if not self._rebuilding:  # a node joined or left: nothing to tell the job's owner
                self.store.add_event(job.id, now, "recovered", f"attempt {number} found running")
            return
        assert isinstance(found, AttemptEnded)
        if stopping:
            self.store.update_attempt(
                job.id,
                number,
                state="ended",
                ended_at=found.ended_at,
                exit_code=found.exit_code,
                reason=found.reason,
            )
            return
        # It ended while the manager was down: take it as running until then, then as ended.
        self.scheduler.restore_running(job.id, gpus, started_at, now)
        self._attempts[job.id] = Attempt(number, gpus, started_at)
        self._note_holder(job.id, number, gpus)
        self.store.add_event(
            job.id, now, "recovered", f"attempt {number} ended while the manager was down"
        )
        self._attempt_ended(found, now)
