"""The placement of the Tiresias simulator's `yarn` scheme (SymbioticLab/Tiresias, simulator/
switch.py, `ms_yarn_alloc_res`), for the `tiresias` preset.

All of a job's GPUs come from one rack (a "switch" there), racks tried in order:

* A job that fits in a node takes the first node, in cluster order, with enough free GPUs: first
  fit, not the tightest fit that `consolidate` looks for.
* A larger job takes `gpus // node size` wholly idle nodes (the first ones in order) and, when the
  size is not a multiple of the node size, the remainder on the first other node with that many
  free GPUs (idle or not).

Nodes are taken in cluster order (rack by rack, node by node), as Tiresias walks its node lists.
"""

from __future__ import annotations

from corral.core.cluster import Cluster
from corral.core.job import Job, JobSpec
from corral.core.placement.base import NotPlaced, Placed, Placement, not_enough, types_for


def yarn_nodes(
    cluster: Cluster, nodes: list[int], gpu_type: str, need: int
) -> list[tuple[int, int]]:
    """(node, GPUs taken) for a job of `need` GPUs in these nodes (one rack), or [] if none."""
    cells = cluster.nodes
    usable = [n for n in nodes if cells[n].gpu_type == gpu_type]
    if not usable:
        return []
    size = max(cells[n].total_gpus for n in usable)
    if need <= size:
        first = next((n for n in usable if cells[n].free_gpus >= need), None)
        return [] if first is None else [(first, need)]
    whole, remainder = divmod(need, size)
    idle = [n for n in usable if cells[n].total_gpus == size and cells[n].free_gpus == size]
    if len(idle) < whole:
        return []
    picks = [(n, size) for n in idle[:whole]]
    if remainder:
        taken = {n for n, _ in picks}
        last = next((n for n in usable if n not in taken and cells[n].free_gpus >= remainder), None)
        if last is None:
            return []
        picks.append((last, remainder))
    return picks


class Yarn(Placement):
    name = "yarn"
    summary = "Tiresias's simulator: first node that fits; a larger job whole idle nodes, one rack"

    def refusal(self, cluster: Cluster, spec: JobSpec) -> str | None:
        largest = max(rack.total_gpus for rack in cluster.racks)
        if spec.gpus > largest:
            return (
                f"placement yarn keeps a job in one rack, and the largest rack has {largest} GPUs"
            )
        return None

    def scope(self, cluster: Cluster, job: Job, now: float) -> str:
        largest_node = max(cluster.max_node_gpus_by_type.values())
        return "node" if job.spec.gpus <= largest_node else "rack"

    def place(self, cluster: Cluster, job: Job, now: float) -> Placed | NotPlaced:
        short = not_enough(cluster, job)
        if short is not None:
            return short
        need = job.spec.gpus
        for gpu_type in types_for(cluster, job):
            for rack, rack_nodes in enumerate(cluster.rack_nodes):
                if cluster.rack_free(rack) < need:
                    continue
                picks = yarn_nodes(cluster, rack_nodes, gpu_type, need)
                if picks:
                    chosen: list[int] = []
                    for node, count in picks:
                        chosen.extend(cluster.pick_in_node(node, count))
                    return Placed(tuple(chosen))
        largest_node = max(cluster.max_node_gpus_by_type.values())
        if need <= largest_node:
            return NotPlaced(f"yarn: needs {need} GPUs on one node; no node has them free")
        return NotPlaced(
            f"yarn: needs {need // largest_node} idle node(s) and the rest on one node, in one rack"
        )
