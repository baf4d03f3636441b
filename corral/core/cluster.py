"""The cluster as a tree of cells (HiveD): GPU -> optional switch/socket -> node -> rack -> cluster.

Each cell keeps its count of free GPUs, updated on every allocate/release along the path to the root,
so a placement never scans the whole cluster: it asks a rack for its free count, and finds the node
that best fits `k` GPUs through per-GPU-type buckets of nodes keyed by their free count.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field


class ClusterError(ValueError):
    """A cluster that cannot be built as described."""


@dataclass(slots=True, eq=False)
class Cell:
    name: str
    cell_type: str
    gpu_type: str
    children: list[Cell] = field(default_factory=list)
    parent: Cell | None = None
    is_node: bool = False
    total_gpus: int = 0
    free_gpus: int = 0
    index: int = -1  # GPU id for a leaf, node index for a node, rack index for a rack

    @property
    def is_gpu(self) -> bool:
        return not self.children

    def leaves(self) -> Iterator[Cell]:
        if not self.children:
            yield self
            return
        for child in self.children:
            yield from child.leaves()


@dataclass(slots=True, frozen=True)
class NodeDef:
    """One machine for the simple builders: name, GPU count and type, rack, optional switch size."""

    name: str
    gpus: int
    gpu_type: str = "v100"
    rack: str = "rack-0"
    gpus_per_switch: int | None = None


class Cluster:
    """Cells plus the incremental indexes that placement needs."""

    def __init__(self, root: Cell) -> None:
        self.root = root
        self.gpus: list[Cell] = []
        self.nodes: list[Cell] = []
        self.racks: list[Cell] = []
        self._index(root)
        if not self.gpus:
            raise ClusterError("the cluster has no GPUs")
        self.gpu_node: list[int] = []
        self.node_rack: list[int] = []
        self.rack_nodes: list[list[int]] = [[] for _ in self.racks]
        rack_of_cell = {id(rack): i for i, rack in enumerate(self.racks)}
        for node in self.nodes:
            rack_cell = node.parent if node.parent is not None and node.parent is not root else node
            rack_idx = rack_of_cell[id(rack_cell)]
            self.node_rack.append(rack_idx)
            self.rack_nodes[rack_idx].append(node.index)
        self.gpu_node = [0] * len(self.gpus)
        self.node_gpus: list[list[int]] = []
        for node in self.nodes:
            ids = [leaf.index for leaf in node.leaves()]
            self.node_gpus.append(ids)
            for gpu_id in ids:
                self.gpu_node[gpu_id] = node.index
        self.gpu_free = bytearray(b"\x01" * len(self.gpus))
        self.gpu_types = sorted({node.gpu_type for node in self.nodes})
        self.total_by_type: Counter[str] = Counter()
        self.free_by_type: Counter[str] = Counter()
        self.max_node_gpus_by_type: dict[str, int] = {}
        for node in self.nodes:
            self.total_by_type[node.gpu_type] += node.total_gpus
            self.free_by_type[node.gpu_type] += node.total_gpus
            self.max_node_gpus_by_type[node.gpu_type] = max(
                self.max_node_gpus_by_type.get(node.gpu_type, 0), node.total_gpus
            )
        # _buckets[gpu_type][k] holds the healthy nodes with exactly k free GPUs, in insertion order
        # (a dict used as an ordered set keeps runs deterministic).
        self._buckets: dict[str, list[dict[int, None]]] = {
            t: [{} for _ in range(self.max_node_gpus_by_type[t] + 1)] for t in self.gpu_types
        }
        for node in self.nodes:
            self._buckets[node.gpu_type][node.free_gpus][node.index] = None

    def _index(self, root: Cell) -> None:
        """Number GPUs and nodes depth-first, find racks, and compute counts bottom-up."""
        rack_ids: dict[int, int] = {}

        def visit(cell: Cell, parent: Cell | None) -> int:
            cell.parent = parent
            if cell.is_node:
                if not cell.children:
                    raise ClusterError(f"node cell {cell.name!r} has no GPUs")
                cell.index = len(self.nodes)
                self.nodes.append(cell)
                rack_cell = cell if parent is None or parent is root else parent
                if id(rack_cell) not in rack_ids:
                    rack_ids[id(rack_cell)] = len(self.racks)
                    self.racks.append(rack_cell)
            if not cell.children:
                cell.index = len(self.gpus)
                self.gpus.append(cell)
                total = 1
            else:
                total = sum(visit(child, cell) for child in cell.children)
            cell.total_gpus = total
            cell.free_gpus = total
            return total

        visit(root, None)
        for gpu in self.gpus:
            if not _has_node_ancestor(gpu):
                raise ClusterError(f"GPU cell {gpu.name!r} is not inside a node cell")

    # -- builders -----------------------------------------------------------------------------

    @classmethod
    def from_nodes(cls, nodes: Iterable[NodeDef]) -> Cluster:
        root = Cell(name="cluster", cell_type="cluster", gpu_type="")
        racks: dict[str, Cell] = {}
        for node_def in nodes:
            if node_def.gpus <= 0:
                raise ClusterError(f"node {node_def.name!r}: gpus must be a positive integer")
            rack = racks.get(node_def.rack)
            if rack is None:
                rack = Cell(name=node_def.rack, cell_type="rack", gpu_type=node_def.gpu_type)
                racks[node_def.rack] = rack
                root.children.append(rack)
            node = Cell(
                name=node_def.name, cell_type="node", gpu_type=node_def.gpu_type, is_node=True
            )
            per_switch = node_def.gpus_per_switch or node_def.gpus
            for first in range(0, node_def.gpus, per_switch):
                gpus = [
                    Cell(
                        name=f"{node_def.name}/gpu{i}",
                        cell_type=node_def.gpu_type,
                        gpu_type=node_def.gpu_type,
                    )
                    for i in range(first, min(first + per_switch, node_def.gpus))
                ]
                if per_switch == node_def.gpus:
                    node.children.extend(gpus)
                else:
                    node.children.append(
                        Cell(
                            name=f"{node_def.name}/sw{first // per_switch}",
                            cell_type="switch",
                            gpu_type=node_def.gpu_type,
                            children=gpus,
                        )
                    )
            rack.children.append(node)
        return cls(root)

    @classmethod
    def shorthand(
        cls,
        nodes: int,
        gpus_per_node: int,
        racks: int = 1,
        gpu_type: str = "v100",
        gpus_per_switch: int | None = None,
    ) -> Cluster:
        """`--cluster 64x8 --racks 8`: nodes in consecutive blocks, as even as the counts allow."""
        if nodes <= 0 or gpus_per_node <= 0:
            raise ClusterError("the cluster needs at least one node with at least one GPU")
        if gpus_per_switch is not None and not 0 < gpus_per_switch <= gpus_per_node:
            raise ClusterError(
                f"GPUs per switch must be between 1 and the GPUs per node ({gpus_per_node})"
            )
        if racks <= 0 or racks > nodes:
            raise ClusterError(f"racks must be between 1 and the node count ({nodes}), got {racks}")
        return cls.from_nodes(
            NodeDef(
                name=f"node-{i:04d}",
                gpus=gpus_per_node,
                gpu_type=gpu_type,
                rack=f"rack-{i * racks // nodes:02d}",  # consecutive blocks, sizes differ by <= 1
                gpus_per_switch=gpus_per_switch,
            )
            for i in range(nodes)
        )

    # -- queries ------------------------------------------------------------------------------

    @property
    def total_gpus(self) -> int:
        return self.root.total_gpus

    @property
    def free_gpus(self) -> int:
        return sum(self.free_by_type.values())

    def free_for(self, gpu_types: frozenset[str] | None) -> int:
        if gpu_types is None:
            return self.free_gpus
        return sum(self.free_by_type.get(t, 0) for t in gpu_types)

    def capacity_for(self, gpu_types: frozenset[str] | None) -> int:
        """GPUs that could ever host a job of these types (the largest gang of one type)."""
        types = (
            self.gpu_types
            if gpu_types is None
            else [t for t in gpu_types if t in self.total_by_type]
        )
        return max((self.total_by_type[t] for t in types), default=0)

    def nodes_with_free(self, gpu_type: str, at_least: int) -> Iterator[int]:
        """Healthy nodes of a type with at least `at_least` free GPUs, tightest fit first."""
        buckets = self._buckets.get(gpu_type)
        if buckets is None:
            return
        for free in range(max(at_least, 1), len(buckets)):
            yield from buckets[free]

    def nodes_most_free_first(self, gpu_type: str) -> Iterator[int]:
        buckets = self._buckets.get(gpu_type, [])
        for free in range(len(buckets) - 1, 0, -1):
            yield from buckets[free]

    def free_in_whole_nodes(self) -> int:
        """Free GPUs on healthy nodes that are wholly free and of their type's largest size."""
        return sum(
            len(self._buckets[t][size]) * size for t, size in self.max_node_gpus_by_type.items()
        )

    def node_free(self, node: int) -> int:
        return self.nodes[node].free_gpus

    def rack_free(self, rack: int) -> int:
        return self.racks[rack].free_gpus

    def free_gpus_of_node(self, node: int) -> list[int]:
        return [g for g in self.node_gpus[node] if self.gpu_free[g]]

    def describe(self) -> str:
        sizes = Counter((n.total_gpus, n.gpu_type) for n in self.nodes)
        parts = [f"{count}x{size} {gpu_type}" for (size, gpu_type), count in sorted(sizes.items())]
        racks = f"{len(self.racks)} rack" + ("s" if len(self.racks) != 1 else "")
        return f"{len(self.nodes)} nodes ({', '.join(parts)}), {self.total_gpus} GPUs, {racks}"

    # -- mutation -----------------------------------------------------------------------------

    def allocate(self, gpu_ids: Iterable[int]) -> None:
        self._change(gpu_ids, -1)

    def release(self, gpu_ids: Iterable[int]) -> None:
        self._change(gpu_ids, +1)

    def _change(self, gpu_ids: Iterable[int], delta: int) -> None:
        """Flip GPUs free or allocated; counts are updated once per node, not once per GPU."""
        want = 1 if delta > 0 else 0
        ids = list(gpu_ids)
        for gpu_id in ids:  # check all first: a refused change leaves nothing half-done
            if self.gpu_free[gpu_id] == want:
                state = "free" if want else "allocated"
                raise ClusterError(f"GPU {self.gpus[gpu_id].name} is already {state}")
        per_node: dict[int, int] = {}
        for gpu_id in ids:
            self.gpu_free[gpu_id] = want
            node_idx = self.gpu_node[gpu_id]
            per_node[node_idx] = per_node.get(node_idx, 0) + 1
            cell = self.gpus[gpu_id]
            while not cell.is_node:  # the GPU and any switch level under the node
                cell.free_gpus += delta
                cell = cell.parent  # type: ignore[assignment]
        for node_idx, count in per_node.items():
            node = self.nodes[node_idx]
            del self._buckets[node.gpu_type][node.free_gpus][node_idx]
            self.free_by_type[node.gpu_type] += delta * count
            up: Cell | None = node
            while up is not None:
                up.free_gpus += delta * count
                up = up.parent
            self._buckets[node.gpu_type][node.free_gpus][node_idx] = None

    def pick_in_node(self, node: int, k: int) -> list[int]:
        """Choose k free GPUs of one node, keeping them under as few switches as possible."""
        cell = self.nodes[node]
        if cell.free_gpus < k:
            raise ClusterError(f"node {cell.name} has {cell.free_gpus} free GPUs, not {k}")
        if all(child.is_gpu for child in cell.children):
            return [g for g in self.node_gpus[node] if self.gpu_free[g]][:k]
        groups = sorted(cell.children, key=lambda c: c.free_gpus, reverse=True)
        fitting = [g for g in groups if g.free_gpus >= k]
        if fitting:
            best = min(fitting, key=lambda c: c.free_gpus)
            return [leaf.index for leaf in best.leaves() if self.gpu_free[leaf.index]][:k]
        chosen: list[int] = []
        for group in groups:
            chosen.extend(leaf.index for leaf in group.leaves() if self.gpu_free[leaf.index])
            if len(chosen) >= k:
                break
        return chosen[:k]

    def nodes_of(self, gpu_ids: Iterable[int]) -> set[int]:
        return {self.gpu_node[g] for g in gpu_ids}


def _has_node_ancestor(cell: Cell) -> bool:
    current: Cell | None = cell
    while current is not None:
        if current.is_node:
            return True
        current = current.parent
    return False
