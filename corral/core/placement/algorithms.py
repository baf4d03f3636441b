"""The placement searches that the named placements combine.

All of them keep a gang on one GPU type and use the cluster's incremental free counts: a
node-local job finds its tightest-fitting node through the per-type buckets; a multi-node job
looks only at racks that have enough free GPUs.

A multi-node search takes from each node a multiple of the job's `gpus_per_worker` (one worker
process runs on one machine): a node with `free` free GPUs offers `free - free % unit` of them,
and a node offering none is skipped. The gang size is a multiple of the unit too, so every
node's share, the last one's included, holds whole workers.
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
    cluster: Cluster, nodes: list[int], gpu_type: str, need: int, unit: int
) -> list[tuple[int, int]] | None:
    """Greedy by most usable free GPUs: the fewest nodes of `nodes` that together hold `need`."""
    ranked: list[tuple[int, int]] = []  # (-usable free GPUs, node)
    cells = cluster.nodes
    for n in nodes:
        cell = cells[n]
        if cell.gpu_type == gpu_type:
            free = cell.free_gpus
            usable = free - free % unit
            if usable > 0:
                ranked.append((-usable, n))
    ranked.sort()
    picks: list[tuple[int, int]] = []
    for negative_usable, node in ranked:
        take = min(-negative_usable, need)
        picks.append((node, take))
        need -= take
        if need == 0:
            return _tighten_last(cluster, picks, nodes, gpu_type, unit)
    return None


def _tighten_last(
    cluster: Cluster, picks: list[tuple[int, int]], nodes: list[int], gpu_type: str, unit: int
) -> list[tuple[int, int]]:
    """The last node only supplies the remainder (whole workers): use the tightest node (fewest
    free GPUs, then lowest index) that still offers it."""
    last_node, remainder = picks[-1]
    used = {n for n, _ in picks}
    best, best_free = last_node, cluster.node_free(last_node)  # it offers the remainder
    cells = cluster.nodes
    for n in nodes:
        cell = cells[n]
        if n in used or cell.gpu_type != gpu_type:
            continue
        free = cell.free_gpus
        if free - free % unit >= remainder and (
            free < best_free or (free == best_free and n < best)
        ):
            best, best_free = n, free
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
    unit = job.spec.gpus_per_worker
    best: tuple[tuple[int, int, int], list[tuple[int, int]]] | None = None
    for gpu_type in types_for(cluster, job):
        for rack, rack_nodes in enumerate(cluster.rack_nodes):
            if cluster.rack_free(rack) < need:
                continue
            picks = _fewest_nodes(cluster, rack_nodes, gpu_type, need, unit)
            if picks is None:
                continue
            score = (len(picks), cluster.rack_free(rack), rack)
            if best is None or score < best[0]:
                best = (score, picks)
    return None if best is None else _node_gpus(cluster, best[1])


def fewest_nodes_anywhere(cluster: Cluster, job: Job) -> tuple[int, ...] | None:
    """Fewest nodes in the whole cluster, racks ignored (Philly's relaxed placement)."""
    unit = job.spec.gpus_per_worker
    cells = cluster.nodes
    for gpu_type in types_for(cluster, job):
        if cluster.free_by_type.get(gpu_type, 0) < job.spec.gpus:
            continue
        need = job.spec.gpus
        picks: list[tuple[int, int]] = []
        # Most free first is also most usable first: free - free % unit never falls as free grows.
        for node in cluster.nodes_most_free_first(gpu_type):
            free = cells[node].free_gpus
            if free < unit:
                break  # this node and all after it offer no whole worker
            take = free - free % unit
            if take > need:
                take = need
            picks.append((node, take))
            need -= take
            if need == 0:
                return _node_gpus(cluster, picks)
    return None


def first_free(cluster: Cluster, job: Job) -> tuple[int, ...] | None:
    """The first free GPUs in cluster order (rack by rack, node by node), one GPU type."""
    need = job.spec.gpus
    unit = job.spec.gpus_per_worker
    cells = cluster.nodes
    for gpu_type in types_for(cluster, job):
        if cluster.free_by_type.get(gpu_type, 0) < need:
            continue
        chosen: list[int] = []
        for rack, rack_nodes in enumerate(cluster.rack_nodes):
            if cluster.rack_free(rack) == 0:
                continue
            for node in rack_nodes:
                cell = cells[node]
                free = cell.free_gpus
                if cell.gpu_type != gpu_type or free < unit:
                    continue
                usable, left = free - free % unit, need - len(chosen)
                chosen.extend(cluster.free_gpus_of_node(node)[: usable if usable < left else left])
                if len(chosen) == need:
                    return tuple(chosen)
    return None
