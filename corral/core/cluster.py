"""The cluster as a tree of cells (HiveD): GPU -> optional switch/socket -> node -> rack -> cluster.

Each cell keeps its count of free GPUs, updated on every allocate/release along the path to the root,
so a placement never scans the whole cluster: it asks a rack for its free count, and finds the node
that best fits `k` GPUs through per-GPU-type buckets of nodes keyed by their free count.

**Fractions.** Each GPU holds `MILLI` (1000) milli-GPU. A job may take a share of one GPU
(`claim` with `milli` below 1000): the GPU then counts as allocated for whole-GPU jobs (it leaves
the free counts and the buckets as a whole allocation would) and keeps its free milli in
`share_free` until its last share is released. A node may declare CPU (milli-cores) and memory
(MiB) capacities, which `claim` takes on one node; a node that declares none is unbounded. Whole-GPU
allocation (`allocate`, `release`) is unchanged by all of this.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from corral.core.text import count_noun

#: Milli-GPU in one GPU: a job asking for less (`JobSpec.gpu_milli`) takes a share of one GPU.
MILLI = 1000


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
    #: A node's CPU (milli-cores) and memory (MiB); None: unbounded (not modelled).
    cpu_milli: int | None = None
    memory_mib: int | None = None
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
    #: CPU (milli-cores) and memory (MiB) jobs may claim on the node; None: unbounded.
    cpu_milli: int | None = None
    memory_mib: int | None = None


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
        #: Each node's GPUs lie right under it (no switch level): a GPU's count is its flag's.
        self._node_flat = [
            all(not child.children for child in node.children) for node in self.nodes
        ]
        self._flat = all(self._node_flat)
        #: Each node's cells above it, up to the root (counts change along them).
        self._above: list[tuple[Cell, ...]] = [_ancestors(node) for node in self.nodes]
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
        # The bucket of wholly free nodes of each type's largest size, with that size (the
        # simulator asks every round how many GPUs lie in wholly free nodes).
        self._whole_buckets = [
            (self._buckets[t][size], size) for t, size in self.max_node_gpus_by_type.items()
        ]
        # Fractions (see the module's doc): free milli of each GPU some share is on, CPU and
        # memory per node, and the sets of nodes whose free resources changed, one per watcher.
        self.share_free: dict[int, int] = {}
        self.share_free_total = 0
        self.cpu_capacity: list[int | None] = [node.cpu_milli for node in self.nodes]
        self.memory_capacity: list[int | None] = [node.memory_mib for node in self.nodes]
        self.cpu_used = [0] * len(self.nodes)
        self.memory_used = [0] * len(self.nodes)
        self._watchers: list[set[int]] = []
        #: Counts every change of what is free, so that a caller can tell that nothing changed.
        self.version = 0
        #: Counts the calls that give GPUs back (`release`, `unclaim`), so that a scheduler can
        #: tell its own from another's on the same cluster (HiveD's opportunistic jobs).
        self.frees = 0
        #: `worker_room`'s answers by (GPU types, worker size): a cluster's nodes are fixed when
        #: it is made (nodes that join or leave make a new Cluster), so they never go stale.
        self._worker_room: dict[tuple[tuple[str, ...], int], tuple[int, int]] = {}
        self._capacity: dict[frozenset[str] | None, int] = {}  # `capacity_for`'s, likewise

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
            for what, amount in (
                ("cpu_milli", node_def.cpu_milli),
                ("memory_mib", node_def.memory_mib),
            ):
                if amount is not None and amount < 0:
                    raise ClusterError(f"node {node_def.name!r}: {what} must not be negative")
            node = Cell(
                name=node_def.name,
                cell_type="node",
                gpu_type=node_def.gpu_type,
                is_node=True,
                cpu_milli=node_def.cpu_milli,
                memory_mib=node_def.memory_mib,
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
        return self.root.free_gpus  # kept by every change, as each cell's count is

    def free_for(self, gpu_types: frozenset[str] | None) -> int:
        if gpu_types is None:
            return self.free_gpus
        return sum(self.free_by_type.get(t, 0) for t in gpu_types)

    def capacity_for(self, gpu_types: frozenset[str] | None) -> int:
        """GPUs that could ever host a job of these types (the largest gang of one type).
        Worked out once per cluster and GPU types (asked at every submission): nodes are
        fixed when a cluster is made."""
        capacity = self._capacity.get(gpu_types)
        if capacity is None:
            types = (
                self.gpu_types
                if gpu_types is None
                else [t for t in gpu_types if t in self.total_by_type]
            )
            capacity = max((self.total_by_type[t] for t in types), default=0)
            self._capacity[gpu_types] = capacity
        return capacity

    def worker_room(self, gpu_types: frozenset[str] | None, unit: int) -> tuple[int, int]:
        """For workers of `unit` GPUs each on one node, on the nodes of the GPU types given (None:
        any): the most GPUs one node has, and the most GPUs one type's nodes can give in whole
        workers. Counts every node, free or not; worked out once per cluster and key (asked at
        every submission of a job of several GPUs per worker)."""
        types = tuple(t for t in self.gpu_types if gpu_types is None or t in gpu_types)
        key = (types, unit)
        room = self._worker_room.get(key)
        if room is None:
            largest = max((self.max_node_gpus_by_type[t] for t in types), default=0)
            whole = [0] * len(self.gpu_types)
            position = {t: i for i, t in enumerate(self.gpu_types)}
            for node in self.nodes:
                if node.gpu_type in types:
                    whole[position[node.gpu_type]] += node.total_gpus - node.total_gpus % unit
            room = self._worker_room[key] = (largest, max(whole, default=0))
        return room

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
        total = 0
        for bucket, size in self._whole_buckets:
            total += len(bucket) * size
        return total

    def node_free(self, node: int) -> int:
        return self.nodes[node].free_gpus

    def rack_free(self, rack: int) -> int:
        return self.racks[rack].free_gpus

    def free_gpus_of_node(self, node: int) -> list[int]:
        return [g for g in self.node_gpus[node] if self.gpu_free[g]]

    # -- fractions: shares of GPUs, CPU and memory --------------------------------------------

    def gpu_milli_free(self, gpu: int) -> int:
        """Free milli-GPU of a GPU: 1000 when wholly free, 0 when allocated whole (or offline)."""
        free = self.share_free.get(gpu)
        if free is not None:
            return free
        return MILLI if self.gpu_free[gpu] else 0

    def cpu_free(self, node: int) -> float:
        """Free CPU (milli-cores) of a node; infinite when the node declares no capacity."""
        capacity = self.cpu_capacity[node]
        return math.inf if capacity is None else capacity - self.cpu_used[node]

    def memory_free(self, node: int) -> float:
        """Free memory (MiB) of a node; infinite when the node declares no capacity."""
        capacity = self.memory_capacity[node]
        return math.inf if capacity is None else capacity - self.memory_used[node]

    @property
    def allocated_milli(self) -> int:
        """Milli-GPU in use: whole GPUs allocated (offline ones too), less the free milli of
        GPUs that shares are on."""
        return MILLI * (self.total_gpus - self.free_gpus) - self.share_free_total

    def watch(self) -> set[int]:
        """A set the cluster adds every node to whose free GPUs, milli, CPU or memory change; the
        watcher empties it as it catches up (a placement's index of node states, a probe)."""
        changed: set[int] = set()
        self._watchers.append(changed)
        return changed

    def unwatch(self, changed: set[int]) -> None:
        self._watchers = [w for w in self._watchers if w is not changed]

    def claim_problem(
        self, gpus: Sequence[int], milli: int, node: int, cpu_milli: int, memory_mib: int
    ) -> str | None:
        """Why `claim` would refuse, or None."""
        if not 0 < milli <= MILLI:
            return f"milli-GPU per GPU must be 1..{MILLI}, got {milli}"
        if cpu_milli < 0 or memory_mib < 0:
            return "CPU and memory must not be negative"
        if milli < MILLI:
            if len(gpus) != 1:
                return f"a share of {milli} milli-GPU goes on one GPU, not {len(gpus)}"
            if self.gpu_milli_free(gpus[0]) < milli:
                name = self.gpus[gpus[0]].name
                return f"GPU {name} has {self.gpu_milli_free(gpus[0])} milli free, not {milli}"
        else:
            for gpu in gpus:
                if not self.gpu_free[gpu]:
                    return f"GPU {self.gpus[gpu].name} is already allocated"
            if len(set(gpus)) != len(gpus):
                return "a GPU is named twice"
        if cpu_milli or memory_mib:
            if not 0 <= node < len(self.nodes):
                return f"no node {node} to take CPU and memory on"
            name = self.nodes[node].name
            if any(self.gpu_node[g] != node for g in gpus):
                return f"a job taking CPU or memory on node {name} must have its GPUs there"
            if cpu_milli > self.cpu_free(node):
                return f"node {name} has {self.cpu_free(node):g} milli-CPU free, not {cpu_milli}"
            if memory_mib > self.memory_free(node):
                return f"node {name} has {self.memory_free(node):g} MiB free, not {memory_mib}"
        return None

    def claim(
        self,
        gpus: Sequence[int],
        milli: int = MILLI,
        node: int = -1,
        cpu_milli: int = 0,
        memory_mib: int = 0,
    ) -> None:
        """Take whole GPUs (`milli` 1000) or a share of one GPU, and CPU and memory on `node`
        (where the GPUs must be). Refused whole (ClusterError), or done whole."""
        problem = self.claim_problem(gpus, milli, node, cpu_milli, memory_mib)
        if problem is not None:
            raise ClusterError(problem)
        if milli < MILLI:
            gpu = gpus[0]
            free = self.share_free.get(gpu)
            if free is None:  # its first share: the GPU leaves the whole-GPU free counts
                self._change((gpu,), -1)
                free = MILLI
            self.share_free[gpu] = free - milli
            self.share_free_total += MILLI - milli if free == MILLI else -milli
            self._touched(self.gpu_node[gpu])
        elif gpus:
            self._change(gpus, -1)
        self._use_node(node, cpu_milli, memory_mib, +1)

    def unclaim(
        self,
        gpus: Sequence[int],
        milli: int = MILLI,
        node: int = -1,
        cpu_milli: int = 0,
        memory_mib: int = 0,
    ) -> None:
        """Give back what `claim` took."""
        self.frees += 1
        gpu = gpus[0] if gpus else -1
        free = 0
        if milli < MILLI:
            held = self.share_free.get(gpu)
            if held is None or held + milli > MILLI:
                raise ClusterError(f"GPU {self.gpus[gpu].name} holds no share of {milli} milli")
            free = held + milli
        if (cpu_milli or memory_mib) and (
            self.cpu_used[node] < cpu_milli or self.memory_used[node] < memory_mib
        ):
            raise ClusterError(f"node {self.nodes[node].name} holds less CPU or memory")
        if milli < MILLI:
            if free == MILLI:  # its last share: whole again
                del self.share_free[gpu]
                self.share_free_total -= MILLI - milli
                self._change((gpu,), +1)
            else:
                self.share_free[gpu] = free
                self.share_free_total += milli
                self._touched(self.gpu_node[gpu])
        elif gpus:
            self._change(gpus, +1)
        self._use_node(node, cpu_milli, memory_mib, -1)

    def _use_node(self, node: int, cpu_milli: int, memory_mib: int, sign: int) -> None:
        """Take (+1) or give back (-1) CPU and memory on a node."""
        if cpu_milli or memory_mib:
            self.cpu_used[node] += sign * cpu_milli
            self.memory_used[node] += sign * memory_mib
            self._touched(node)

    def _touched(self, node: int) -> None:
        self.version += 1
        for changed in self._watchers:
            changed.add(node)

    def gpu_names(self) -> list[str]:
        """Each GPU's name as the live manager stores it, `node/device` (the device its index
        among its node's GPUs), indexed by GPU id."""
        names = [""] * len(self.gpus)
        for node in self.nodes:
            for device, gpu in enumerate(self.node_gpus[node.index]):
                names[gpu] = f"{node.name}/{device}"
        return names

    def node_defs(self) -> list[NodeDef]:
        """The nodes as `from_nodes` takes them, in order, so that it rebuilds this cluster with
        the same GPU ids: name, GPUs, type, rack (the node's parent cell, or the node itself at
        the top), CPU and memory, and the switch size where the node has one level of equal
        groups under it (a deeper or uneven tree is described by its GPUs alone)."""
        defs = []
        for node in self.nodes:
            parent = node.parent
            rack = parent.name if parent is not None and parent is not self.root else node.name
            defs.append(
                NodeDef(
                    name=node.name,
                    gpus=node.total_gpus,
                    gpu_type=node.gpu_type,
                    rack=rack,
                    gpus_per_switch=_switch_size(node),
                    cpu_milli=node.cpu_milli,
                    memory_mib=node.memory_mib,
                )
            )
        return defs

    def describe(self) -> str:
        sizes = Counter((n.total_gpus, n.gpu_type) for n in self.nodes)
        parts = [f"{count}x{size} {gpu_type}" for (size, gpu_type), count in sorted(sizes.items())]
        return (
            f"{count_noun(len(self.nodes), 'node')} ({', '.join(parts)}), "
            f"{count_noun(self.total_gpus, 'GPU')}, {count_noun(len(self.racks), 'rack')}"
        )

    def __deepcopy__(self, memo: dict[int, object]) -> Cluster:
        """A cluster of its own cells in the same state: the same GPUs allocated, the same shares,
        CPU and memory taken, the same `version`; no watchers (they watch this one). Written out
        because the compiled build (setup.py) makes Cluster a class `copy.deepcopy` cannot copy
        by itself; the live manager copies its pristine cluster with it."""
        twin = Cluster(_copy_cells(self.root))
        allocated = [gpu for gpu in range(len(self.gpus)) if not self.gpu_free[gpu]]
        if allocated:
            twin._change(allocated, -1)
        # The buckets' order (the order placements meet nodes in) is their history's: kept.
        twin._buckets = {t: [dict(b) for b in sizes] for t, sizes in self._buckets.items()}
        twin._whole_buckets = [
            (twin._buckets[t][size], size) for t, size in twin.max_node_gpus_by_type.items()
        ]
        twin.share_free = dict(self.share_free)
        twin.share_free_total = self.share_free_total
        twin.cpu_used = list(self.cpu_used)
        twin.memory_used = list(self.memory_used)
        twin.version = self.version
        twin.frees = self.frees
        memo[id(self)] = twin
        return twin

    # -- mutation -----------------------------------------------------------------------------

    def allocate(self, gpu_ids: Iterable[int]) -> None:
        self._change(gpu_ids, -1)

    def release(self, gpu_ids: Iterable[int]) -> None:
        self.frees += 1
        self._change(gpu_ids, +1)

    def allocate_each(
        self, groups: Sequence[Sequence[int]], held: Sequence[bool] | None = None
    ) -> None:
        """`allocate(group)` for each group in turn, in one pass (the same state after). A
        group that `held` marks True is allocated already (a search for preemption victims did
        not free it): its GPUs stay as they are, and its nodes move in their buckets, in turn
        with the other groups' nodes, as a release and this allocation of it would have left
        them (each at the end of the bucket it is in)."""
        self._change_each(groups, -1, held)

    def release_each(self, groups: Sequence[Sequence[int]]) -> None:
        """`release(group)` for each group in turn, in one pass (the same state after)."""
        self.frees += len(groups)
        self._change_each(groups, +1)

    def _change_each(
        self, groups: Sequence[Sequence[int]], delta: int, held: Sequence[bool] | None = None
    ) -> None:
        """`_change(group, delta)` for each group in turn (a search for preemption victims frees
        and takes back dozens of jobs' GPUs at once), with each node's count and bucket changed
        once. A node's place in its bucket is its history's: `_change` moves each node it
        changes to the end of its new bucket, group after group and, in a group, in the order
        its GPUs name the nodes, so the nodes end in the order they were last changed in (after
        those not changed), which is the order they are moved in here. If a GPU is already as
        asked (or named twice), the groups are changed one by one instead, which fails there.
        `held` (taking back): see `allocate_each`."""
        want = 1 if delta > 0 else 0
        gpu_free = self.gpu_free
        gpu_node = self.gpu_node
        gpus = self.gpus
        per_node: dict[int, int] = {}  # node -> GPUs changed, in the order last changed
        done = 0
        for number, group in enumerate(groups):
            if held is not None and held[number]:  # its nodes move, their counts unchanged
                first = -1
                named: dict[int, None] | None = None  # its other nodes, in order
                for gpu_id in group:
                    if gpu_free[gpu_id]:
                        self._undo_each(groups, done, want, held)
                        raise ClusterError(f"GPU {gpus[gpu_id].name} is not allocated")
                    node_idx = gpu_node[gpu_id]
                    if node_idx != first:
                        if first < 0:
                            first = node_idx
                        else:
                            if named is None:
                                named = {}
                            named[node_idx] = None
                if first >= 0:
                    per_node[first] = per_node.pop(first, 0)
                if named is not None:
                    for node_idx in named:
                        per_node[node_idx] = per_node.pop(node_idx, 0)
                continue
            # The group's first node and its count, then any other nodes (a job over several
            # nodes) in the order its GPUs name them.
            first = -1
            count = 0
            others: dict[int, int] | None = None
            for gpu_id in group:
                if gpu_free[gpu_id] == want:
                    self._undo_each(groups, done, want, held)
                    for each, kept in zip(groups, held or [False] * len(groups), strict=True):
                        if not kept:
                            self._change(each, delta)  # fails where the first change would
                    return
                gpu_free[gpu_id] = want
                gpus[gpu_id].free_gpus += delta
                done += 1
                node_idx = gpu_node[gpu_id]
                if node_idx == first:
                    count += 1
                elif first < 0:
                    first = node_idx
                    count = 1
                else:
                    if others is None:
                        others = {}
                    others[node_idx] = others.get(node_idx, 0) + 1
            if first >= 0:
                per_node[first] = per_node.pop(first, 0) + count
            if others is not None:
                for node_idx, more in others.items():
                    per_node[node_idx] = per_node.pop(node_idx, 0) + more
        self.version += len(groups)
        if not self._flat:
            for number, group in enumerate(groups):
                if held is not None and held[number]:
                    continue
                for gpu_id in group:
                    cell = gpus[gpu_id].parent
                    while cell is not None and not cell.is_node:  # any switch level
                        cell.free_gpus += delta
                        cell = cell.parent
        nodes = self.nodes
        buckets = self._buckets
        free_by_type = self.free_by_type
        above = self._above
        for node_idx, count in per_node.items():
            node = nodes[node_idx]
            by_free = buckets[node.gpu_type]
            if not count:  # (only held groups' GPUs on it) to the end of its bucket
                bucket = by_free[node.free_gpus]
                del bucket[node_idx]
                bucket[node_idx] = None
                continue
            del by_free[node.free_gpus][node_idx]
            change = delta * count
            free_by_type[node.gpu_type] += change
            node.free_gpus += change
            for cell in above[node_idx]:
                cell.free_gpus += change
            by_free[node.free_gpus][node_idx] = None
        if self._watchers:
            for changed in self._watchers:
                changed.update(per_node)

    def _undo_each(
        self, groups: Sequence[Sequence[int]], done: int, want: int, held: Sequence[bool] | None
    ) -> None:
        """Set back the first `done` GPU flags `_change_each` set (none of the groups held)."""
        for number, group in enumerate(groups):
            if held is not None and held[number]:
                continue
            for gpu_id in group:
                if done == 0:
                    return
                self.gpu_free[gpu_id] = 1 - want
                self.gpus[gpu_id].free_gpus = 1 - want
                done -= 1

    def _change(self, gpu_ids: Iterable[int], delta: int) -> None:
        """Flip GPUs free or allocated; counts are updated once per node, not once per GPU."""
        want = 1 if delta > 0 else 0
        ids = list(gpu_ids)
        gpu_free = self.gpu_free
        self.version += 1
        for gpu_id in ids:  # check all first: a refused change leaves nothing half-done
            if gpu_free[gpu_id] == want:
                state = "free" if want else "allocated"
                raise ClusterError(f"GPU {self.gpus[gpu_id].name} is already {state}")
        per_node: dict[int, int] = {}
        gpus = self.gpus
        gpu_node = self.gpu_node
        flat = self._flat
        for gpu_id in ids:
            gpu_free[gpu_id] = want
            node_idx = gpu_node[gpu_id]
            per_node[node_idx] = per_node.get(node_idx, 0) + 1
            cell = gpus[gpu_id]
            cell.free_gpus += delta
            if not flat:
                up = cell.parent
                while up is not None and not up.is_node:  # any switch level under the node
                    up.free_gpus += delta
                    up = up.parent
        nodes = self.nodes
        buckets = self._buckets
        above = self._above
        for node_idx, count in per_node.items():
            node = nodes[node_idx]
            by_free = buckets[node.gpu_type]
            del by_free[node.free_gpus][node_idx]
            change = delta * count
            self.free_by_type[node.gpu_type] += change
            node.free_gpus += change
            for cell in above[node_idx]:
                cell.free_gpus += change
            by_free[node.free_gpus][node_idx] = None
        if self._watchers:
            for changed in self._watchers:
                changed.update(per_node)

    def pick_in_node(self, node: int, k: int) -> list[int]:
        """Choose k free GPUs of one node, keeping them under as few switches as possible."""
        cell = self.nodes[node]
        if cell.free_gpus < k:
            raise ClusterError(f"node {cell.name} has {cell.free_gpus} free GPUs, not {k}")
        if self._node_flat[node]:
            gpu_free = self.gpu_free
            return [g for g in self.node_gpus[node] if gpu_free[g]][:k]
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


def _switch_size(node: Cell) -> int | None:
    """The group size `NodeDef.gpus_per_switch` gives this node's children, or None: GPUs right
    under the node, or groups `from_nodes` would not build (uneven, or more than one level)."""
    if all(child.is_gpu for child in node.children):
        return None
    sizes = [len(child.children) for child in node.children]
    if not all(
        child.children and all(leaf.is_gpu for leaf in child.children) for child in node.children
    ):
        return None
    size = sizes[0]
    if any(n != size for n in sizes[:-1]) or sizes[-1] > size:
        return None
    return size


def _copy_cells(cell: Cell) -> Cell:
    """The cell and everything under it, anew (counts and indexes are `Cluster`'s to set)."""
    twin = Cell(
        name=cell.name,
        cell_type=cell.cell_type,
        gpu_type=cell.gpu_type,
        is_node=cell.is_node,
        cpu_milli=cell.cpu_milli,
        memory_mib=cell.memory_mib,
    )
    twin.children = [_copy_cells(child) for child in cell.children]
    return twin


def _ancestors(cell: Cell) -> tuple[Cell, ...]:
    """The cells above `cell`, its parent first, up to the root."""
    above = []
    up = cell.parent
    while up is not None:
        above.append(up)
        up = up.parent
    return tuple(above)


def _has_node_ancestor(cell: Cell) -> bool:
    current: Cell | None = cell
    while current is not None:
        if current.is_node:
            return True
        current = current.parent
    return False
