"""Gandiva's migration to defragment: move a few small jobs so that free GPUs come together.

Gandiva (Xiao et al., OSDI'18, section 4.1) migrates running jobs between GPUs to undo the
fragmentation that jobs of different sizes leave behind. Here: a waiting job that must run on one
node (its placement's scope is "node") cannot be placed although enough GPUs of its type are free
in total. `Migration.plan` looks for the node that needs the fewest moves (then the fewest GPUs
moved) to get the job's GPUs free: it moves running jobs that lie wholly on that node to free GPUs
on other nodes (each to the tightest node that holds it whole), so the moved jobs stay
consolidated. The scheduler carries a move out as a preemption and a start on the new GPUs
(`Preempt` + `Start`, resumed: the job pays the restore stall), counted as a migration, not a
preemption. A job started at this instant is never moved, nor one sharing its GPUs (packing).

Work is bounded: at most `max_moves` moves per plan, `max_nodes` candidate nodes per plan (the
ones with the most free GPUs), `max_plans_per_round` plans per scheduling round, and a size that
found no plan is not tried again in the round for a job of the same types needing as many or more.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from corral.core.cluster import Cluster
from corral.core.job import Job
from corral.core.migration_options import MAX_MOVES, MAX_NODES, MAX_PLANS_PER_ROUND
from corral.core.migration_options import MigrationOptions as MigrationOptions
from corral.core.placement.base import Placed
from corral.core.plugin import Services
from corral.core.stages import RoundHost, Stage

if TYPE_CHECKING:
    from corral.core.actions import Action


@dataclass(slots=True, frozen=True)
class Move:
    job: Job
    to_node: int


@dataclass(slots=True, frozen=True)
class MigrationPlan:
    node: int  # the node whose GPUs the moves free for the waiting job
    moves: tuple[Move, ...]


class Migration(Stage):
    name = "migration"
    summary = "Gandiva's migration: move running jobs to free a whole node for a waiting one"
    Options = MigrationOptions
    point = "defragment"

    @classmethod
    def from_options(cls, options: Any, services: Services) -> Migration:
        return cls(options.max_moves, options.max_nodes, options.max_plans_per_round)

    def __init__(
        self,
        max_moves: int = MAX_MOVES,
        max_nodes: int = MAX_NODES,
        max_plans_per_round: int = MAX_PLANS_PER_ROUND,
    ) -> None:
        if min(max_moves, max_nodes, max_plans_per_round) < 1:
            raise ValueError("migration bounds must be at least 1")
        self.max_moves = max_moves
        self.max_nodes = max_nodes
        self.max_plans_per_round = max_plans_per_round
        self.migrations = 0  # jobs moved so far
        self._plans = 0
        self._no_plan: dict[frozenset[str] | None, int] = {}
        self._on_node: dict[int, list[Job]] | None = None

    def new_round(self) -> None:
        self._plans = 0
        self._no_plan.clear()
        self._on_node = None

    def try_start(self, host: RoundHost, job: Job, now: float, actions: list[Action]) -> bool:
        """Move a few running jobs so that the GPUs the job needs on one node come free
        together, then place it there (never a job started now, nor one sharing its GPUs)."""
        cluster, placement = host.cluster, host.placement
        if placement.scope(cluster, job, now) != "node":
            return False

        def movable(other: Job) -> bool:
            return other.run_started_at != now and not host.is_shared(other)

        plan = self.plan(cluster, job, host.running_jobs(), movable)
        if plan is None:
            return False
        for move in plan.moves:
            host.move(move.job, move.to_node, job.id, now, actions)
            self.migrations += 1
        result = placement.place(cluster, job, now)
        if not isinstance(result, Placed):
            return False
        host.start_on(job, result, now, actions)
        return True

    def counters(self) -> dict[str, int]:
        return {"migrations": self.migrations}

    def plan(
        self,
        cluster: Cluster,
        job: Job,
        running: Iterable[Job],
        movable: Callable[[Job], bool],
    ) -> MigrationPlan | None:
        """The moves that free `job.spec.gpus` GPUs on one node, or None (none within bounds,
        enough GPUs already free on a node, or too few free in all)."""
        need, types = job.spec.gpus, job.spec.gpu_types
        if self._plans >= self.max_plans_per_round or need >= self._no_plan.get(types, need + 1):
            return None
        gpu_types = [  # enough free GPUs in all, and nodes big enough
            t
            for t in cluster.gpu_types
            if job.spec.accepts(t)
            and cluster.free_by_type[t] >= need
            and cluster.max_node_gpus_by_type[t] >= need
        ]
        fits = any(next(cluster.nodes_with_free(t, need), None) is not None for t in gpu_types)
        if not gpu_types or fits:
            return None  # too few free GPUs, or it fits already: not a fragmentation problem
        self._plans += 1
        if self._on_node is None:  # movable jobs lying wholly on one node, by node
            self._on_node = {}
            for other in running:
                nodes = cluster.nodes_of(other.placement)
                if len(nodes) == 1 and movable(other):
                    self._on_node.setdefault(nodes.pop(), []).append(other)
        best: tuple[int, int, int, tuple[Move, ...]] | None = None
        for gpu_type in gpu_types:
            for node in itertools.islice(self._candidates(cluster, gpu_type, need), self.max_nodes):
                moves = self._moves_for(cluster, gpu_type, node, need - cluster.node_free(node))
                if moves is not None:
                    moved = sum(m.job.spec.gpus for m in moves)
                    candidate = (len(moves), moved, node, moves)
                    if best is None or candidate[:3] < best[:3]:
                        best = candidate
        if best is None:
            self._no_plan[types] = min(need, self._no_plan.get(types, need))
            return None
        self._on_node = None  # the moves change where jobs are
        return MigrationPlan(best[2], best[3])

    @staticmethod
    def _candidates(cluster: Cluster, gpu_type: str, need: int) -> Iterable[int]:
        for node in cluster.nodes_most_free_first(gpu_type):
            if cluster.nodes[node].total_gpus >= need:
                yield node

    def _moves_for(
        self, cluster: Cluster, gpu_type: str, node: int, missing: int
    ) -> tuple[Move, ...] | None:
        """Fewest jobs on the node that free `missing` GPUs and fit whole on other nodes; among
        as few, the fewest GPUs moved (ties: the jobs that arrived first)."""
        assert self._on_node is not None
        jobs = sorted(self._on_node.get(node, []), key=lambda j: (j.spec.gpus, j.seq))
        room = {
            other: cluster.node_free(other)
            for other in cluster.nodes_most_free_first(gpu_type)
            if other != node
        }
        for count in range(1, min(self.max_moves, len(jobs)) + 1):
            subsets = list(itertools.combinations(jobs, count))
            subsets.sort(key=lambda c: sum(j.spec.gpus for j in c))
            for subset in subsets:
                if sum(j.spec.gpus for j in subset) < missing:
                    continue
                moves = self._destinations(subset, dict(room))
                if moves is not None:
                    return moves
        return None

    @staticmethod
    def _destinations(jobs: tuple[Job, ...], room: dict[int, int]) -> tuple[Move, ...] | None:
        moves = []
        for job in sorted(jobs, key=lambda j: -j.spec.gpus):  # largest first, tightest node
            fitting = [(free, node) for node, free in room.items() if free >= job.spec.gpus]
            if not fitting:
                return None
            _, target = min(fitting)
            room[target] -= job.spec.gpus
            moves.append(Move(job, target))
        return tuple(moves)
