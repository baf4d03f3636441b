"""The placement searches that the named placements combine.

All of them keep a gang on one GPU type and use the cluster's incremental free counts: a
node-local job finds its tightest-fitting node through the per-type buckets; a multi-node job
looks only at racks that have enough free GPUs.
"""

from __future__ import annotations

from corral.core.cluster import Cluster
from corral.core.job import Job
from corral.core.placement.base import types_for


def _node_gpus(cluster: Cluster, picks: list[tuple[int, int]]) -> tuple[int, ...]:
    chosen: list[int] = []
    for node, count in picks:
        chosen.extend(cluster.pick_in_node(node, count))
    return tuple(chosen)


def _fewest_nodes(
    cluster: Cluster, nodes: list[int], gpu_type: str, need: int
) -> list[tuple[int, int]] | None:
    """Greedy by most free GPUs: the fewest nodes of `nodes` that together hold `need` GPUs."""
    ranked = sorted(
        (n for n in nodes if cluster.nodes[n].gpu_type == gpu_type and cluster.node_free(n) > 0),
        key=lambda n: (-cluster.node_free(n), n),
    )
    picks: list[tuple[int, int]] = []
    for node in ranked:
        take = min(cluster.node_free(node), need)
        picks.append((node, take))
        need -= take
        if need == 0:
            return _tighten_last(cluster, picks, nodes, gpu_type)
    return None


def _tighten_last(
    cluster: Cluster, picks: list[tuple[int, int]], nodes: list[int], gpu_type: str
) -> list[tuple[int, int]]:
    """The last node only supplies the remainder: use the tightest node that still fits it."""
    last_node, remainder = picks[-1]
    used = {n for n, _ in picks}
    candidates = [
        n
        for n in nodes
        if (n == last_node or n not in used)
        and cluster.nodes[n].gpu_type == gpu_type
        and cluster.node_free(n) >= remainder
    ]
    best = min(candidates, key=lambda n: (cluster.node_free(n), n))
    picks[-1] = (best, remainder)
    return picks


def best_fit_node(cluster: Cluster, job: Job) -> tuple[int, ...] | None:
    """The node with the fewest free GPUs that still fits the whole job (any acceptable type)."""
    best: tuple[int, int] | None = None
    for gpu_type in types_for(cluster, job):
        node = next(cluster.nodes_with_free(gpu_type, job.spec.gpus), None)
        if node is not None and (best is None or cluster.node_free(node) < best[0]):
            best = (cluster.node_free(node), node)
    if best is None:
        return None
    return tuple(cluster.pick_in_node(best[1], job.spec.gpus))


def fewest_nodes_in_rack(cluster: Cluster, job: Job) -> tuple[int, ...] | None:
    """Fewest nodes inside a single rack; among equals, the rack left with the least free."""
    need = job.spec.gpus
    best: tuple[tuple[int, int, int], list[tuple[int, int]]] | None = None
    for gpu_type in types_for(cluster, job):
        for rack, rack_nodes in enumerate(cluster.rack_nodes):
            if cluster.rack_free(rack) < need:
                continue
            picks = _fewest_nodes(cluster, rack_nodes, gpu_type, need)
            if picks is None:
                continue
            score = (len(picks), cluster.rack_free(rack), rack)
            if best is None or score < best[0]:
                best = (score, picks)
    return None if best is None else _node_gpus(cluster, best[1])


def fewest_nodes_anywhere(cluster: Cluster, job: Job) -> tuple[int, ...] | None:
    """Fewest nodes in the whole cluster, racks ignored (Philly's relaxed placement)."""
    for gpu_type in types_for(cluster, job):
        if cluster.free_by_type.get(gpu_type, 0) < job.spec.gpus:
            continue
        need = job.spec.gpus
        picks: list[tuple[int, int]] = []
        for node in cluster.nodes_most_free_first(gpu_type):
            take = min(cluster.node_free(node), need)
            picks.append((node, take))
            need -= take
            if need == 0:
                return _node_gpus(cluster, picks)
    return None


def first_free(cluster: Cluster, job: Job) -> tuple[int, ...] | None:
    """The first free GPUs in cluster order (rack by rack, node by node), one GPU type."""
    for gpu_type in types_for(cluster, job):
        if cluster.free_by_type.get(gpu_type, 0) < job.spec.gpus:
            continue
        chosen: list[int] = []
        for rack, rack_nodes in enumerate(cluster.rack_nodes):
            if cluster.rack_free(rack) == 0:
                continue
            for node in rack_nodes:
                if cluster.nodes[node].gpu_type != gpu_type or cluster.node_free(node) == 0:
                    continue
                chosen.extend(cluster.free_gpus_of_node(node)[: job.spec.gpus - len(chosen)])
                if len(chosen) == job.spec.gpus:
                    return tuple(chosen)
    return None
