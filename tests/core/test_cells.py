"""Buddy cell allocation (corral.core.cells): hand-worked cases on the multi-tenancy issue's example
config and on shorthand clusters, then random bind/release/failure sequences against invariants."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.core.cells import CellAllocator
from corral.core.cluster import Cell, Cluster
from corral.core.config import parse_cluster_config

RACK, NODE, PAIR = "V100-RACK", "V100-NODE", "V100-2GPU"


def example_cluster() -> Cluster:
    """2 x V100-RACK of 4 x V100-NODE of 4 x V100-2GPU of 2 x V100 (64 GPUs)."""
    return parse_cluster_config(
        {
            "cell_types": {
                PAIR: {"child": "V100", "count": 2},
                NODE: {"child": PAIR, "count": 4, "node": True},
                RACK: {"child": NODE, "count": 4},
            },
            "physical_cells": [{"type": RACK, "count": 2}],
            "virtual_clusters": {"vision": {NODE: 3, PAIR: 1}, "nlp": {RACK: 1}},
        }
    ).cluster


def mixed_cluster() -> Cluster:
    """Top-level cells of two types: one rack of 2 nodes and two standalone nodes."""
    return parse_cluster_config(
        {
            "cell_types": {
                PAIR: {"child": "V100", "count": 2},
                NODE: {"child": PAIR, "count": 2, "node": True},
                RACK: {"child": NODE, "count": 2},
            },
            "physical_cells": [{"type": RACK, "count": 1}, {"type": NODE, "names": ["a", "b"]}],
        }
    ).cluster


def cells_of(cluster: Cluster) -> Iterator[Cell]:
    stack = list(reversed(cluster.root.children))
    while stack:
        cell = stack.pop()
        yield cell
        stack.extend(reversed(cell.children))


def by_name(cluster: Cluster, name: str) -> Cell:
    return next(cell for cell in cells_of(cluster) if cell.name == name)


def names(cells: list[Cell]) -> list[str]:
    return [cell.name for cell in cells]


def gpus(cell: Cell) -> set[int]:
    return {leaf.index for leaf in cell.leaves()}


def ancestors_and_self(cell: Cell) -> Iterator[Cell]:
    up: Cell | None = cell
    while up is not None and up.parent is not None:
        yield up
        up = up.parent


def counts(alloc: CellAllocator) -> dict[str, int]:
    return {t: n for t, n in alloc.counts().items() if n}


# -- the example config -------------------------------------------------------------


def test_initially_the_top_level_cells_are_free() -> None:
    cluster = example_cluster()
    alloc = CellAllocator(cluster)
    assert alloc.counts() == {RACK: 2, NODE: 0, PAIR: 0, "v100": 0}
    assert names(alloc.free_cells(RACK)) == ["V100-RACK-0", "V100-RACK-1"]
    assert alloc.free_cells("no-such-type") == []


def test_bind_splits_a_rack_then_a_node_and_the_buddy_needs_no_split() -> None:
    alloc = CellAllocator(example_cluster())
    first = alloc.bind(PAIR)
    assert first is not None and first.name == "V100-RACK-0/V100-NODE-0/V100-2GPU-0"
    assert alloc.is_bound(first)
    # rack 0 split into 4 nodes (one taken and split), node 0 into 4 pairs (one taken)
    assert counts(alloc) == {RACK: 1, NODE: 3, PAIR: 3}
    assert names(alloc.free_cells(NODE)) == [f"V100-RACK-0/V100-NODE-{i}" for i in (1, 2, 3)]

    second = alloc.bind(PAIR)
    assert second is not None and second.name == "V100-RACK-0/V100-NODE-0/V100-2GPU-1"
    assert counts(alloc) == {RACK: 1, NODE: 3, PAIR: 2}  # a free buddy: nothing split

    alloc.release(first)
    assert counts(alloc) == {RACK: 1, NODE: 3, PAIR: 3}  # its buddy is still bound: no merge
    assert not alloc.is_bound(first)
    alloc.release(second)
    assert alloc.counts() == {RACK: 2, NODE: 0, PAIR: 0, "v100": 0}  # merged all the way up


def test_a_ninth_node_from_two_racks_of_four_is_refused() -> None:
    alloc = CellAllocator(example_cluster())
    bound = [alloc.bind(NODE) for _ in range(8)]
    assert all(cell is not None for cell in bound)
    assert len({cell.name for cell in bound if cell is not None}) == 8
    assert alloc.bind(NODE) is None
    assert alloc.bind(PAIR) is None and alloc.bind("v100") is None
    assert counts(alloc) == {}
    for cell in bound:
        assert cell is not None
        alloc.release(cell)
    assert counts(alloc) == {RACK: 2}


def test_a_gpu_is_bound_by_splitting_down_to_the_leaves() -> None:
    alloc = CellAllocator(example_cluster())
    gpu = alloc.bind("v100")
    assert gpu is not None and gpu.name == "V100-RACK-0/V100-NODE-0/gpu0"
    assert counts(alloc) == {RACK: 1, NODE: 3, PAIR: 3, "v100": 1}


def test_unknown_cell_type_and_double_release_are_refused() -> None:
    cluster = example_cluster()
    alloc = CellAllocator(cluster)
    with pytest.raises(ValueError, match="no cell of type 'V100-POD'"):
        alloc.bind("V100-POD")
    with pytest.raises(ValueError, match="not bound"):
        alloc.release(by_name(cluster, "V100-RACK-0"))  # free, not bound
    cell = alloc.bind(NODE)
    assert cell is not None
    alloc.release(cell)
    with pytest.raises(ValueError, match="not bound"):
        alloc.release(cell)


def test_prefer_picks_the_smallest_key_among_free_cells() -> None:
    cluster = example_cluster()
    alloc = CellAllocator(cluster)
    alloc.bind(PAIR)  # leaves nodes 1, 2, 3 of rack 0 free
    busy = {
        "V100-RACK-0/V100-NODE-1": 5,
        "V100-RACK-0/V100-NODE-2": 0,
        "V100-RACK-0/V100-NODE-3": 2,
    }
    chosen = alloc.bind(NODE, prefer=lambda cell: busy[cell.name])
    assert chosen is not None and chosen.name == "V100-RACK-0/V100-NODE-2"
    chosen = alloc.bind(NODE, prefer=lambda cell: busy[cell.name])
    assert chosen is not None and chosen.name == "V100-RACK-0/V100-NODE-3"


def test_prefer_also_chooses_which_cell_to_split() -> None:
    """Opportunistic jobs busy GPUs 0-1 of rack 0's node 0 and GPU 0 of rack 1's nodes 0 and 1:
    rack 1 has more busy GPUs, so rack 0 is split, and inside it node 1 (idle) is taken."""
    cluster = example_cluster()
    alloc = CellAllocator(cluster)
    busy = {
        "V100-RACK-0/V100-NODE-0/gpu0",
        "V100-RACK-0/V100-NODE-0/gpu1",
        "V100-RACK-1/V100-NODE-0/gpu0",
        "V100-RACK-1/V100-NODE-1/gpu0",
        "V100-RACK-1/V100-NODE-1/gpu1",
    }

    def busy_gpus(cell: Cell) -> int:
        return sum(leaf.name in busy for leaf in cell.leaves())

    chosen = alloc.bind(NODE, prefer=busy_gpus)
    assert chosen is not None and chosen.name == "V100-RACK-0/V100-NODE-1"
    # a free node (the nearest level) is split before the free rack 1
    pair = alloc.bind(PAIR, prefer=busy_gpus)
    assert pair is not None and pair.name == "V100-RACK-0/V100-NODE-2/V100-2GPU-0"
    assert counts(alloc) == {RACK: 1, NODE: 2, PAIR: 3}


def test_a_dead_node_inside_a_bound_rack_is_reported_and_never_handed_out() -> None:
    cluster = example_cluster()
    alloc = CellAllocator(cluster)
    rack0 = alloc.bind(RACK)
    assert rack0 is not None and rack0.name == "V100-RACK-0"
    dead = by_name(cluster, "V100-RACK-0/V100-NODE-2")
    assert alloc.mark_unhealthy(dead) == [rack0]
    assert not alloc.is_healthy(rack0) and alloc.is_healthy(by_name(cluster, "V100-RACK-1"))

    # the holder moves its binding: a new rack first, then the old one back
    rack1 = alloc.bind(RACK)
    assert rack1 is not None and rack1.name == "V100-RACK-1"
    alloc.release(rack0)
    # rack 0 is split around the dead node: its three healthy buddies are free, it is not
    assert counts(alloc) == {NODE: 3}
    assert names(alloc.free_cells(NODE)) == [f"V100-RACK-0/V100-NODE-{i}" for i in (0, 1, 3)]
    assert alloc.bind(RACK) is None
    taken = [alloc.bind(PAIR) for _ in range(12)]  # 3 healthy nodes x 4 pairs
    assert all(cell is not None and dead not in ancestors_and_self(cell) for cell in taken)
    assert alloc.bind(PAIR) is None and alloc.bind(NODE) is None

    alloc.mark_healthy(dead)
    assert counts(alloc) == {NODE: 1}
    back = alloc.bind(NODE)
    assert back is dead
    for cell in [*taken, back, rack1]:
        assert cell is not None
        alloc.release(cell)
    assert alloc.counts() == {RACK: 2, NODE: 0, PAIR: 0, "v100": 0}


def test_a_dead_node_in_a_free_rack_keeps_its_buddies_free() -> None:
    cluster = example_cluster()
    alloc = CellAllocator(cluster)
    dead = by_name(cluster, "V100-RACK-1/V100-NODE-0")
    assert alloc.mark_unhealthy(dead) == []
    assert counts(alloc) == {RACK: 1, NODE: 3}
    assert alloc.mark_unhealthy(dead) == []  # marking twice changes nothing
    assert alloc.bind(RACK) is not None
    assert alloc.bind(RACK) is None
    alloc.mark_healthy(dead)
    assert counts(alloc) == {RACK: 1}
    alloc.mark_healthy(dead)  # already healthy: nothing to do
    assert counts(alloc) == {RACK: 1}


def test_a_dead_node_that_is_partly_bound_reports_the_cells_on_it() -> None:
    cluster = example_cluster()
    alloc = CellAllocator(cluster)
    pair = alloc.bind(PAIR)
    assert pair is not None
    node = pair.parent
    assert node is not None and node.name == "V100-RACK-0/V100-NODE-0"
    assert alloc.mark_unhealthy(node) == [pair]
    assert counts(alloc) == {RACK: 1, NODE: 3}  # the node's three free pairs are held back
    again = alloc.bind(PAIR)
    assert again is not None and again.name == "V100-RACK-0/V100-NODE-1/V100-2GPU-0"
    alloc.release(pair)  # on the dead node: held back, not free
    assert counts(alloc) == {RACK: 1, NODE: 2, PAIR: 3}
    alloc.mark_healthy(node)
    assert counts(alloc) == {RACK: 1, NODE: 3, PAIR: 3}
    alloc.release(again)
    assert counts(alloc) == {RACK: 2}


def test_a_dead_rack_and_a_dead_node_inside_it_heal_in_either_order() -> None:
    cluster = example_cluster()
    alloc = CellAllocator(cluster)
    rack = by_name(cluster, "V100-RACK-0")
    node = by_name(cluster, "V100-RACK-0/V100-NODE-1")
    alloc.mark_unhealthy(node)
    alloc.mark_unhealthy(rack)
    assert counts(alloc) == {RACK: 1}
    alloc.mark_healthy(node)
    assert counts(alloc) == {RACK: 1}  # still inside a dead rack
    alloc.mark_healthy(rack)
    assert counts(alloc) == {RACK: 2}
    alloc.mark_unhealthy(rack)
    alloc.mark_unhealthy(node)
    alloc.mark_healthy(rack)
    assert counts(alloc) == {RACK: 1, NODE: 3}
    alloc.mark_healthy(node)
    assert counts(alloc) == {RACK: 2}


# -- shorthand clusters ---------------------------------------------------------------------


def test_shorthand_cluster_racks_nodes_and_gpus() -> None:
    alloc = CellAllocator(Cluster.shorthand(4, 8, racks=2))
    assert alloc.counts() == {"rack": 2, "node": 0, "v100": 0}
    node = alloc.bind("node")
    assert node is not None and node.name == "node-0000"
    assert counts(alloc) == {"rack": 1, "node": 1}
    gpu = alloc.bind("v100")  # a free node is nearer than a free rack
    assert gpu is not None and gpu.name == "node-0001/gpu0"
    assert counts(alloc) == {"rack": 1, "v100": 7}
    rack = alloc.bind("rack")
    assert rack is not None and rack.name == "rack-01"
    assert alloc.bind("node") is None
    for cell in (gpu, node, rack):
        alloc.release(cell)
    assert counts(alloc) == {"rack": 2}


def test_shorthand_cluster_with_switches() -> None:
    cluster = Cluster.shorthand(2, 8, racks=1, gpus_per_switch=4)
    alloc = CellAllocator(cluster)
    switch = alloc.bind("switch")
    assert switch is not None and switch.name == "node-0000/sw0"
    assert counts(alloc) == {"node": 1, "switch": 1}
    alloc.release(switch)
    assert counts(alloc) == {"rack": 1}


def test_mixed_top_level_types_split_the_nearest_level_first() -> None:
    cluster = mixed_cluster()
    alloc = CellAllocator(cluster)
    assert counts(alloc) == {RACK: 1, NODE: 2}
    assert [alloc.bind(NODE).name for _ in range(2)] == ["a", "b"]  # type: ignore[union-attr]
    third = alloc.bind(NODE)
    assert third is not None and third.name == "V100-RACK-0/V100-NODE-0"


# -- random sequences -----------------------------------------------------------------------

CLUSTERS: list[Callable[[], Cluster]] = [
    example_cluster,
    mixed_cluster,
    lambda: Cluster.shorthand(4, 8, racks=2),
    lambda: Cluster.shorthand(5, 4, racks=2, gpus_per_switch=2),  # racks of 3 and 2 nodes
]


def contains_type(cell: Cell, cell_type: str) -> bool:
    """The cell is of that type or has a cell of that type somewhere below it."""
    return any(below.cell_type == cell_type for below in _subtree(cell))


def _subtree(cell: Cell) -> Iterator[Cell]:
    yield cell
    for child in cell.children:
        yield from _subtree(child)


def check_invariants(alloc: CellAllocator, cluster: Cluster, unhealthy: set[Cell]) -> None:
    free = [cell for cell_type in alloc.counts() for cell in alloc.free_cells(cell_type)]
    bound = alloc.bound_cells()
    seen: set[int] = set()
    for cell in [*bound, *free]:
        mine = gpus(cell)
        assert not (mine & seen), f"{cell.name} overlaps another bound or free cell"
        seen |= mine
    bad_gpus = {g for cell in unhealthy for g in gpus(cell)}
    for cell in free:
        assert not (gpus(cell) & bad_gpus), f"free {cell.name} holds an unhealthy GPU"
        assert not any(up in unhealthy for up in ancestors_and_self(cell))
        parent = cell.parent
        if parent is not None and parent is not cluster.root:
            free_set = set(free)
            assert not all(child in free_set for child in parent.children), "unmerged buddies"
    # nothing leaks: a GPU neither free nor bound is held back by an unhealthy cell
    assert set(range(len(cluster.gpus))) - seen <= bad_gpus


operation = st.one_of(
    st.tuples(st.just("bind"), st.integers(0, 20), st.integers(0, 3)),
    st.tuples(st.just("release"), st.integers(0, 1000), st.just(0)),
    st.tuples(st.just("unhealthy"), st.integers(0, 1000), st.just(0)),
    st.tuples(st.just("healthy"), st.integers(0, 1000), st.just(0)),
)


@settings(max_examples=300, deadline=None)
@given(
    which=st.integers(0, len(CLUSTERS) - 1),
    operations=st.lists(operation, max_size=60),
)
def test_random_sequences_keep_the_invariants(
    which: int, operations: list[tuple[str, int, int]]
) -> None:
    cluster = CLUSTERS[which]()
    alloc = CellAllocator(cluster)
    initial = alloc.counts()
    types = sorted(initial)
    targets = list(cells_of(cluster))
    unhealthy: set[Cell] = set()
    for op, number, seed in operations:
        if op == "bind":
            cell_type = types[number % len(types)]

            def prefer(cell: Cell, seed: int = seed) -> int:
                return zlib.crc32(f"{seed}:{cell.name}".encode()) % 4

            before = alloc.counts()
            free_before = alloc.free_cells(cell_type)
            got = alloc.bind(cell_type, prefer=prefer if seed else None)
            if got is None:
                assert all(
                    not contains_type(cell, cell_type)
                    for t in before
                    for cell in alloc.free_cells(t)
                )
                assert alloc.counts() == before
                continue
            assert got.cell_type == cell_type and alloc.is_bound(got)
            assert not any(up in unhealthy for up in ancestors_and_self(got))
            assert not (gpus(got) & {g for cell in unhealthy for g in gpus(cell)})
            if free_before:  # never split when a cell of the type is free
                assert got in free_before
                if seed:
                    assert prefer(got) == min(prefer(cell) for cell in free_before)
                else:
                    assert got is free_before[0]
                assert alloc.counts() == {**before, cell_type: before[cell_type] - 1}
        elif op == "release":
            bound = alloc.bound_cells()
            if bound:
                alloc.release(bound[number % len(bound)])
        elif op == "unhealthy":
            target = targets[number % len(targets)]
            overlapping = [
                cell
                for cell in alloc.bound_cells()
                if target in ancestors_and_self(cell) or cell in ancestors_and_self(target)
            ]
            assert alloc.mark_unhealthy(target) == overlapping
            unhealthy.add(target)
        else:
            if unhealthy:
                target = sorted(unhealthy, key=targets.index)[number % len(unhealthy)]
                alloc.mark_healthy(target)
                unhealthy.discard(target)
        check_invariants(alloc, cluster, unhealthy)
    for target in list(unhealthy):
        alloc.mark_healthy(target)
    for cell in alloc.bound_cells():
        alloc.release(cell)
    assert alloc.counts() == initial
    free_now = [cell for t in types for cell in alloc.free_cells(t)]
    assert set(free_now) == set(cluster.root.children)
