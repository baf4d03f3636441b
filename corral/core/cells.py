"""Buddy cell allocation (HiveD, Zhao et al., OSDI'20, section 3.2): virtual cells bound lazily to
physical cells of the same type.

A VC is guaranteed *cells* (say 3 x V100-NODE + 1 x V100-2GPU), not a GPU count. When it needs a
cell of type T the allocator takes a free physical cell of type T; if there is none it splits a
free cell of a bigger type (its children become free, one of them is taken), recursively up the
hierarchy; on release a cell whose siblings are all free merges back into its parent. Free capacity
therefore stays in the biggest topology-intact cells it can, which is what lets every VC get its
guaranteed cells whatever the others hold (the config loader already refuses VCs that together ask
for more cells than exist).

Every physical cell below the root is in at most one of these states; the cells inside a free,
bound or quarantined cell have no state of their own:

- free: not bound, not split, healthy throughout; listed in the free set of its type;
- bound: handed out by `bind`, until `release`;
- split: some of its children are in use; each child has a state;
- quarantined: an unhealthy cell, or a cell inside one, that would otherwise be free.

A free cell never contains an unhealthy cell: marking a cell unhealthy splits the free cell around
it (its healthy buddies stay free), so `bind` never has to check health. The root (type
"cluster") is never handed out; its children, the top-level physical cells, start free.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from corral.core.cluster import Cell, Cluster

Prefer = Callable[[Cell], Any]


class CellAllocator:
    """Free/bound/split bookkeeping over one Cluster's cell tree; pure and deterministic."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._root = cluster.root
        # Pre-order position: the tie-break that makes every choice deterministic.
        self._order: dict[Cell, int] = {}
        # Cell types strictly below each cell (sets are shared between cells of the same shape).
        self._types_below: dict[Cell, frozenset[str]] = {}
        # _split_order[T]: the bigger types whose cells may hold a T cell, nearest level first.
        self._split_order: dict[str, list[str]] = {}
        self._free: dict[str, dict[Cell, None]] = {}  # per type, a dict used as an ordered set
        self._bound: dict[Cell, None] = {}
        self._split: dict[Cell, int] = {}  # split cell -> how many of its children are free
        self._quarantined: dict[Cell, None] = {}
        self._unhealthy: dict[Cell, None] = {}  # cells marked unhealthy
        self._unhealthy_below: dict[Cell, int] = {}  # marked cells at or below a cell (if > 0)
        self._index()
        for top in self._root.children:
            self._free[top.cell_type][top] = None

    def _index(self) -> None:
        interned: dict[frozenset[str], frozenset[str]] = {}
        distance: dict[tuple[str, str], int] = {}  # (bigger type, smaller type) -> fewest levels

        def visit(cell: Cell, ancestors: list[Cell]) -> frozenset[str]:
            self._order[cell] = len(self._order)
            self._free.setdefault(cell.cell_type, {})
            for levels, ancestor in enumerate(reversed(ancestors), start=1):
                key = (ancestor.cell_type, cell.cell_type)
                if ancestor.cell_type != cell.cell_type and levels < distance.get(key, levels + 1):
                    distance[key] = levels
            below: set[str] = set()
            ancestors.append(cell)
            for child in cell.children:
                below.add(child.cell_type)
                below.update(visit(child, ancestors))
            ancestors.pop()
            types = interned.setdefault(frozenset(below), frozenset(below))
            self._types_below[cell] = types
            return types

        for top in self._root.children:
            visit(top, [])
        for bigger, smaller in sorted(distance, key=lambda pair: (distance[pair], pair)):
            self._split_order.setdefault(smaller, []).append(bigger)

    # -- queries ------------------------------------------------------------------------------

    def free_cells(self, cell_type: str) -> list[Cell]:
        """Free cells of a type (healthy, unbound, unsplit), in tree order."""
        return sorted(self._free.get(cell_type, ()), key=self._order.__getitem__)

    def counts(self) -> dict[str, int]:
        """Free cells per cell type, every type of the cluster included (for tests and metrics)."""
        return {cell_type: len(cells) for cell_type, cells in self._free.items()}

    def is_bound(self, cell: Cell) -> bool:
        return cell in self._bound

    def bound_cells(self) -> list[Cell]:
        return sorted(self._bound, key=self._order.__getitem__)

    def is_healthy(self, cell: Cell) -> bool:
        """False if the cell is marked unhealthy, contains such a cell or sits inside one."""
        return self._unhealthy_below.get(cell, 0) == 0 and self._marked_ancestor(cell) is None

    # -- bind and release ---------------------------------------------------------------------

    def bind(self, cell_type: str, prefer: Prefer | None = None) -> Cell | None:
        """Take a free cell of `cell_type`, splitting the nearest bigger free cell if none is free.

        Among candidates the one with the smallest `prefer(cell)` wins (ties: tree order). A
        split takes a cell of the nearest bigger level first (HiveD: keep the big cells whole),
        chosen by `prefer` within that level, then goes down choosing each child by `prefer`.
        None if no free healthy cell holds a cell of that type.
        """
        if cell_type not in self._free or cell_type == self._root.cell_type:
            raise ValueError(f"the cluster has no cell of type {cell_type!r}")
        key = self._key(prefer)
        free = self._free[cell_type]
        if free:
            cell = min(free, key=key)
            self._take_free(cell)
            self._bound[cell] = None
            return cell
        for bigger in self._split_order.get(cell_type, ()):
            candidates = [c for c in self._free[bigger] if cell_type in self._types_below[c]]
            if candidates:
                cell = min(candidates, key=key)
                self._take_free(cell)
                while cell.cell_type != cell_type:
                    self._split_into_free(cell)
                    cell = min(
                        (
                            child
                            for child in cell.children
                            if child.cell_type == cell_type or cell_type in self._types_below[child]
                        ),
                        key=key,
                    )
                    self._take_free(cell)
                self._bound[cell] = None
                return cell
        return None

    def release(self, cell: Cell) -> None:
        """Give a bound cell back: it becomes free (or quarantined where unhealthy) and merges
        with its buddies up the tree."""
        if cell not in self._bound:
            raise ValueError(f"cell {cell.name!r} is not bound")
        del self._bound[cell]
        self._settle(cell, self._marked_ancestor(cell) is not None)

    # -- health -------------------------------------------------------------------------------

    def mark_unhealthy(self, node: Cell) -> list[Cell]:
        """Take a failed cell (usually a node) out of allocation until `mark_healthy`.

        Returns the bound cells that overlap it (a bound cell containing it, or the bound cells
        inside it), in tree order: their holders should move to healthy cells (bind a new cell,
        then release the old one, whose healthy parts then become free again).
        """
        if node in self._unhealthy:
            return self._bound_overlapping(node)
        self._unhealthy[node] = None
        up: Cell | None = node
        while up is not None:
            self._unhealthy_below[up] = self._unhealthy_below.get(up, 0) + 1
            up = up.parent
        holder = self._stated_ancestor(node)
        if holder in self._bound:
            return [holder]
        if holder in self._free[holder.cell_type]:
            self._take_free(holder)
            self._settle(holder, self._marked_ancestor(holder) is not None)
            return []
        if holder in self._split:  # then holder is `node` itself: part of it is in use
            bound: list[Cell] = []
            for cell, state in self._walk_split(node):
                if state == "free":
                    self._take_free(cell)
                    self._quarantined[cell] = None
                elif state == "bound":
                    bound.append(cell)
            return bound
        return []  # already quarantined as part of another unhealthy cell

    def mark_healthy(self, node: Cell) -> None:
        """Return a repaired cell to allocation; its free parts merge with their buddies."""
        if node not in self._unhealthy:
            return
        del self._unhealthy[node]
        up: Cell | None = node
        while up is not None:
            left = self._unhealthy_below[up] - 1
            if left:
                self._unhealthy_below[up] = left
            else:
                del self._unhealthy_below[up]
            up = up.parent
        if self._stated_ancestor(node) is not node:
            return  # inside a bound cell (release will settle it) or a still-quarantined one
        waiting = [cell for cell, state in self._walk_split(node) if state == "quarantined"]
        for cell in waiting:
            del self._quarantined[cell]
            self._settle(cell, self._marked_ancestor(cell) is not None)

    # -- internals ----------------------------------------------------------------------------

    def _key(self, prefer: Prefer | None) -> Callable[[Cell], Any]:
        order = self._order
        if prefer is None:
            return order.__getitem__
        return lambda cell: (prefer(cell), order[cell])

    def _take_free(self, cell: Cell) -> None:
        del self._free[cell.cell_type][cell]
        parent = cell.parent
        if parent is not None and parent is not self._root:
            self._split[parent] -= 1

    def _add_free(self, cell: Cell) -> None:
        """Make a healthy cell free, merging it with its buddies as far up as they are all free."""
        while True:
            self._free[cell.cell_type][cell] = None
            parent = cell.parent
            if parent is None or parent is self._root:
                return
            self._split[parent] += 1
            if self._split[parent] < len(parent.children):
                return
            for child in parent.children:
                del self._free[child.cell_type][child]
            del self._split[parent]
            cell = parent

    def _split_into_free(self, cell: Cell) -> None:
        for child in cell.children:
            self._free[child.cell_type][child] = None
        self._split[cell] = len(cell.children)

    def _settle(self, cell: Cell, inside_unhealthy: bool) -> None:
        """Place a stateless cell: free if healthy, quarantined if unhealthy or inside an unhealthy
        cell, otherwise split around the unhealthy cells it contains."""
        if inside_unhealthy or cell in self._unhealthy:
            self._quarantined[cell] = None
        elif self._unhealthy_below.get(cell, 0) == 0:
            self._add_free(cell)
        else:
            self._split[cell] = 0
            for child in cell.children:
                self._settle(child, False)

    def _marked_ancestor(self, cell: Cell) -> Cell | None:
        up: Cell | None = cell
        while up is not None:
            if up in self._unhealthy:
                return up
            up = up.parent
        return None

    def _stated_ancestor(self, cell: Cell) -> Cell:
        """The cell itself or its nearest ancestor that is free, bound, split or quarantined."""
        up = cell
        while not (
            up in self._split
            or up in self._bound
            or up in self._quarantined
            or up in self._free[up.cell_type]
        ):
            assert up.parent is not None and up.parent is not self._root
            up = up.parent
        return up

    def _walk_split(self, cell: Cell) -> Iterator[tuple[Cell, str]]:
        """The stated cells at or below `cell`, going down through split cells only."""
        stack = [cell]
        while stack:
            current = stack.pop()
            if current in self._split:
                stack.extend(reversed(current.children))
            elif current in self._bound:
                yield current, "bound"
            elif current in self._quarantined:
                yield current, "quarantined"
            elif current in self._free[current.cell_type]:
                yield current, "free"

    def _bound_overlapping(self, cell: Cell) -> list[Cell]:
        holder = self._stated_ancestor(cell)
        if holder in self._bound:
            return [holder]
        if holder is cell:
            return [c for c, state in self._walk_split(cell) if state == "bound"]
        return []
