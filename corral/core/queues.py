"""Hierarchical queues: VCs grouped under departments, each level with a quota, an over-quota
weight and a limit (the shape of KAI Scheduler's two-level queues and of Kueue's cohorts).

A department is no VC (no job names it): it is the parent of VCs (or of other departments).
Its quota is guaranteed to its children together; what a child leaves idle goes to its siblings
first, and only what the whole department leaves idle goes to other departments. The shares are
found by water-filling, level by level from the cluster down (`fair_shares`):

1. every queue gets what it asks for up to its quota (its guarantee);
2. what its parent's share leaves over is split among the queues that ask for more, in
   proportion to their over-quota weights, none given more than it asks for or than its limit;
   a queue that needs less than its part hands the rest back to be split again.

A department's share is then split among its children the same way, so a team's idle quota
stays in its department unless the department as a whole has no use for it. Pure data and
arithmetic: the admission that acts on the shares is corral.core.admission.queues.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: Shares are real numbers; a count within this of a share is within it.
EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class Queue:
    """One level of the tree: a VC (`is_vc`) or a department."""

    name: str
    #: The department above it; None: directly under the cluster.
    parent: str | None
    #: Guaranteed GPUs (a VC's: its cells' GPUs).
    quota: int
    #: Its part of what its parent's share leaves over, against its siblings' weights.
    weight: float = 1.0
    #: The most GPUs it may use at once, borrowed ones included; None: no limit.
    limit: int | None = None
    is_vc: bool = True


@dataclass(frozen=True, slots=True)
class QueueTree:
    """Every VC and department, by name (VCs first, in config order)."""

    queues: dict[str, Queue]

    def children(self, name: str | None) -> list[str]:
        """The queues directly under `name` (None: the cluster), in declaration order."""
        return [q.name for q in self.queues.values() if q.parent == name]

    def chain(self, name: str) -> list[str]:
        """The queue and every department above it, itself first."""
        out = [name]
        parent = self.queues[name].parent
        while parent is not None:
            out.append(parent)
            parent = self.queues[parent].parent
        return out

    def vcs(self) -> list[str]:
        return [q.name for q in self.queues.values() if q.is_vc]

    def departments(self) -> list[str]:
        return [q.name for q in self.queues.values() if not q.is_vc]

    def usage(self, vc_usage: Mapping[str, float]) -> dict[str, float]:
        """Each queue's GPUs: a VC's as given, a department's its children's together."""
        out: dict[str, float] = dict.fromkeys(self.queues, 0.0)
        for vc in self.vcs():
            for name in self.chain(vc):
                out[name] += vc_usage.get(vc, 0)
        return out

    def fair_shares(
        self, vc_demand: Mapping[str, float], capacity: float, *, across: bool = True
    ) -> dict[str, float]:
        """Each queue's share of `capacity` GPUs, given what each VC asks for (its running and
        waiting guaranteed jobs' GPUs). `across` False: a department (or a VC under no
        department) is lent nothing beyond its quota, so idle quota is lent only within a
        department."""
        demand = self.usage(vc_demand)
        shares: dict[str, float] = {}

        def divide(amount: float, names: list[str], lend: bool) -> None:
            given = {n: min(demand[n], float(self.queues[n].quota)) for n in names}
            left = amount - sum(given.values())
            if lend:
                wanting = [n for n in names if _room(self.queues[n], demand[n]) > given[n]]
                while left > EPSILON and wanting:
                    weights = sum(self.queues[n].weight for n in wanting)
                    handed = 0.0
                    still: list[str] = []
                    for n in wanting:
                        part = left * self.queues[n].weight / weights
                        room = _room(self.queues[n], demand[n]) - given[n]
                        if part >= room - EPSILON:
                            given[n] += room
                            handed += room
                        else:
                            given[n] += part
                            handed += part
                            still.append(n)
                    left -= handed
                    if len(still) == len(wanting):
                        break  # each took its part: nothing left over
                    wanting = still
            for n in names:
                shares[n] = given[n]
                below = self.children(n)
                if below:
                    divide(given[n], below, True)

        divide(float(capacity), self.children(None), across)
        return shares


def _room(queue: Queue, demand: float) -> float:
    """The most a queue could be given: what it asks for, up to its limit."""
    return demand if queue.limit is None else min(demand, float(queue.limit))


def flat_tree(quota: Mapping[str, int]) -> QueueTree:
    """VCs with no department, each of weight 1 and no limit."""
    return QueueTree({vc: Queue(vc, None, gpus) for vc, gpus in quota.items()})
