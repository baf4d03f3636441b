"""cache-aware: Philly's locality rule, preferring the nodes whose cache holds the job's data set.

SiloD (Zhao et al., EuroSys'23) places jobs knowing what each node caches. This placement keeps
consolidate's rule (one node if the job fits in one, else the fewest nodes of one rack) and so
accepts exactly the placements consolidate accepts, but chooses among them by the cache
(`corral.core.cache.DataCache`), for a job that would be IO-bound there without it:

* a job that fits in one node goes to the node holding the largest part of its data set among
  those with room (ties: the tightest fit, then the lowest index), and to consolidate's best-fit
  node when no node with room holds any of it;
* a multi-node job takes, in each rack, the nodes with the most free GPUs first as consolidate
  does, but among equally free nodes those caching more of its data set, and prefers, among racks
  needing equally few nodes, the one whose chosen nodes cache the most.

A job that reads no data set, or that remote storage alone keeps at full speed, is placed as
consolidate would place it; so is every job when the placement is given no cache.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from corral.core.cache import DataCache
from corral.core.cluster import Cluster
from corral.core.job import Job
from corral.core.placement.base import (
    NotPlaced,
    Placed,
    Placement,
    largest_rack,
    not_enough,
    types_for,
)
from corral.core.placement.named import consolidated, consolidated_scope
from corral.core.plugin import Services, needs


class CacheAware(Placement):
    name = "cache-aware"
    summary = "SiloD: consolidate, on the node whose data cache holds most of the job's dataset"

    @classmethod
    def from_options(cls, options: Any, services: Services) -> Placement:
        needs(services.cache, f"placement {cls.name}", "node data caches (--cache-gb-per-node)")
        return cls(services.cache)

    def __init__(self, cache: DataCache | None = None) -> None:
        self.cache = cache

    def mode(self, job: Job, now: float) -> str:
        return "consolidate"  # it fits exactly where consolidate fits

    def scope(self, cluster: Cluster, job: Job, now: float) -> str:
        return consolidated_scope(cluster, job)

    def place(self, cluster: Cluster, job: Job, now: float) -> Placed | NotPlaced:
        cache = self.cache
        read = None if cache is None else cache.reads(job.spec)
        if cache is None or read is None or not_enough(cluster, job) is not None:
            return consolidated(cluster, job)

        def cached_gb(node: int) -> float:
            """GB of the data set on the node, counted only where the job would be IO-bound."""
            return cache.nodes[node].gb(read.dataset) if cache.io_bound(read, node) else 0.0

        need = job.spec.gpus
        if need <= max(cluster.max_node_gpus_by_type.values()):
            node = _cached_node(cluster, job, cache.holders(read.dataset), cached_gb)
            if node is not None:
                return Placed(tuple(cluster.pick_in_node(node, need)))
        elif need <= largest_rack(cluster, job.spec.gpus_per_worker):
            picks = _cached_rack(cluster, job, cached_gb)
            if picks is not None:
                return Placed(tuple(g for n, k in picks for g in cluster.pick_in_node(n, k)))
        return consolidated(cluster, job)


def _cached_node(
    cluster: Cluster, job: Job, holders: Iterable[int], cached_gb: Callable[[int], float]
) -> int | None:
    """The node with room caching most of the data set; then the tightest; then the lowest."""
    best: tuple[float, int, int] | None = None
    types = types_for(cluster, job)
    for node in holders:
        free = cluster.node_free(node)
        if free < job.spec.gpus or cluster.nodes[node].gpu_type not in types:
            continue
        cached = cached_gb(node)
        if cached > 0 and (best is None or (-cached, free, node) < best):
            best = (-cached, free, node)
    return None if best is None else best[2]


def _cached_rack(
    cluster: Cluster, job: Job, cached_gb: Callable[[int], float]
) -> list[tuple[int, int]] | None:
    """Fewest nodes in one rack; among equals the rack whose chosen nodes cache most."""
    best: tuple[tuple[float, ...], list[tuple[int, int]]] | None = None
    for gpu_type in types_for(cluster, job):
        for rack, rack_nodes in enumerate(cluster.rack_nodes):
            if cluster.rack_free(rack) < job.spec.gpus:
                continue
            picks = _fewest_nodes(
                cluster, rack_nodes, gpu_type, job.spec.gpus, job.spec.gpus_per_worker, cached_gb
            )
            if picks is None:
                continue
            cached = sum(cached_gb(n) for n, _ in picks)
            score = (len(picks), -cached, cluster.rack_free(rack), rack)
            if best is None or score < best[0]:
                best = (score, picks)
    return None if best is None else best[1]


def _fewest_nodes(
    cluster: Cluster,
    nodes: list[int],
    gpu_type: str,
    need: int,
    unit: int,
    cached_gb: Callable[[int], float],
) -> list[tuple[int, int]] | None:
    """Most usable free GPUs first (whole workers of `unit` GPUs, as in `algorithms`), caching
    more first among equals; the remainder from the node that caches most among those that
    offer it (then the tightest)."""
    offered: dict[int, int] = {}  # node -> the GPUs it offers: whole workers only
    for n in nodes:
        cell = cluster.nodes[n]
        free = cell.free_gpus
        if cell.gpu_type == gpu_type and free >= unit:
            offered[n] = free - free % unit
    ranked = sorted(offered, key=lambda n: (-offered[n], -cached_gb(n), n))
    picks: list[tuple[int, int]] = []
    for node in ranked:
        take = min(offered[node], need)
        picks.append((node, take))
        need -= take
        if need == 0:
            remainder = picks[-1][1]
            used = {n for n, _ in picks[:-1]}
            fits = [n for n in offered if n not in used and offered[n] >= remainder]
            last = min(fits, key=lambda n: (-cached_gb(n), cluster.node_free(n), n))
            picks[-1] = (last, remainder)
            return picks
    return None
