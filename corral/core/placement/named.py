"""The placements a user chooses by name: consolidate, relax, profile, any."""

from __future__ import annotations

import math
from typing import Any

from corral.core.cluster import Cluster
from corral.core.job import Job
from corral.core.placement.algorithms import (
    best_fit_node,
    fewest_nodes_anywhere,
    fewest_nodes_in_rack,
    first_free,
)
from corral.core.placement.base import NotPlaced, Placed, Placement, largest_rack, not_enough
from corral.core.placement.named_options import DEFAULT_RELAX_AFTER_S as DEFAULT_RELAX_AFTER_S
from corral.core.placement.named_options import ProfileOptions, RelaxOptions
from corral.core.plugin import Services

#: The reasons a consolidated placement fails for locality (formatted only when read).
_ONE_NODE = "locality: needs {} GPUs on one node; no node has them free"
_ONE_RACK = "locality: needs {} GPUs{} within one rack; no rack has them free"
#: Each of them while the job waits to relax, told when it relaxes.
_BEFORE_RELAXING: dict[object, str] = {
    _ONE_NODE: _ONE_NODE + " (relaxes at t={:.0f}s)",
    _ONE_RACK: _ONE_RACK + " (relaxes at t={:.0f}s)",
}


def consolidated(cluster: Cluster, job: Job) -> Placed | NotPlaced:
    """Philly's locality rule: one node if the job fits in one, else fewest nodes in one rack
    (each node's share whole workers, see `algorithms`)."""
    short = not_enough(cluster, job)
    if short is not None:
        return short
    largest_node = max(cluster.max_node_gpus_by_type.values())
    if job.spec.gpus <= largest_node:
        gpus = best_fit_node(cluster, job)
        if gpus is not None:
            return Placed(gpus)
        if any(
            job.spec.accepts(t) and size >= job.spec.gpus
            for t, size in cluster.max_node_gpus_by_type.items()
        ):
            return NotPlaced((_ONE_NODE, job.spec.gpus))
    gpus = fewest_nodes_in_rack(cluster, job)
    if gpus is not None:
        return Placed(gpus)
    if job.spec.gpus > largest_rack(cluster, job.spec.gpus_per_worker):
        # No rack can ever hold it: fewest nodes across racks is the best locality there is.
        gpus = fewest_nodes_anywhere(cluster, job)
        if gpus is not None:
            return Placed(gpus)
    unit = job.spec.gpus_per_worker
    workers = "" if unit == 1 else f" ({unit} per worker, each worker on one node)"
    return NotPlaced((_ONE_RACK, job.spec.gpus, workers))


def _no_gpus_of_one_type(job: Job) -> NotPlaced:
    unit = job.spec.gpus_per_worker
    if unit == 1:
        return NotPlaced("no GPUs of one type free for it")
    return NotPlaced(f"no GPUs of one type free for it: each worker needs {unit} GPUs on one node")


def consolidated_scope(cluster: Cluster, job: Job) -> str:
    if any(
        job.spec.accepts(t) and size >= job.spec.gpus
        for t, size in cluster.max_node_gpus_by_type.items()
    ):
        return "node"
    if job.spec.gpus <= largest_rack(cluster, job.spec.gpus_per_worker):
        return "rack"
    return "cluster"


class Consolidate(Placement):
    name = "consolidate"
    pure = True
    confined = True
    summary = "Philly's locality: one node if the job fits in one, else fewest nodes in one rack"

    def scope(self, cluster: Cluster, job: Job, now: float) -> str:
        return consolidated_scope(cluster, job)

    def place(self, cluster: Cluster, job: Job, now: float) -> Placed | NotPlaced:
        return consolidated(cluster, job)


class Relax(Placement):
    """Consolidate first; after `relax_after_s` of waiting, take the fewest nodes anywhere."""

    name = "relax"
    pure = True
    confined = True
    summary = "consolidate, relaxed to the fewest nodes anywhere after waiting (Philly)"
    Options = RelaxOptions

    @classmethod
    def from_options(cls, options: Any, services: Services) -> Placement:
        return cls(options.after_s)

    def __init__(self, relax_after_s: float = DEFAULT_RELAX_AFTER_S) -> None:
        if relax_after_s < 0:
            raise ValueError("relax_after_s must not be negative")
        self.relax_after_s = relax_after_s

    def relaxes_at(self, job: Job) -> float:
        return job.queued_since + self.relax_after_s

    def mode(self, job: Job, now: float) -> str:
        return "relaxed" if now >= self.relaxes_at(job) else "consolidate"

    def scope(self, cluster: Cluster, job: Job, now: float) -> str:
        return "cluster" if now >= self.relaxes_at(job) else consolidated_scope(cluster, job)

    def changes_at(self, job: Job, now: float) -> float:
        at = self.relaxes_at(job)
        return at if at > now else math.inf

    def place(self, cluster: Cluster, job: Job, now: float) -> Placed | NotPlaced:
        result = consolidated(cluster, job)
        if isinstance(result, Placed):
            return result
        at = self.relaxes_at(job)
        if now < at:
            why = result.why
            if not isinstance(why, str):
                template = _BEFORE_RELAXING.get(why[0])
                if template is not None:
                    return NotPlaced((template, *why[1:], at))
            return result
        gpus = fewest_nodes_anywhere(cluster, job)
        if gpus is None:
            return result
        return Placed(gpus, True)  # relaxed (positional: cheaper to build)


class Profile(Placement):
    """Tiresias: consolidate only jobs whose model slows down when spread over nodes."""

    name = "profile"
    pure = True
    confined = True
    summary = "Tiresias: consolidate only the jobs whose model slows down when spread"
    Options = ProfileOptions

    @classmethod
    def from_options(cls, options: Any, services: Services) -> Placement:
        return cls(options.sensitive_above)

    def __init__(self, sensitive_above: float = 1.1) -> None:
        self.sensitive_above = sensitive_above

    def sensitive(self, job: Job) -> bool:
        return job.spec.spread_slowdown > self.sensitive_above

    def mode(self, job: Job, now: float) -> str:
        return "consolidate" if self.sensitive(job) else "anywhere"

    def scope(self, cluster: Cluster, job: Job, now: float) -> str:
        return consolidated_scope(cluster, job) if self.sensitive(job) else "cluster"

    def place(self, cluster: Cluster, job: Job, now: float) -> Placed | NotPlaced:
        if self.sensitive(job):
            return consolidated(cluster, job)
        short = not_enough(cluster, job)
        if short is not None:
            return short
        gpus = fewest_nodes_anywhere(cluster, job)
        return Placed(gpus) if gpus is not None else _no_gpus_of_one_type(job)


class AnyFree(Placement):
    name = "any"
    pure = True
    summary = "the first free GPUs, no locality"

    def place(self, cluster: Cluster, job: Job, now: float) -> Placed | NotPlaced:
        short = not_enough(cluster, job)
        if short is not None:
            return short
        gpus = first_free(cluster, job)
        return Placed(gpus) if gpus is not None else _no_gpus_of_one_type(job)
