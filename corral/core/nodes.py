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

Drains are kept by node name, so they outlive a rebuild of the cluster (nodes joining or
leaving) and a restart (the live manager stores each change and gives them back here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corral.core.actions import Preempt
    from corral.core.cluster import Cluster
    from corral.core.protocol import SchedulerCore

UP, DRAINING, DRAINED, DOWN = "up", "draining", "drained", "down"
#: Every state a node may be in, in the order `corral node ls` and the metric list them.
STATES = (UP, DRAINING, DRAINED, DOWN)


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
class NodeChange:
    """A drain (`drain` True) or a resume of a node at an instant, as a shell replays it: from a
    live manager's history (export-trace) or a cluster config's maintenance windows."""

    at: float
    node: str
    drain: bool
    reason: str = ""
    preempt: bool = False


def apply_change(
    drains: NodeDrains, core: SchedulerCore, change: NodeChange, now: float
) -> list[Preempt]:
    """Carry out one change (a resume of a node not drained does nothing)."""
    if change.drain:
        return drains.drain(
            core, change.node, now, reason=change.reason, by="replay", preempt=change.preempt
        )
    drains.resume(core, change.node)
    return []


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


class NodeDrains:
    """The drained nodes, by name, and what a drain and a resume do to the core."""

    def __init__(self) -> None:
        self.drained: dict[str, Drain] = {}

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
        """Bring a drained node back (False: it was not drained). Its GPUs held for any other
        reason (a dead node, leftover processes) are the shell's to hold again before the next
        round, as it does after every change."""
        node = node_index(core.cluster, name)
        if self.drained.pop(name, None) is None:
            return False
        core.bring_online(core.cluster.node_gpus[node])
        return True

    def hold(self, core: SchedulerCore) -> None:
        """Keep the free GPUs of drained nodes out of allocation: called before every round
        (attempts that ended on a drained node freed their GPUs). A drained node the cluster
        does not have (it left) holds nothing."""
        if not self.drained:
            return
        for node in core.cluster.nodes:
            if node.name in self.drained:
                core.take_offline(core.cluster.node_gpus[node.index])

    def state(self, name: str, running: int) -> str:
        """The node's state as the drains see it, with `running` attempts on it (down is the
        shell's to say)."""
        if name not in self.drained:
            return UP
        return DRAINING if running else DRAINED

    def restore(self, name: str, drain: Drain) -> None:
        """A drain the shell stored (after a restart): held from the next `hold` on."""
        self.drained[name] = drain
