"""A node's lifecycle as an operator drives it: drain and resume, decided in the core so that the
simulator replays what the live manager did.

A node is `up`, `draining` (drained by an operator while attempts still run on it: nothing new
starts there, what runs finishes), `drained` (draining, nothing left running) or `down` (the
shell's own: a node that failed or left the cluster, corral.server.recovery). A drain holds the
node's free GPUs out of allocation (`take_offline`), and again before every round (`hold`), since
each attempt that ends there frees GPUs; so no waiting job starts on the node. A drain with
`preempt` also stops every attempt on the node at once through its checkpoint contract
(`evict_node`): preemptions by "drain of node NAME", requeued, neither failures nor retries
used.
`resume` brings the node's GPUs back.

A node is also `unhealthy` when a health check (a site's health-check command, NVML's signals:
corral.server.health) failed on it (`mark_unhealthy`): its free GPUs are held out like a
drained node's, and every attempt on it ends at once as an infrastructure failure ("node NAME
unhealthy: REASON"), requeued by the core's retry rule without using `max_retries`. It comes back
when a check passes again (`mark_healthy`) or an admin resumes it (`resume`, which also ends a
drain). Nodes the live manager saw leave or held out as not live (`mark_absent`) are held out the
same way in a replay (their attempts' ends are replayed from the jobs' own records).

Drains are kept by node name, so they outlive a rebuild of the cluster (nodes joining or
leaving) and a restart (the live manager stores each change and gives them back here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from corral.core.job import JobStatus
from corral.core.retry import FailureReport

if TYPE_CHECKING:
    from corral.core.actions import Preempt
    from corral.core.cluster import Cluster
    from corral.core.job import Job
    from corral.core.protocol import SchedulerCore

UP, DRAINING, DRAINED, DOWN = "up", "draining", "drained", "down"
UNHEALTHY = "unhealthy"
#: Every state a node may be in, in the order `corral node ls` and the metric list them.
STATES = (UP, DRAINING, DRAINED, UNHEALTHY, DOWN)

#: The kinds of a recorded node change (`NodeChange.state`, the store's `node_changes.state`):
#: an operator's drain and resume, a health check's verdicts, and what the live manager saw of
#: its cluster (a node joined or left, held out as not live and back).
RESUMED, HEALTHY = "resumed", "healthy"
JOINED, LEFT, OFFLINE, ONLINE = "joined", "left", "offline", "online"
CHANGE_STATES = (DRAINING, RESUMED, UNHEALTHY, HEALTHY, JOINED, LEFT, OFFLINE, ONLINE)
#: The changes that make a node absent from allocation in a replay, and those that end that.
ABSENT, PRESENT = (LEFT, OFFLINE), (JOINED, ONLINE)


class UnknownNode(KeyError):
    """A drain or resume named a node the cluster does not have."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True, slots=True)
class Drain:
    """An operator's drain of one node: why, by whom, since when, and whether its attempts were
    preempted."""

    reason: str
    by: str
    since: float
    preempt: bool = False


@dataclass(frozen=True, slots=True)
class Unhealthy:
    """A failed health check of a node: why (the check's first line of output) and since when."""

    reason: str
    since: float
    by: str = "health check"


@dataclass(frozen=True, slots=True)
class NodeChange:
    """A drain (`drain` True) or a resume of a node at an instant, as a shell replays it: from a
    live manager's history (export-trace) or a cluster config's maintenance windows. `state`,
    when given, is another kind of change (`CHANGE_STATES`: unhealthy, healthy, joined, left,
    offline, online; `drain` is then False); empty, the drain or resume `drain` says."""

    at: float
    node: str
    drain: bool
    reason: str = ""
    preempt: bool = False
    state: str = ""

    @property
    def kind(self) -> str:
        """The change's state: `state`, else draining or resumed."""
        return self.state or (DRAINING if self.drain else RESUMED)


@dataclass(frozen=True, slots=True)
class Applied:
    """What a node change did in the core: the attempts it preempted (a drain with `preempt`)
    and the jobs whose attempts it failed (a node found unhealthy), both committed already."""

    stops: list[Preempt]
    failed: list[Job]


def apply_change(
    drains: NodeDrains, core: SchedulerCore, change: NodeChange, now: float
) -> Applied:
    """Carry out one change (a resume of a node not drained does nothing)."""
    kind, name = change.kind, change.node
    if kind == DRAINING:
        stops = drains.drain(
            core, name, now, reason=change.reason, by="replay", preempt=change.preempt
        )
        return Applied(stops, [])
    if kind == UNHEALTHY:
        return Applied([], drains.mark_unhealthy(core, name, now, change.reason))
    if kind == RESUMED:
        drains.resume(core, name)
    elif kind == HEALTHY:
        drains.mark_healthy(core, name)
    elif kind in ABSENT:
        drains.mark_absent(core, name, True)
    elif kind in PRESENT:
        drains.mark_absent(core, name, False)
    return Applied([], [])


def absent_from_start(changes: list[NodeChange]) -> set[str]:
    """The nodes whose first change is that they joined, after the start: absent until then."""
    first: dict[str, NodeChange] = {}
    for change in sorted(changes, key=lambda c: c.at):
        first.setdefault(change.node, change)
    return {name for name, change in first.items() if change.kind == JOINED and change.at > 0}


def maintenance_changes(
    windows: list[tuple[str, float, float | None, str, bool]],
) -> list[NodeChange]:
    """The drains and resumes of maintenance windows (node, start, end or None, reason,
    preempt), in time order (at one instant a resume first: a window that ends as the next
    begins leaves the node drained)."""
    changes = []
    for node, start, end, reason, preempt in windows:
        changes.append(NodeChange(start, node, True, reason, preempt))
        if end is not None:
            changes.append(NodeChange(end, node, False, reason))
    return sorted(changes, key=lambda c: (c.at, c.drain))


def node_index(cluster: Cluster, name: str) -> int:
    """The index of the node of that name (UnknownNode, naming it, if there is none)."""
    for node in cluster.nodes:
        if node.name == name:
            return node.index
    names = [node.name for node in cluster.nodes[:8]]
    more = ", ..." if len(cluster.nodes) > len(names) else ""
    raise UnknownNode(f"no node {name!r} (the nodes: {', '.join(names)}{more})")


def drain_label(name: str) -> str:
    """What a drain's preemptions name as their cause (`Preempt.by_job_id`)."""
    return f"drain of node {name}"


def unhealthy_label(name: str, reason: str) -> str:
    """The reason of the infrastructure failures of the attempts on an unhealthy node."""
    return f"node {name} unhealthy: {reason}"


class NodeDrains:
    """The drained nodes, by name, and what a drain and a resume do to the core."""

    def __init__(self) -> None:
        self.drained: dict[str, Drain] = {}
        #: Nodes a health check found unhealthy, by name.
        self.unhealthy: dict[str, Unhealthy] = {}
        #: Nodes held out as absent (a replay's nodes that left or were not live).
        self.absent: set[str] = set()

    @property
    def held(self) -> bool:
        """Whether any node is held out (drained, unhealthy or absent)."""
        return bool(self.drained or self.unhealthy or self.absent)

    def holds(self, name: str) -> bool:
        return name in self.drained or name in self.unhealthy or name in self.absent

    def drain(
        self,
        core: SchedulerCore,
        name: str,
        now: float,
        *,
        reason: str,
        by: str = "",
        preempt: bool = False,
    ) -> list[Preempt]:
        """Drain the node: nothing new starts on it from now; with `preempt` its attempts are
        stopped (the returned preemptions, already committed in the core). A node drained
        already keeps its first drain's time (its reason and preemption are the new ones)."""
        node = node_index(core.cluster, name)
        since = self.drained[name].since if name in self.drained else now
        self.drained[name] = Drain(reason, by, since, preempt)
        stops = core.evict_node(node, now, drain_label(name)) if preempt else []
        self.hold(core)
        return stops

    def resume(self, core: SchedulerCore, name: str) -> bool:
        """Bring a drained or unhealthy node back (False: it was neither): an admin's word
        overrides a failed health check until the next check fails. Its GPUs held for any other
        reason (a dead node, leftover processes) are the shell's to hold again before the next
        round, as it does after every change."""
        node = node_index(core.cluster, name)
        drained = self.drained.pop(name, None)
        sick = self.unhealthy.pop(name, None)
        if drained is None and sick is None:
            return False
        self._bring_back(core, node, name)
        return True

    def mark_unhealthy(
        self, core: SchedulerCore, name: str, now: float, reason: str, by: str = "health check"
    ) -> list[Job]:
        """A health check failed on the node: nothing starts there from now, and every attempt
        on it ends as an infrastructure failure (requeued, no retry used; the core's retry rule
        may still end a job that fails so again and again). Returns those jobs, already failed
        in the core. A node unhealthy already keeps its first time (its reason is the new one)."""
        node = node_index(core.cluster, name)
        since = self.unhealthy[name].since if name in self.unhealthy else now
        self.unhealthy[name] = Unhealthy(reason, since, by)
        report = FailureReport(unhealthy_label(name, reason), infrastructure=True)
        hit = [
            job
            for job in core.running_jobs()
            if job.node == node or any(core.cluster.gpu_node[g] == node for g in job.placement)
        ]
        failed = [core.failed(job.id, now, report) for job in hit]
        self.hold(core)
        return failed

    def mark_healthy(self, core: SchedulerCore, name: str) -> bool:
        """A health check passed on a node found unhealthy: it takes jobs again unless drained
        (False: it was not unhealthy)."""
        node = node_index(core.cluster, name)
        if self.unhealthy.pop(name, None) is None:
            return False
        self._bring_back(core, node, name)
        return True

    def mark_absent(self, core: SchedulerCore, name: str, absent: bool) -> None:
        """Hold the node out as absent (it left, or is not live), or bring it back."""
        node = node_index(core.cluster, name)
        if absent:
            self.absent.add(name)
            self.hold(core)
        elif name in self.absent:
            self.absent.discard(name)
            self._bring_back(core, node, name)

    def _bring_back(self, core: SchedulerCore, node: int, name: str) -> None:
        if not self.holds(name):
            core.bring_online(core.cluster.node_gpus[node])

    def hold(self, core: SchedulerCore) -> None:
        """Keep the free GPUs of drained nodes out of allocation: called before every round
        (attempts that ended on a drained node freed their GPUs). A drained node the cluster
        does not have (it left) holds nothing."""
        if not self.held:
            return
        for node in core.cluster.nodes:
            if self.holds(node.name):
                core.take_offline(core.cluster.node_gpus[node.index])

    def state(self, name: str, running: int) -> str:
        """The node's state as the drains and health checks see it, with `running` attempts on
        it (down is the shell's to say)."""
        if name in self.unhealthy:
            return UNHEALTHY
        if name not in self.drained:
            return UP
        return DRAINING if running else DRAINED

    def restore(self, name: str, drain: Drain) -> None:
        """A drain the shell stored (after a restart): held from the next `hold` on."""
        self.drained[name] = drain

    def why_held(self, name: str) -> str:
        """Why the node is held out of allocation, in a few words ("" if it is not)."""
        if name in self.unhealthy:
            return f"node {name} is unhealthy ({self.unhealthy[name].reason})"
        if name in self.drained:
            return f"node {name} is drained ({self.drained[name].reason})"
        if name in self.absent:
            return f"node {name} is out of the cluster"
        return ""

    def explain_waits(self, core: SchedulerCore) -> None:
        """Name the held-out nodes in the reasons of the jobs that wait for GPUs which those
        nodes hold: a round's "all are in use" is not why they wait when idle GPUs are held out
        (called after a round; the reasons only, no decision changes)."""
        if not self.held:
            return
        cluster = core.cluster
        used = {g for job in core.running_jobs() for g in job.placement}
        held = [
            (node.name, sum(1 for g in cluster.node_gpus[node.index] if g not in used))
            for node in cluster.nodes
            if self.holds(node.name)
        ]
        idle = [(name, count) for name, count in held if count]
        if not idle:
            return
        named = "; ".join(f"{count} on {self.why_held(name)}" for name, count in idle[:4])
        more = f"; {len(idle) - 4} more node(s)" if len(idle) > 4 else ""
        for job in core.pending_jobs():
            if job.status is JobStatus.PENDING and job.pending_reason.startswith(
                "waiting for free GPUs"
            ):
                job.pending_reason = f"waiting for free GPUs: idle GPUs held out: {named}{more}"
