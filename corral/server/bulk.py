"""Bulk control: cancel, hold or release every unfinished job a filter selects, in one call.

A filter (`JobFilter`) names any of: states (PENDING, RUNNING), a user, a VC and a name pattern
(a name, which selects an array's tasks too, or a shell glob: `sweep-*`; `corral.server.names`);
a job is selected when it matches every field given. A user's filter
selects only their own jobs (naming another user is refused, 403); an admin's selects anyone's.
At least one field must be given: an empty filter is refused (422), not read as "every job".

One call is one transaction: the manager selects the jobs under its lock, writes every change in
one store transaction (`Store.batch`: each kind of statement sent once for all the jobs), and only
once that is committed stops the running attempts and answers. A store failure part-way rolls
back all of it (nothing is changed; the manager rebuilds its memory from the store) and the API
answers 503; the same call may be repeated, and selects then what is still to do. Hold acts on the
selected jobs that are pending and not held, release on those held; cancel on all selected.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from corral.core.job import Job, JobStatus
from corral.core.protocol import SchedulerCore
from corral.server.auth import Principal
from corral.server.names import name_matches
from corral.server.spec import JobSpecModel, one_line
from corral.server.state import Executor
from corral.server.store import Store

#: What a filter's `state` may name (unfinished jobs only: ended ones are not changed).
STATES = ("PENDING", "RUNNING")
VERBS = ("cancel", "hold", "release")
FIELDS = ("state", "user", "vc", "name")


@dataclass(frozen=True, slots=True)
class JobFilter:
    states: frozenset[str] = frozenset(STATES)
    user: str | None = None
    vc: str | None = None
    name: str | None = None  # a shell glob

    def matches(self, status: str, user: str, vc: str, name: str) -> bool:
        return (
            status in self.states
            and (self.user is None or user == self.user)
            and (self.vc is None or vc == self.vc)
            and (self.name is None or name_matches(name, self.name))
        )


def parse_filter(body: object, who: Principal) -> JobFilter:
    """The filter of a bulk call's body, as `who` may use it: ValueError (one line naming the
    field) for a bad one, PermissionError for another user's jobs asked by a non-admin."""
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object: a filter of state, user, vc, name")
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown field (expected one of: {', '.join(FIELDS)})")
    if not any(body.get(key) not in (None, "", []) for key in FIELDS):
        raise ValueError(f"give at least one of {', '.join(FIELDS)}: an empty filter selects none")
    states = body.get("state")
    if states is None:
        states = list(STATES)
    elif isinstance(states, str):
        states = [states]
    if not isinstance(states, list) or not states:
        raise ValueError("state: must be a state or a list of states")
    for state in states:
        if not isinstance(state, str) or state.upper() not in STATES:
            shown = one_line(str(state), 40)
            raise ValueError(f"state: {shown}: must be one of {', '.join(STATES)}")
    texts: dict[str, str | None] = {}
    for key in ("user", "vc", "name"):
        value = body.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            raise ValueError(f"{key}: must be a non-empty string")
        texts[key] = value
    user = texts["user"]
    if not who.admin:
        if user is not None and user != who.user:
            raise PermissionError(
                f"user: {one_line(user, 64)}: only an admin may act on another user's jobs"
            )
        user = who.user
    return JobFilter(frozenset(s.upper() for s in states), user, texts["vc"], texts["name"])


class BulkControls:
    """The part of `Manager` that cancels, holds and releases the jobs a filter selects."""

    # The manager's state this part uses (Manager.__init__ sets it).
    store: Store
    executor: Executor
    clock: Callable[[], float]
    lock: threading.RLock
    scheduler: SchedulerCore
    _gated: dict[str, Job]
    _held: dict[str, str]
    _spec_models: dict[str, JobSpecModel]
    _wake: threading.Event

    if TYPE_CHECKING:  # the manager's own and its other parts'

        def _changing(self) -> AbstractContextManager[None]: ...
        def _cancel_locked(
            self, job_id: str, stops: list[tuple[str, int]] | None = None
        ) -> None: ...
        def _cancel_gated(self, job_id: str, now: float) -> None: ...
        def _hold_locked(self, job_id: str, user: str, now: float) -> None: ...
        def _release_locked(self, job_id: str, user: str, now: float) -> None: ...

    def _unfinished(self) -> Iterator[tuple[str, str, Job]]:
        """(id, PENDING or RUNNING, job) of every unfinished job: in the core, or at a gate."""
        for job_id, job in self.scheduler.jobs.items():
            if not job.status.finished:
                running = job.status is JobStatus.RUNNING
                yield job_id, "RUNNING" if running else "PENDING", job
        for job_id, job in self._gated.items():
            yield job_id, "PENDING", job

    def matching(self, chosen: JobFilter) -> list[tuple[str, str]]:
        """(id, status) of the unfinished jobs the filter selects, by id (under the lock)."""
        with self.lock:
            found = []
            for job_id, status, job in self._unfinished():
                model = self._spec_models.get(job_id)
                name = model.name if model is not None else ""
                if chosen.matches(status, job.spec.user, job.spec.vc, name):
                    found.append((job_id, status))
        found.sort(key=lambda pair: int(pair[0]) if pair[0].isdigit() else -1)
        return found

    def bulk(self, verb: str, chosen: JobFilter, by: str) -> list[str]:
        """Cancel, hold or release the jobs the filter selects, in one transaction; the ids
        changed. StoreUnavailable (nothing changed) when the store cannot take it."""
        stops: list[tuple[str, int]] = []
        with self._changing():
            now = self.clock()
            selected = self.matching(chosen)
            if verb == "cancel":
                ids = [job_id for job_id, _ in selected]
            elif verb == "hold":
                ids = [j for j, status in selected if status == "PENDING" and j not in self._held]
            elif verb == "release":
                ids = [job_id for job_id, _ in selected if job_id in self._held]
            else:
                raise ValueError(f"unknown bulk verb {verb!r}")
            if ids:
                with self.store.batch():
                    for job_id in ids:
                        if verb == "hold":
                            self._hold_locked(job_id, by, now)
                        elif verb == "release":
                            self._release_locked(job_id, by, now)
                        elif job_id in self._gated:
                            self._cancel_gated(job_id, now)
                        else:
                            self._cancel_locked(job_id, stops)
                # committed: now the processes may be told
                for job_id, number in stops:
                    self.executor.stop(job_id, number)
        if ids:
            self._wake.set()
        return ids
