"""The live manager's submission committer: jobs stored in groups, then queued.

The API's handlers call `submit` (or `submit_async`, on the event loop). Each checks the job against
the cluster's shape (`Scheduler.refusal`, no lock needed), gives it its id and puts it in an inbox.
One committing thread takes every submission that arrived meanwhile, stores them all in one
transaction, queues them in the core under the manager's lock, and only then answers the waiting
requests: an answer means stored.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from corral.core.job import Job, JobSpec
from corral.core.protocol import SchedulerCore
from corral.server import identity
from corral.server.identity import AccountError
from corral.server.metrics import ManagerMetrics
from corral.server.spec import JobSpecModel, SpecError, array_tasks
from corral.server.state import ManagerSettings, SubmitError
from corral.server.store import JobRow, Store

log = logging.getLogger("corral.manager")


@dataclass(slots=True)
class Submission:
    """A job waiting in the inbox to be stored and queued."""

    row: JobRow
    model: JobSpecModel
    spec: JobSpec
    #: Called once from the committing thread: None when stored and queued, else the error.
    finish: Callable[[BaseException | None], None]


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
    _cancel_on_arrival: set[str]
    _suspect: str | None
    metrics: ManagerMetrics

    if TYPE_CHECKING:  # the manager's own

        def _store_failed(self, error: BaseException, what: str) -> None: ...
        def core_spec(
            self, model: JobSpecModel, job_id: str, submit_time: float, user: str
        ) -> JobSpec: ...
        def length_refusal(self, spec: JobSpec) -> str | None: ...
        def share_refusal(self, spec: JobSpec) -> str | None: ...
        def learn_workload(self, specs: list[JobSpec]) -> None: ...
        def _note_controls(self, row: JobRow, model: JobSpecModel) -> None: ...
        def _needs_gate(self, job_id: str) -> bool: ...

        _gated: dict[str, Job]

    def submit(self, model: JobSpecModel, user: str, unix_user: str | None = None) -> JobRow:
        """Accept a validated job: stored, then queued (the stored row is returned), or
        SubmitError with nothing stored. Submissions from many API threads are committed in
        groups by one thread (one transaction for all that arrived meanwhile)."""
        done = threading.Event()
        outcome: list[BaseException | None] = []

        def finish(error: BaseException | None) -> None:
            outcome.append(error)
            done.set()

        row = self._enqueue_submission(model, user, finish, unix_user)
        if self._committer is None:  # not started (a test driving `step` by hand): commit now
            self._commit_submissions()
        done.wait()
        if outcome[0] is not None:
            raise outcome[0]
        return row

    async def submit_async(
        self, model: JobSpecModel, user: str, unix_user: str | None = None
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

        row = self._enqueue_submission(model, user, finish, unix_user)
        await stored
        return row

    def _enqueue_submission(
        self,
        model: JobSpecModel,
        user: str,
        finish: Callable[[BaseException | None], None],
        unix_user: str | None = None,
    ) -> JobRow:
        """`unix_user`: the account the user's token names (default: the user's name)."""
        now = self.clock()
        account = self._account_for(model, user, unix_user)
        try:
            spec = self.core_spec(model, "new", now, user)
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
        dumped = model.model_dump(mode="json")
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
                )
                if index is not None:
                    row.array_id, row.array_index = first, index
                rows.append(row)
            last = len(rows) - 1
            for i, row in enumerate(rows):  # one batch: the last one's answer is the array's
                done = finish if i == last else _ignore
                self._inbox.append(Submission(row, model, replace(spec, id=row.id), done))
        self._inbox_ready.set()
        return rows[0]

    def _account_for(self, model: JobSpecModel, user: str, unix_user: str | None) -> str | None:
        """The Unix account the job will run as (None in single-user mode); SubmitError if it
        does not exist, may not run jobs, or cannot enter the job's workdir."""
        if not self.settings.multi_user:
            return None
        try:
            run_as = identity.account(unix_user or user)
        except AccountError as error:
            raise SubmitError(str(error)) from None
        if model.workdir:
            blocked = identity.may_enter(Path(model.workdir), run_as)
            if blocked is not None:
                raise SubmitError(f"workdir: account {run_as.user} cannot enter {blocked}")
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
        try:
            self.store.insert_jobs([s.row for s in batch])
        except BaseException as error:  # nothing stored: every waiting submitter hears why
            for submission in batch:
                submission.finish(error)
            return
        for submission in batch:
            self.metrics.submitted.labels(submission.row.vc, submission.row.user).inc()
        # Stored: each is answered as accepted, unless the core refuses to queue it (a bug).
        outcomes: list[BaseException | None] = [None] * len(batch)
        with self.lock:
            if self._suspect is None:  # (else the rebuild from the store queues them)
                try:
                    self._queue_stored(batch, outcomes)
                except Exception as error:  # a write failed after the core moved
                    self._store_failed(error, "queueing stored submissions")
            self._dirty = True
        for submission, outcome in zip(batch, outcomes, strict=True):
            try:
                submission.finish(outcome)
            except RuntimeError:  # the requester's event loop is gone (server shutting down)
                pass
        self._wake.set()

    def _queue_stored(self, batch: list[Submission], outcomes: list[BaseException | None]) -> None:
        """Queue stored submissions in the core (under the lock); a job cancelled between its
        store and its queueing is dropped (its cancel is written already)."""
        queued: list[JobSpec] = []
        for position, submission in enumerate(batch):
            job_id = submission.row.id
            if job_id in self._cancel_on_arrival:
                self._cancel_on_arrival.discard(job_id)
                continue
            self._spec_models[job_id] = submission.model
            if submission.row.unix_user is not None:
                self._accounts[job_id] = submission.row.unix_user
            self._note_controls(submission.row, submission.model)
            # A rebuild (nodes came or went) since the insert queued it from the store.
            if job_id in self._gated:
                pass
            elif self._needs_gate(job_id):  # held, dependencies, an array's cap
                self._gated[job_id] = Job(spec=submission.spec)
            elif job_id not in self.scheduler.jobs:
                try:
                    self.scheduler.submit(submission.spec, submission.row.submitted_at)
                except Exception as error:  # checked before storing; a bug, but no hang
                    log.exception("job %s was stored but could not be queued", job_id)
                    self.store.update_job(job_id, status="FAILED", reason=f"not queued: {error}")
                    outcomes[position] = error
                    continue
            queued.append(submission.spec)
        self.learn_workload(queued)  # FGD's target workload, live


def _ignore(error: BaseException | None) -> None:
    """The answer to an array's tasks but its last (its answer covers the batch)."""


def _field_message(refusal: str) -> str:
    """The core's refusal ("asks for 9 GPUs but ...") as a field message."""
    return f"gpus: {refusal}" if "GPUs" in refusal else refusal
