"""The live manager's submission committer: jobs stored in groups, then queued.

The API's handlers call `submit` (or `submit_async`, on the event loop). Each checks the job against
the cluster's shape (`Scheduler.refusal`, no lock needed), gives it its id and puts it in an inbox.
One committing thread takes every submission that arrived meanwhile and, under the manager's lock,
stores them all and queues them in the core in one transaction (a job the core refuses at once,
ElasticFlow's admission, is stored as REFUSED in it), and only then answers the waiting requests:
an answer means stored. When that transaction fails, nothing is stored and the core, which may
have moved, is rebuilt from the store before it decides anything (`Manager._store_failed`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from corral.core.job import Job, JobSpec, JobStatus
from corral.core.protocol import SchedulerCore
from corral.server import identity
from corral.server.identity import AccountError
from corral.server.metrics import ManagerMetrics
from corral.server.spec import (
    JobSpecModel,
    SpecError,
    array_tasks,
    stored_dict,
    stored_json,
)
from corral.server.state import ManagerSettings, SubmitError
from corral.server.store import JobRow, Store, StoreUnavailable

log = logging.getLogger("corral.manager")


@dataclass(slots=True)
class Submission:
    """A job waiting in the inbox to be stored and queued."""

    row: JobRow
    model: JobSpecModel
    spec: JobSpec
    #: Called once from the committing thread: None when stored and queued, else the error.
    finish: Callable[[BaseException | None], None]
    #: The submitter's idempotency key (None: none): a submission whose key its user used
    #: before is not stored again; its answer is the job stored the first time (`first` is
    #: then made that job's row).
    key: str | None = None
    #: The row of the first job of the submission (an array's first task's; the one stored
    #: with the key, and the one answered).
    first: JobRow | None = None


class SubmissionCommitter:
    """The part of `Manager` that accepts submissions: `submit`, `submit_async` and the thread
    that commits them (`_commit_loop`, started by `Manager.start`)."""

    # The manager's state this part uses (Manager.__init__ sets it).
    store: Store
    settings: ManagerSettings
    clock: Callable[[], float]
    lock: threading.RLock
    scheduler: SchedulerCore
    vc_quota: dict[str, int]
    next_id: int
    _inbox: deque[Submission]
    _inbox_lock: threading.Lock
    _inbox_ready: threading.Event
    _committer: threading.Thread | None
    _stopping: threading.Event
    _wake: threading.Event
    _dirty: bool
    _spec_models: dict[str, JobSpecModel]
    _accounts: dict[str, str]
    _suspect: str | None
    metrics: ManagerMetrics

    if TYPE_CHECKING:  # the manager's own

        def _store_failed(self, error: BaseException, what: str) -> None: ...
        def _forget(self, job_id: str) -> None: ...
        def core_spec(
            self, model: JobSpecModel, job_id: str, submit_time: float, user: str
        ) -> JobSpec: ...
        def length_refusal(self, spec: JobSpec) -> str | None: ...
        def share_refusal(self, spec: JobSpec) -> str | None: ...
        def learn_workload(self, specs: list[JobSpec]) -> None: ...
        def _note_controls(self, row: JobRow, model: JobSpecModel) -> None: ...
        def _needs_gate(self, job_id: str) -> bool: ...

        _gated: dict[str, Job]

    def submit(
        self,
        model: JobSpecModel,
        user: str,
        unix_user: str | None = None,
        *,
        key: str | None = None,
    ) -> JobRow:
        """Accept a validated job: stored, then queued (the stored row is returned), or
        SubmitError with nothing stored. Submissions from many API threads are committed in
        groups by one thread (one transaction for all that arrived meanwhile)."""
        done = threading.Event()
        outcome: list[BaseException | None] = []

        def finish(error: BaseException | None) -> None:
            outcome.append(error)
            done.set()

        row = self._enqueue_submission(model, user, finish, unix_user, key)
        if self._committer is None:  # not started (a test driving `step` by hand): commit now
            self._commit_submissions()
        done.wait()
        if outcome[0] is not None:
            raise outcome[0]
        return row

    async def submit_async(
        self,
        model: JobSpecModel,
        user: str,
        unix_user: str | None = None,
        *,
        key: str | None = None,
    ) -> JobRow:
        """`submit` for the API's event loop: waits for the commit without holding a thread."""
        loop = asyncio.get_running_loop()
        stored: asyncio.Future[None] = loop.create_future()

        def settle(error: BaseException | None) -> None:
            if not stored.done():
                if error is None:
                    stored.set_result(None)
                else:
                    stored.set_exception(error)

        def finish(error: BaseException | None) -> None:
            loop.call_soon_threadsafe(settle, error)

        row = self._enqueue_submission(model, user, finish, unix_user, key)
        await stored
        return row

    def _enqueue_submission(
        self,
        model: JobSpecModel,
        user: str,
        finish: Callable[[BaseException | None], None],
        unix_user: str | None = None,
        key: str | None = None,
    ) -> JobRow:
        """`unix_user`: the account the user's token names (default: the user's name); `key`:
        the submitter's idempotency key (a repeated submission answers the job it stored)."""
        now = self.clock()
        account = self._account_for(model, user, unix_user)
        # The id it will have if no other submission takes it first (then it is replaced).
        tentative = str(self.next_id)
        try:
            spec = self.core_spec(model, tentative, now, user)
        except SpecError as error:  # gpu_memory that this manager cannot size
            raise SubmitError(str(error)) from None
        if spec.vc not in self.vc_quota:
            raise SubmitError(
                f"vc: unknown VC {spec.vc!r}; this cluster has {', '.join(sorted(self.vc_quota))}"
            )
        share_refusal = self.share_refusal(spec)  # (no lock needed)
        if share_refusal is not None:
            raise SubmitError(share_refusal)
        refusal = self.scheduler.refusal(spec) or self.length_refusal(spec)
        if refusal is not None:
            raise SubmitError(_field_message(refusal))
        for position, parent in enumerate(model.after):  # only existing ids: no cycle
            if self.store.get_job(parent) is None:
                raise SubmitError(f"after.{position}: no job {parent}")
        indexes = array_tasks(model.array)[0] if model.array is not None else [None]
        stored = stored_json(model)  # (the store keeps it as it is)
        dumped = stored_dict(model)  # the row's dict, as `stored` reads back
        with self._inbox_lock:  # ids in the order the core will queue the jobs
            first = str(self.next_id)
            rows = []
            for index in indexes:  # a job array: consecutive ids, the first the array's
                job_id = str(self.next_id)
                self.next_id += 1
                row = JobRow.new(
                    job_id,
                    name=model.name if index is None else f"{model.name}[{index}]",
                    user=user,
                    vc=spec.vc,
                    priority=spec.priority.value,
                    gpus=spec.gpus,
                    spec=dumped,
                    submitted_at=now,
                    unix_user=account,
                    spec_json=stored,
                )
                if index is not None:
                    row.array_id, row.array_index = first, index
                rows.append(row)
            rows[0].submit_key = key
            last = len(rows) - 1
            for i, row in enumerate(rows):  # one batch: the last one's answer is the array's
                done = finish if i == last else _ignore
                core = spec if spec.id == row.id else replace(spec, id=row.id)
                self._inbox.append(Submission(row, model, core, done, key, rows[0]))
        self._inbox_ready.set()
        return rows[0]

    def _account_for(self, model: JobSpecModel, user: str, unix_user: str | None) -> str | None:
        """The Unix account the job will run as (None in single-user mode); SubmitError if it
        does not exist, may not run jobs, or cannot enter the job's workdir. The account comes
        first, then the workdir as that account would see it (the API does not look at it as
        root first: that would tell whether a path it cannot read exists)."""
        if not self.settings.multi_user:
            return None
        try:
            run_as = identity.account(unix_user or user, named=unix_user is not None)
        except AccountError as error:
            raise SubmitError(str(error)) from None
        if model.workdir:
            problem = identity.workdir_problem_as(model.workdir, run_as)
            if problem is not None:
                raise SubmitError(f"workdir: {problem}")
        return run_as.user

    def _commit_loop(self) -> None:
        while not self._stopping.is_set() or self._inbox:
            self._inbox_ready.wait(self.settings.tick_s)
            self._inbox_ready.clear()
            self._commit_submissions()

    def _commit_submissions(self) -> None:
        with self._inbox_lock:
            batch = list(self._inbox)
            self._inbox.clear()
        if not batch:
            return
        outcomes: list[BaseException | None] = []
        queued: list[JobSpec] = []
        # Stored and queued in one transaction, under the lock: what the core decides as it
        # queues a job (ElasticFlow refuses one whose deadline it cannot meet) is stored with
        # the job, so that no crash can leave a refused job stored as pending (a restart would
        # start it), and nothing reads the core's state of a job that is not stored.
        with self.lock:
            if self._suspect is not None:  # the state is being rebuilt: it decides nothing
                unavailable = StoreUnavailable("the manager is rebuilding its state")
                outcomes = [unavailable] * len(batch)
            else:
                try:
                    with self.store.batch():
                        fresh = self._not_repeated(batch)
                        stored = fresh_flags(batch, fresh)
                        self.store.insert_jobs([s.row for s in fresh])
                        outcomes = [
                            self._queue_submission(submission) if new else None
                            for submission, new in zip(batch, stored, strict=True)
                        ]
                except BaseException as error:  # nothing stored: the core may have moved, and
                    # is rebuilt from the store (the rollback) before anything acts on it
                    self._store_failed(error, "storing submissions")
                    outcomes = [error] * len(batch)
                else:
                    for submission, outcome, new in zip(batch, outcomes, stored, strict=True):
                        if outcome is None and new:
                            self._queued(submission)
                            queued.append(submission.spec)
                    self.learn_workload(queued)  # FGD's target workload, live
                    self._dirty = True
        for submission, outcome in zip(batch, outcomes, strict=True):
            try:
                submission.finish(outcome)
            except RuntimeError:  # the requester's event loop is gone (server shutting down)
                pass
        self._wake.set()

    def _not_repeated(self, batch: list[Submission]) -> list[Submission]:
        """The submissions of `batch` to store: those whose idempotency key their user did not
        use before (in the store, or earlier in the batch). A repeated one's answer becomes the
        job stored the first time (its `first` row is overwritten with that job's)."""
        keyed = {(s.row.user, s.key) for s in batch if s.key is not None}
        if not keyed:
            return batch
        found = self.store.jobs_by_submit_keys(keyed)
        seen: dict[tuple[str, str], JobRow] = {}
        fresh = []
        for submission in batch:
            key = submission.key
            if key is None:
                fresh.append(submission)
                continue
            pair = (submission.row.user, key)
            first = submission.first
            assert first is not None
            original = found.get(pair) or seen.get(pair)
            if original is None or original is first:
                seen[pair] = first
                fresh.append(submission)
            elif submission.row is first:  # the answer: the job stored the first time
                for name in JobRow.__slots__:
                    if name not in ("spec_json", "submit_key"):
                        setattr(first, name, getattr(original, name))
        return fresh

    def _queue_submission(self, submission: Submission) -> BaseException | None:
        """Give a job being stored to the core (or to a gate); a job the core refuses at once
        is stored as REFUSED in the same transaction. Returns the error of a job that could
        not be queued (stored as FAILED)."""
        job_id = submission.row.id
        self._spec_models[job_id] = submission.model
        if submission.row.unix_user is not None:
            self._accounts[job_id] = submission.row.unix_user
        self._note_controls(submission.row, submission.model)
        if self._needs_gate(job_id):  # held, dependencies, an array's cap
            self._gated[job_id] = Job(spec=submission.spec)
            return None
        try:
            job = self.scheduler.submit(submission.spec, submission.row.submitted_at)
        except Exception as error:  # checked before storing; a bug, but no hang
            log.exception("job %s was stored but could not be queued", job_id)
            self.store.update_job(job_id, status="FAILED", reason=f"not queued: {error}")
            return error
        if job.status is JobStatus.REFUSED:  # ElasticFlow's admission: it never runs
            row = submission.row  # (the submitter's answer is this row)
            row.status, row.finished_at, row.reason = "REFUSED", row.submitted_at, job.last_event
            self.store.update_job(
                job_id, status="REFUSED", finished_at=row.finished_at, reason=row.reason
            )
            self.store.add_event(job_id, row.finished_at, "refused", row.reason)
        return None

    def _queued(self, submission: Submission) -> None:
        """A job stored and queued (or refused): counted; a refused one is forgotten."""
        row = submission.row
        self.metrics.know((), [(row.vc, row.user)])  # its end counted from 0 (one with no token)
        self.metrics.submitted.labels(row.vc, row.user).inc()
        job = self.scheduler.jobs.get(row.id)
        if job is not None and job.status is JobStatus.REFUSED:
            self.metrics.finished.labels(row.vc, row.user, "REFUSED").inc()
            self._forget(row.id)


def fresh_flags(batch: list[Submission], fresh: list[Submission]) -> list[bool]:
    """For each submission of `batch`, whether it is one of `fresh` (stored now)."""
    if len(fresh) == len(batch):
        return [True] * len(batch)
    kept = {id(submission) for submission in fresh}
    return [id(submission) in kept for submission in batch]


def _ignore(error: BaseException | None) -> None:
    """The answer to an array's tasks but its last (its answer covers the batch)."""


def _field_message(refusal: str) -> str:
    """The core's refusal ("asks for 9 GPUs but ...") as a field message."""
    return f"gpus: {refusal}" if "GPUs" in refusal else refusal
