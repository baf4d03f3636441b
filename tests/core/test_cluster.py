"""The cell tree and its incremental free counts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.core import Cluster, ClusterError
from corral.core.text import count_noun


def recount(cluster: Cluster) -> None:
    """Check every incremental count against a recount from the GPUs' own flags."""

    def visit(cell):  # type: ignore[no-untyped-def]
        if cell.is_gpu:
            expected = cluster.gpu_free[cell.index]
        else:
            expected = sum(visit(child) for child in cell.children)
        assert cell.free_gpus == expected, cell.name
        return expected

    visit(cluster.root)
    by_type: dict[str, int] = {}
    for node in cluster.nodes:
        by_type[node.gpu_type] = by_type.get(node.gpu_type, 0) + node.free_gpus
        assert (node.index in set(cluster.nodes_with_free(node.gpu_type, 1))) == (
            node.free_gpus > 0
        )
    assert dict(cluster.free_by_type) == by_type


def test_shorthand_builds_nodes_racks_and_counts():
    cluster = Cluster.shorthand(64, 8, racks=8)
    assert cluster.total_gpus == 512 and len(cluster.nodes) == 64 and len(cluster.racks) == 8
    assert all(len(nodes) == 8 for nodes in cluster.rack_nodes)
    assert cluster.describe() == "64 nodes (64x8 v100), 512 GPUs, 8 racks"


@pytest.mark.parametrize(
    "nodes,gpus,racks,described",
    [
        (1, 1, 1, "1 node (1x1 v100), 1 GPU, 1 rack"),
        (1, 2, 1, "1 node (1x2 v100), 2 GPUs, 1 rack"),
        (2, 1, 2, "2 nodes (2x1 v100), 2 GPUs, 2 racks"),
    ],
)
def test_describe_puts_each_count_in_the_right_number(nodes, gpus, racks, described):
    assert Cluster.shorthand(nodes, gpus, racks=racks).describe() == described


def test_count_noun():
    assert [count_noun(n, "job") for n in (0, 1, 2)] == ["0 jobs", "1 job", "2 jobs"]
    assert count_noun(1, "VC") == "1 VC" and count_noun(3, "VC") == "3 VCs"
    assert count_noun(2, "switch", "switches") == "2 switches"
    assert count_noun(1, "switch", "switches") == "1 switch"
    assert count_noun(2496, "GPU", spec=",") == "2,496 GPUs"
    assert count_noun(-1, "job") == "-1 jobs"


@pytest.mark.parametrize("nodes,gpus,racks", [(0, 8, 1), (4, 0, 1), (4, 8, 5), (4, 8, 0)])
def test_shorthand_refuses_impossible_shapes(nodes, gpus, racks):
    with pytest.raises(ClusterError):
        Cluster.shorthand(nodes, gpus, racks=racks)


def test_double_allocation_and_double_release_are_refused():
    cluster = Cluster.shorthand(1, 2)
    cluster.allocate([0])
    with pytest.raises(ClusterError, match="already allocated"):
        cluster.allocate([0])
    cluster.release([0])
    with pytest.raises(ClusterError, match="already free"):
        cluster.release([0])


def test_nodes_with_free_lists_tightest_first():
    cluster = Cluster.shorthand(3, 4)
    cluster.allocate([0, 1, 2])  # node 0: 1 free
    cluster.allocate([4])  # node 1: 3 free; node 2: 4 free
    assert list(cluster.nodes_with_free("v100", 1)) == [0, 1, 2]
    assert list(cluster.nodes_with_free("v100", 2)) == [1, 2]
    assert list(cluster.nodes_most_free_first("v100")) == [2, 1, 0]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 47)), max_size=120))
def test_free_counts_stay_exact_under_any_allocation_sequence(ops):
    cluster = Cluster.shorthand(6, 8, racks=2, gpus_per_switch=4)
    for allocate, gpu in ops:
        free = cluster.gpu_free[gpu] == 1
        if allocate and free:
            cluster.allocate([gpu])
        elif not allocate and not free:
            cluster.release([gpu])
    recount(cluster)
    assert cluster.free_gpus == sum(cluster.gpu_free)


def structure(cluster: Cluster) -> list[tuple[str, str, int, int, list[int]]]:
    """Each node's name, type, rack index, GPU count and switch groups' sizes, in order."""
    return [
        (
            node.name,
            node.gpu_type,
            cluster.node_rack[node.index],
            node.total_gpus,
            [child.total_gpus for child in node.children if not child.is_gpu],
        )
        for node in cluster.nodes
    ]


def test_node_defs_rebuild_the_same_cluster_with_the_same_gpu_names():
    from corral.core.config import parse_cluster_config

    config = parse_cluster_config(
        {
            "cell_types": {
                "PAIR": {"child": "V100", "count": 2},
                "NODE": {"child": "PAIR", "count": 3, "node": True},
                "RACK": {"child": "NODE", "count": 2},
                "K80-NODE": {"child": "K80", "count": 4, "node": True},
            },
            "physical_cells": [{"type": "RACK", "count": 2}, {"type": "K80-NODE", "names": ["k"]}],
        }
    )
    cluster = config.cluster
    again = Cluster.from_nodes(cluster.node_defs())
    assert structure(again) == structure(cluster)
    assert again.gpu_names() == cluster.gpu_names()
    assert cluster.gpu_names()[:2] == [f"{cluster.nodes[0].name}/0", f"{cluster.nodes[0].name}/1"]
    assert [d.gpus_per_switch for d in cluster.node_defs()] == [2, 2, 2, 2, None]
    shorthand = Cluster.shorthand(5, 8, racks=2, gpu_type="a100", gpus_per_switch=3)
    assert structure(Cluster.from_nodes(shorthand.node_defs())) == structure(shorthand)


def test_a_deep_copy_has_its_own_cells_in_the_same_state():
    """copy.deepcopy goes through Cluster.__deepcopy__ (which the compiled build needs): the copy
    has the original's allocations, shares, CPU and memory, version and node order, and changing
    one leaves the other as it was."""
    import copy

    cluster = Cluster.shorthand(3, 4, racks=1, gpus_per_switch=2)
    cluster.allocate([0, 1, 2])  # node 0: 1 free (GPU 3)
    cluster.allocate([4])
    cluster.release([4])  # node 1 is back to 4 free, after node 2 in that bucket
    cluster.claim([3], milli=250, node=0, cpu_milli=500, memory_mib=1024)  # node 0: 0 free
    watched = cluster.watch()
    twin = copy.deepcopy(cluster)
    assert twin.root is not cluster.root and twin.nodes[0] is not cluster.nodes[0]
    assert list(twin.gpu_free) == list(cluster.gpu_free)
    assert twin.free_gpus == 12 - 3 - 1 == 8  # GPU 3 left the whole-GPU counts with its share
    assert twin.gpu_milli_free(3) == 750 and twin.share_free_total == 750
    assert (twin.cpu_used, twin.memory_used) == ([500, 0, 0], [1024, 0, 0])
    assert twin.version == cluster.version
    # Nodes with equal free GPUs come in the order they reached that count: node 2, then node 1
    # (a cluster rebuilt from its allocations alone would give 1, 2).
    assert list(twin.nodes_with_free("v100", 1)) == list(cluster.nodes_with_free("v100", 1))
    assert list(twin.nodes_with_free("v100", 1)) == [2, 1]
    recount(twin)
    twin.allocate([8])
    twin.unclaim([3], milli=250, node=0, cpu_milli=500, memory_mib=1024)
    assert cluster.gpu_free[8] == 1 and cluster.gpu_milli_free(3) == 750
    assert cluster.cpu_used[0] == 500 and twin.cpu_used[0] == 0
    assert twin.free_gpus == 8 - 1 + 1 and cluster.free_gpus == 8
    assert watched == set()  # the copy's changes reach no watcher of the original
    recount(cluster)
    recount(twin)
