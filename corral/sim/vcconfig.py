"""Size virtual clusters from a trace: each VC gets node cells in proportion to its GPU demand.

Every VC first gets enough nodes for its largest job (so no job is refused), then the remaining
nodes go by the largest-remainder method in proportion to its GPU-seconds of work. The result is a
config in the format of corral.core.config, racks of nodes as in the `--cluster` shorthand.
"""

from __future__ import annotations

import math
from collections import defaultdict

from corral.core.job import JobSpec


class VcSizingError(ValueError):
    pass


def size_vcs(jobs: list[JobSpec], nodes: int, gpus_per_node: int) -> dict[str, int]:
    demand: dict[str, float] = defaultdict(float)
    largest: dict[str, int] = defaultdict(int)
    for spec in jobs:
        demand[spec.vc] += spec.gpus * (spec.duration_s or 0.0)
        largest[spec.vc] = max(largest[spec.vc], spec.gpus)
    minimum = {vc: math.ceil(largest[vc] / gpus_per_node) for vc in demand}
    spare = nodes - sum(minimum.values())
    if spare < 0:
        raise VcSizingError(
            f"{len(demand)} VCs need at least {sum(minimum.values())} nodes for their largest "
            f"jobs; the cluster has {nodes}"
        )
    total = sum(demand.values()) or 1.0
    exact = {vc: spare * demand[vc] / total for vc in demand}
    extra = {vc: math.floor(share) for vc, share in exact.items()}
    left = spare - sum(extra.values())
    for vc in sorted(exact, key=lambda v: (extra[v] - exact[v], v))[:left]:
        extra[vc] += 1
    return {vc: minimum[vc] + extra[vc] for vc in sorted(demand)}


def vc_config(
    jobs: list[JobSpec], nodes: int, gpus_per_node: int, racks: int, gpu_type: str = "v100"
) -> dict[str, object]:
    if nodes % racks:
        raise VcSizingError(f"{nodes} nodes do not split evenly into {racks} racks")
    node_type, rack_type = f"{gpu_type.upper()}-NODE", f"{gpu_type.upper()}-RACK"
    sizes = size_vcs(jobs, nodes, gpus_per_node)
    return {
        "cell_types": {
            node_type: {"child": gpu_type, "count": gpus_per_node, "node": True},
            rack_type: {"child": node_type, "count": nodes // racks},
        },
        "physical_cells": [{"type": rack_type, "count": racks}],
        "virtual_clusters": {vc: {node_type: count} for vc, count in sizes.items()},
    }
