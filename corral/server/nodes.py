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

A node's state (`node_views`): `down` while the manager holds it out as not live (it left, or is
not live as declared), else `draining` (drained with attempts still on it), `drained` or `up`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from corral.core.nodes import DOWN, STATES, Drain, NodeDrains, UnknownNode
from corral.core.protocol import SchedulerCore
from corral.server.controls import ControlError
from corral.server.store import Store

if TYPE_CHECKING:
    from corral.core.actions import Preempt
    from corral.core.cluster import Cluster
    from corral.server.state import Attempt, Executor

#: The states of `node_changes` an operator writes; the others are the manager's own.
DRAINING, RESUMED = "draining", "resumed"
JOINED, LEFT, OFFLINE, ONLINE = "joined", "left", "offline", "online"
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

    if TYPE_CHECKING:  # the manager's own

        def _changing(self) -> AbstractContextManager[None]: ...
        def _record_preempt(self, action: Preempt, now: float) -> tuple[str, int] | None: ...

    def _init_nodes(self) -> None:
        self.drains = NodeDrains()
        #: When each node's state last changed (its latest row in node_changes).
        self._node_since: dict[str, float] = {}
        #: The nodes and those held out as not live, as last recorded (`_note_node_states`).
        self._recorded_nodes: set[str] | None = None
        self._recorded_down: set[str] = set()
        self._load_drains()

    def _load_drains(self) -> None:
        """The drains the store holds: a node's latest drain or resume decides."""
        for row in self.store.node_changes():
            self._node_since[row.node] = row.at
            if row.state == DRAINING:
                self.drains.restore(row.node, Drain(row.reason, row.actor, row.at, row.preempt))
            elif row.state == RESUMED:
                self.drains.drained.pop(row.node, None)
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
        """Bring a drained node back (ControlError 404 for an unknown node, 409 for one that is
        not drained)."""
        with self._changing():
            now = self.clock()
            if not self._known_node(name):
                raise ControlError(404, _unknown(name))
            if name not in self.drains.drained:
                raise ControlError(409, f"node {name} is not drained")
            before = self.drains.drained[name]
            try:
                with self.store.batch():
                    self.store.add_node_change(now, name, RESUMED, "", user)
                    self.drains.resume(self.scheduler, name)
            except BaseException:
                self.drains.drained[name] = before
                raise
            self._node_since[name] = now
            self._dirty = True
        self._wake.set()
        return self.node_view(name)

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
                if node.name in self._unusable:
                    state, reason = DOWN, "not live"
                else:
                    state = self.drains.state(node.name, len(jobs))
                    reason = drain.reason if drain is not None else ""
                total = len(self.cluster.node_gpus[node.index])
                views.append(
                    {
                        "name": node.name,
                        "state": state,
                        "reason": reason,
                        "by": drain.by if drain is not None else None,
                        "since": self._node_since.get(node.name),
                        "preempt": drain.preempt if drain is not None else False,
                        "gpus": total,
                        "gpus_used": used,
                        "gpus_free": total - used,
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
