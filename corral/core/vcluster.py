"""A virtual cluster (VC): the cells a tenant is guaranteed, as a cluster of its own.

A VC given {V100-NODE: 3, V100-2GPU: 1} gets a private Cluster whose top-level cells have exactly
those shapes (cloned from a physical cell of each type), so its jobs are ordered and placed by the
same policy and placement code as a whole cluster, with topology intact (HiveD's point: 8 GPUs
spread over 8 nodes are no guarantee of one 8-GPU node). Each top-level virtual cell is bound to a
physical cell of its type only while it holds jobs (lazy binding); virtual GPU k of a top cell is
physical GPU k of the cell it is bound to.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from corral.core.cluster import Cell, Cluster, ClusterError


def _prototypes(cluster: Cluster) -> dict[str, Cell]:
    """The first physical cell of each type, in tree order."""
    found: dict[str, Cell] = {}
    stack = list(reversed(cluster.root.children))
    while stack:
        cell = stack.pop()
        found.setdefault(cell.cell_type, cell)
        stack.extend(reversed(cell.children))
    return found


def _clone(cell: Cell, name: str) -> Cell:
    copy = Cell(name=name, cell_type=cell.cell_type, gpu_type=cell.gpu_type, is_node=cell.is_node)
    copy.children = [
        _clone(child, f"{name}/{child.name.rsplit('/', 1)[-1]}") for child in cell.children
    ]
    return copy


@dataclass(slots=True)
class VirtualCluster:
    name: str
    cluster: Cluster
    top_types: list[str]
    #: virtual GPU id -> (top-level cell index, position among that cell's GPUs)
    gpu_home: list[tuple[int, int]]
    #: top-level cell index -> physical GPU ids of the physical cell it is bound to
    bound: dict[int, tuple[Cell, list[int]]] = field(default_factory=dict)

    @property
    def guaranteed_gpus(self) -> int:
        return self.cluster.total_gpus

    def tops_of(self, virtual_gpus: tuple[int, ...]) -> list[int]:
        return sorted({self.gpu_home[g][0] for g in virtual_gpus})

    def top_is_idle(self, top: int) -> bool:
        cell = self.cluster.root.children[top]
        return cell.free_gpus == cell.total_gpus

    def to_physical(self, virtual_gpus: tuple[int, ...]) -> tuple[int, ...]:
        """Physical GPUs of virtual ones whose top cells are bound."""
        return tuple(self.bound[self.gpu_home[g][0]][1][self.gpu_home[g][1]] for g in virtual_gpus)


def build_virtual_cluster(name: str, cells: dict[str, int], physical: Cluster) -> VirtualCluster:
    """The VC's cells as a cluster; an empty map means the whole physical cluster."""
    prototypes = _prototypes(physical)
    tops: list[Cell] = []
    if not cells:
        tops = [_clone(cell, f"{name}:{cell.name}") for cell in physical.root.children]
    else:
        for cell_type, count in cells.items():
            if cell_type not in prototypes:
                raise ClusterError(f"VC {name}: the cluster has no cell of type {cell_type!r}")
            for i in range(count):
                tops.append(_clone(prototypes[cell_type], f"{name}:{cell_type}-{i}"))
    top_types = [top.cell_type for top in tops]
    # A cell below node level (a PCIe pair, one GPU) is a small node of the VC's own.
    tops = [
        top
        if _has_node(top)
        else Cell(
            name=top.name,
            cell_type=top.cell_type,
            gpu_type=top.gpu_type,
            is_node=True,
            children=[top],
        )
        for top in tops
    ]
    root = Cell(name=f"{name}:cluster", cell_type="cluster", gpu_type="", children=tops)
    cluster = Cluster(root)
    gpu_home: list[tuple[int, int]] = [(0, 0)] * cluster.total_gpus
    for top_index, top in enumerate(tops):
        for position, leaf in enumerate(top.leaves()):
            gpu_home[leaf.index] = (top_index, position)
    return VirtualCluster(name=name, cluster=cluster, top_types=top_types, gpu_home=gpu_home)


def _has_node(cell: Cell) -> bool:
    return cell.is_node or any(_has_node(child) for child in cell.children)
