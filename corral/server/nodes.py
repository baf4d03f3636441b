"""The live manager's node lifecycle: an operator's drain and resume, and the record of every
change of a node's state.

An admin drains a node (`drain_node`): nothing new starts there (the core's `NodeDrains` holds its
free GPUs out of allocation before every round), what runs there finishes, or with `preempt` is
stopped at once through its checkpoint contract and queued again (a preemption "by drain of node
NAME": not a failure, no retry used). `resume_node` brings it back. Each change is written to the
store's `node_changes` table in the same transaction that changes the core, so a change is durable
before anyone sees it; a restarted manager takes its drains from there (`_load_drains`), so a
drained node stays drained after a crash. What the manager sees of its cluster is recorded there
too, with its time (`_note_node_states`): a node that joined or left, one held out as not live
(offline) and back (online).

A health check (corral.server.health: a site's command, NVML's signals) that fails on a node
makes it `unhealthy` (`health_verdict`): the core's `NodeDrains.mark_unhealthy` holds its GPUs
out and ends its attempts as infrastructure failures (requeued, no retry used; their processes
are stopped), recorded as `unhealthy` with the check's reason; a check that passes again, or an
admin's resume, brings it back (`healthy`, `resumed`).

A node's state (`node_views`): `down` while the manager holds it out as not live (it left, or is
not live as declared), else `unhealthy`, `draining` (drained with attempts still on it),
`drained` or `up`. A node held out shows no free GPUs (its idle ones are `gpus_held`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from corral.core.job import JobStatus
from corral.core.nodes import (
    DOWN,
    DRAINING,
    HEALTHY,
    JOINED,
    LEFT,
    OFFLINE,
    ONLINE,
    RESUMED,
    STATES,
    UNHEALTHY,
    Drain,
    NodeDrains,
    Unhealthy,
    UnknownNode,
    unhealthy_label,
)
from corral.core.protocol import SchedulerCore
from corral.server.controls import ControlError
from corral.server.store import Store

if TYPE_CHECKING:
    from corral.core.actions import Preempt
    from corral.core.cluster import Cluster
    from corral.core.job import Job
    from corral.server.metrics import ManagerMetrics
    from corral.server.state import Attempt, Executor
    from corral.server.telemetry import Telemetry

__all__ = ["DRAINING", "HEALTHY", "JOINED", "LEFT", "OFFLINE", "ONLINE", "RESUMED", "UNHEALTHY"]

#: Who the manager's own changes are by.
MANAGER = "manager"


class NodeLifecycle:
    """The part of `Manager` that drains and resumes nodes and records node changes."""

    # The manager's state this part uses (Manager.__init__ sets it).
    store: Store
    executor: Executor
    clock: Callable[[], float]
    lock: threading.RLock
    scheduler: SchedulerCore
    cluster: Cluster
    _attempts: dict[str, Attempt]
    _draining: dict[tuple[str, int], tuple[int, ...]]
    _unusable: set[str]
    _dirty: bool
    _wake: threading.Event
    _retrying: set[str]
    _ending: dict[str, Any]
    telemetry: Telemetry
    metrics: ManagerMetrics

    if TYPE_CHECKING:  # the manager's own

        def _changing(self) -> AbstractContextManager[None]: ...
        def _record_preempt(self, action: Preempt, now: float) -> tuple[str, int] | None: ...
        def _drop_deferred_start(self, job: Job) -> bool: ...
        def _save_progress(self, job: Job, **fields: object) -> None: ...
        def _forget(self, job_id: str) -> None: ...

    def _init_nodes(self) -> None:
        self.drains = NodeDrains()
        #: When each node's state last changed (its latest row in node_changes).
        self._node_since: dict[str, float] = {}
        #: The nodes and those held out as not live, as last recorded (`_note_node_states`).
        self._recorded_nodes: set[str] | None = None
        self._recorded_down: set[str] = set()
        #: Why attempts stopped on an unhealthy node were lost: kept as their reason when they end.
        self._lost_reasons: dict[tuple[str, int], str] = {}
        #: Called with a node's name when an admin resumes it (the health checks forget what
        #: they kept of it, such as NVML's XID errors).
        self.on_resume: Callable[[str], None] | None = None
        self._load_drains()

    def _load_drains(self) -> None:
        """The drains the store holds: a node's latest drain or resume decides."""
        for row in self.store.node_changes():
            self._node_since[row.node] = row.at
            if row.state == DRAINING:
                self.drains.restore(row.node, Drain(row.reason, row.actor, row.at, row.preempt))
            elif row.state == RESUMED:
                self.drains.drained.pop(row.node, None)
                self.drains.unhealthy.pop(row.node, None)
            elif row.state == UNHEALTHY:
                self.drains.unhealthy[row.node] = Unhealthy(row.reason, row.at, row.actor)
            elif row.state == HEALTHY:
                self.drains.unhealthy.pop(row.node, None)
            elif row.state in (JOINED, LEFT, OFFLINE, ONLINE):
                self._recorded_nodes = self._recorded_nodes or set()
                if row.state == LEFT:
                    self._recorded_nodes.discard(row.node)
                else:
                    self._recorded_nodes.add(row.node)
                if row.state == OFFLINE:
                    self._recorded_down.add(row.node)
                elif row.state in (ONLINE, LEFT):
                    self._recorded_down.discard(row.node)

    # -- what an admin asks -------------------------------------------------------------------

    def drain_node(self, name: str, reason: str, user: str, *, preempt: bool) -> dict[str, Any]:
        """Drain the node (ControlError 404 naming it if the cluster has no such node)."""
        stops: list[tuple[str, int]] = []
        with self._changing():
            now = self.clock()
            before = self.drains.drained.get(name)
            try:
                with self.store.batch():
                    if not self._known_node(name):
                        raise ControlError(404, _unknown(name))
                    self.store.add_node_change(now, name, DRAINING, reason, user, preempt=preempt)
                    for action in self.drains.drain(
                        self.scheduler, name, now, reason=reason, by=user, preempt=preempt
                    ):
                        stop = self._record_preempt(action, now)
                        if stop is not None:
                            stops.append(stop)
            except BaseException:
                if before is None:  # the store holds no such drain: neither does memory
                    self.drains.drained.pop(name, None)
                else:
                    self.drains.drained[name] = before
                raise
            self._node_since[name] = self.drains.drained[name].since
            self._dirty = True
        for job_id, number in stops:
            self.executor.stop(job_id, number)
        self._wake.set()
        return self.node_view(name)

    def resume_node(self, name: str, user: str) -> dict[str, Any]:
        """Bring a drained or unhealthy node back (ControlError 404 for an unknown node, 409 for
        one that is neither). An unhealthy node whose check still fails is found so again at
        the next check."""
        with self._changing():
            now = self.clock()
            if not self._known_node(name):
                raise ControlError(404, _unknown(name))
            if name not in self.drains.drained and name not in self.drains.unhealthy:
                raise ControlError(409, f"node {name} is not drained (nor unhealthy)")
            before = self.drains.drained.get(name)
            sick = self.drains.unhealthy.get(name)
            try:
                with self.store.batch():
                    self.store.add_node_change(now, name, RESUMED, "", user)
                    self.drains.resume(self.scheduler, name)
            except BaseException:
                if before is not None:
                    self.drains.drained[name] = before
                if sick is not None:
                    self.drains.unhealthy[name] = sick
                raise
            self._node_since[name] = now
            self._dirty = True
        if self.on_resume is not None:
            self.on_resume(name)
        self._wake.set()
        return self.node_view(name)

    def health_verdict(self, name: str, healthy: bool, reason: str) -> bool:
        """A health check's verdict on a node (corral.server.health): a node found unhealthy is
        held out and its attempts end as the infrastructure's failures (stopped, requeued); one
        found healthy again comes back. Only a change is recorded; returns whether there was one
        (a node the cluster no longer has is ignored)."""
        stops: list[tuple[str, int]] = []
        with self._changing():
            if not self._known_node(name):
                return False
            sick = self.drains.unhealthy.get(name)
            if healthy == (sick is None):  # no change (a new reason while unhealthy is none)
                return False
            now = self.clock()
            try:
                with self.store.batch():
                    if healthy:
                        self.store.add_node_change(now, name, HEALTHY, "check passed", MANAGER)
                        self.drains.mark_healthy(self.scheduler, name)
                    else:
                        self.store.add_node_change(now, name, UNHEALTHY, reason, MANAGER)
                        for job in self.drains.mark_unhealthy(self.scheduler, name, now, reason):
                            stop = self._record_lost(job, now, unhealthy_label(name, reason))
                            if stop is not None:
                                stops.append(stop)
            except BaseException:
                if sick is None:
                    self.drains.unhealthy.pop(name, None)
                else:
                    self.drains.unhealthy[name] = sick
                raise
            self._node_since[name] = now
            self._dirty = True
        for job_id, number in stops:
            self.executor.stop(job_id, number)
        self._wake.set()
        return True

    def _record_lost(self, job: Job, now: float, reason: str) -> tuple[str, int] | None:
        """The core ended the job's running attempt as the infrastructure's failure (its node
        is unhealthy): recorded as lost, its processes to be stopped (returned; None when its
        start was still deferred and nothing ran). Requeued, or ended by the retry rule."""
        if self._drop_deferred_start(job):
            self.store.add_event(job.id, now, "requeued", f"not started: {reason}")
            self._save_progress(job, status=job.status.value, reason=reason)
            return None
        attempt = self._attempts.pop(job.id, None)
        if attempt is None:
            return None
        self.telemetry.unwatch(job.id, now)
        self._ending.pop(job.id, None)
        key = (job.id, attempt.number)
        self._draining[key] = attempt.gpus
        self._lost_reasons[key] = reason
        self.store.update_attempt(
            job.id, attempt.number, state="stopping", outcome="lost", reason=reason
        )
        failed = job.status is JobStatus.FAILED
        self.metrics.failed(job.spec.vc, "infrastructure", retried=not failed)
        if failed:
            detail = job.verdict.reason if job.verdict is not None else reason
            self.metrics.finished.labels(job.spec.vc, job.spec.user, "FAILED").inc()
            self._save_progress(job, status="FAILED", finished_at=now, reason=detail)
            self.store.add_event(job.id, now, "failed", detail)
            self._forget(job.id)
        else:
            self._retrying.add(job.id)
            self._save_progress(job, status="PENDING", reason=f"requeued: {reason}")
            self.store.add_event(
                job.id, now, "requeued", f"attempt {attempt.number} lost ({reason}); requeued"
            )
        return key

    def _known_node(self, name: str) -> bool:
        return any(node.name == name for node in self.cluster.nodes)

    # -- what everyone sees -------------------------------------------------------------------

    def _node_jobs(self) -> dict[str, tuple[list[str], int]]:
        """Per node: the jobs with an attempt (running or stopping) on it, and its GPUs they use."""
        used: dict[str, set[int]] = {}
        jobs: dict[str, list[str]] = {}
        held = [(job_id, a.gpus) for job_id, a in self._attempts.items()]
        held += [(job_id, gpus) for (job_id, _), gpus in self._draining.items()]
        for job_id, gpus in held:
            for gpu in gpus:
                if gpu >= len(self.cluster.gpu_node):
                    continue
                node = self.cluster.nodes[self.cluster.gpu_node[gpu]].name
                used.setdefault(node, set()).add(gpu)
                if job_id not in jobs.setdefault(node, []):
                    jobs[node].append(job_id)
        return {
            name: (sorted(ids, key=_job_order), len(used.get(name, ())))
            for name, ids in jobs.items()
        }

    def node_views(self) -> list[dict[str, Any]]:
        """Every node: its state, why and since when, by whom, its GPUs free and used, its jobs."""
        with self.lock:
            on = self._node_jobs()
            views = []
            for node in self.cluster.nodes:
                jobs, used = on.get(node.name, ([], 0))
                drain = self.drains.drained.get(node.name)
                sick = self.drains.unhealthy.get(node.name)
                if node.name in self._unusable:
                    state, reason = DOWN, "not live"
                else:
                    state = self.drains.state(node.name, len(jobs))
                    reason = drain.reason if drain is not None else ""
                    if sick is not None:
                        reason = sick.reason + (f" (drained: {reason})" if reason else "")
                total = len(self.cluster.node_gpus[node.index])
                held = node.name in self._unusable or self.drains.holds(node.name)
                views.append(
                    {
                        "name": node.name,
                        "state": state,
                        "reason": reason,
                        "by": sick.by if sick is not None else drain.by if drain else None,
                        "since": self._node_since.get(node.name),
                        "preempt": drain.preempt if drain is not None else False,
                        "gpus": total,
                        "gpus_used": used,
                        "gpus_free": 0 if held else total - used,
                        "gpus_held": total - used if held else 0,
                        "jobs": jobs,
                    }
                )
            return views

    def node_view(self, name: str) -> dict[str, Any]:
        return next(view for view in self.node_views() if view["name"] == name)

    def node_state_counts(self) -> Iterator[tuple[str, str, int]]:
        """(node, state, 1 or 0) for every node and every state: the `corral_node_state` gauge."""
        for view in self.node_views():
            for state in STATES:
                yield view["name"], state, int(view["state"] == state)

    # -- what the manager sees ----------------------------------------------------------------

    def _note_node_states(self, now: float) -> None:
        """Record the nodes that joined or left and those held out as not live or back since
        the last record (inside the step's transaction)."""
        names = {node.name for node in self.cluster.nodes}
        down = set(self._unusable)
        before = self._recorded_nodes
        if before is None:  # the first look: the nodes there are join, quietly if fixed
            before = set()
        for name in sorted(names - before):
            self._node_change(now, name, JOINED, "in the cluster")
        for name in sorted(before - names):
            self._node_change(now, name, LEFT, "no longer in the cluster")
        for name in sorted(down - self._recorded_down):
            self._node_change(now, name, OFFLINE, "not live: held out of allocation")
        for name in sorted((self._recorded_down - down) & names):
            self._node_change(now, name, ONLINE, "live again")
        self._recorded_nodes = names
        self._recorded_down = down

    def _node_change(self, now: float, name: str, state: str, reason: str) -> None:
        self.store.add_node_change(now, name, state, reason, MANAGER)
        self._node_since[name] = now


def _unknown(name: str) -> str:
    return str(UnknownNode(f"no node {name!r}"))


def _job_order(job_id: str) -> tuple[int, str]:
    return (int(job_id), "") if job_id.isdigit() else (0, job_id)
