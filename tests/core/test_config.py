from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.config_file import load_cluster_config
from corral.core.cluster import Cell
from corral.core.config import (
    MAX_GPUS,
    ConfigError,
    parse_cluster_config,
    vc_gpu_quota,
)

EXAMPLE_YAML = """\
cell_types:
  V100-2GPU: {child: V100, count: 2}             # e.g. a PCIe-switch pair
  V100-NODE: {child: V100-2GPU, count: 4, node: true}
  V100-RACK: {child: V100-NODE, count: 4}
physical_cells:
  - {type: V100-RACK, count: 2}
virtual_clusters:
  vision: {V100-NODE: 3, V100-2GPU: 1}
  nlp: {V100-RACK: 1}
"""


def example() -> dict[str, Any]:
    return {
        "cell_types": {
            "V100-2GPU": {"child": "V100", "count": 2},
            "V100-NODE": {"child": "V100-2GPU", "count": 4, "node": True},
            "V100-RACK": {"child": "V100-NODE", "count": 4},
        },
        "physical_cells": [{"type": "V100-RACK", "count": 2}],
        "virtual_clusters": {"vision": {"V100-NODE": 3, "V100-2GPU": 1}, "nlp": {"V100-RACK": 1}},
    }


def all_cells(cell: Cell) -> Iterator[Cell]:
    yield cell
    for child in cell.children:
        yield from all_cells(child)


def refusal(data: object) -> str:
    with pytest.raises(ConfigError) as info:
        parse_cluster_config(data)
    message = str(info.value)
    assert "\n" not in message
    return message


# -- building -----------------------------------------------------------------------------------


def test_example_builds_two_racks_of_four_nodes_of_eight_gpus() -> None:
    config = parse_cluster_config(example())
    cluster = config.cluster
    assert cluster.total_gpus == 64
    assert len(cluster.nodes) == 8
    assert len(cluster.racks) == 2
    assert [rack.name for rack in cluster.racks] == ["V100-RACK-0", "V100-RACK-1"]
    assert cluster.nodes[2].name == "V100-RACK-0/V100-NODE-2"
    assert cluster.nodes[4].name == "V100-RACK-1/V100-NODE-0"
    assert all(node.total_gpus == 8 and node.gpu_type == "v100" for node in cluster.nodes)
    assert cluster.gpu_types == ["v100"]
    assert cluster.rack_nodes == [[0, 1, 2, 3], [4, 5, 6, 7]]
    node = cluster.nodes[2]
    assert [child.name for child in node.children] == [
        f"V100-RACK-0/V100-NODE-2/V100-2GPU-{j}" for j in range(4)
    ]
    assert [gpu.name for gpu in node.leaves()] == [
        f"V100-RACK-0/V100-NODE-2/gpu{k}" for k in range(8)
    ]
    names = [cell.name for cell in all_cells(cluster.root)]
    assert len(names) == len(set(names)) == 1 + 2 + 8 + 32 + 64


def test_pick_in_node_keeps_a_pair_under_one_switch() -> None:
    cluster = parse_cluster_config(example()).cluster
    picked = cluster.pick_in_node(5, 2)
    assert len(picked) == 2
    switches = {cluster.gpus[g].parent for g in picked}
    assert len(switches) == 1
    (switch,) = switches
    assert switch is not None and switch.cell_type == "V100-2GPU"
    assert switch.parent is cluster.nodes[5]


def test_named_nodes_sit_under_the_root_as_their_own_racks() -> None:
    data = example()
    data["physical_cells"].append({"type": "V100-NODE", "names": ["gpu-a", "gpu-b"]})
    cluster = parse_cluster_config(data).cluster
    assert cluster.total_gpus == 80
    assert len(cluster.nodes) == 10
    assert [rack.name for rack in cluster.racks] == ["V100-RACK-0", "V100-RACK-1", "gpu-a", "gpu-b"]
    gpu_a = cluster.nodes[8]
    assert gpu_a.name == "gpu-a" and gpu_a.parent is cluster.root
    assert cluster.node_rack[8] == 2
    assert [gpu.name for gpu in gpu_a.leaves()][:3] == ["gpu-a/gpu0", "gpu-a/gpu1", "gpu-a/gpu2"]
    assert gpu_a.children[1].name == "gpu-a/V100-2GPU-1"


def test_named_racks_and_counted_nodes_are_numbered_per_type() -> None:
    data = example()
    data["physical_cells"] = [
        {"type": "V100-RACK", "names": ["r1"]},
        {"type": "V100-NODE", "count": 2},
        {"type": "V100-NODE", "count": 1},
    ]
    data["virtual_clusters"] = None
    cluster = parse_cluster_config(data).cluster
    assert [node.name for node in cluster.nodes] == [
        "r1/V100-NODE-0",
        "r1/V100-NODE-1",
        "r1/V100-NODE-2",
        "r1/V100-NODE-3",
        "V100-NODE-0",
        "V100-NODE-1",
        "V100-NODE-2",
    ]
    assert len(cluster.racks) == 4


def test_vc_quota_counts_cells_times_gpus_per_cell() -> None:
    config = parse_cluster_config(example())
    assert config.virtual_clusters == {
        "vision": {"V100-NODE": 3, "V100-2GPU": 1},
        "nlp": {"V100-RACK": 1},
    }
    assert vc_gpu_quota(config) == {"vision": 3 * 8 + 1 * 2, "nlp": 32}


def test_no_vcs_gives_the_whole_cluster_to_default() -> None:
    data = example()
    del data["virtual_clusters"]
    config = parse_cluster_config(data)
    assert config.virtual_clusters == {"default": {}}
    assert vc_gpu_quota(config) == {"default": 64}
    data["virtual_clusters"] = {}
    assert parse_cluster_config(data).virtual_clusters == {"default": {}}


def test_vcs_that_exactly_fill_the_cluster_are_accepted() -> None:
    data = example()
    data["virtual_clusters"] = {"a": {"V100-RACK": 1}, "b": {"V100-NODE": 3}, "c": {"V100-2GPU": 4}}
    assert vc_gpu_quota(parse_cluster_config(data)) == {"a": 32, "b": 24, "c": 8}


def test_without_node_marks_the_level_above_the_gpus_is_the_node() -> None:
    data = {
        "cell_types": {
            "A100-NODE": {"child": "A100", "count": 4},
            "A100-RACK": {"child": "A100-NODE", "count": 2},
            "K80-BOX": {"child": "K80", "count": 2},
        },
        "physical_cells": [{"type": "A100-RACK", "count": 3}, {"type": "K80-BOX", "count": 2}],
    }
    cluster = parse_cluster_config(data).cluster
    assert cluster.total_gpus == 3 * 2 * 4 + 2 * 2
    assert len(cluster.nodes) == 8 and len(cluster.racks) == 5
    assert cluster.gpu_types == ["a100", "k80"]
    assert [n.total_gpus for n in cluster.nodes] == [4] * 6 + [2] * 2
    assert cluster.nodes[0].name == "A100-RACK-0/A100-NODE-0"
    assert cluster.gpus[0].gpu_type == "a100"


# -- refusals -----------------------------------------------------------------------------------


def mutate(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    data = copy.deepcopy(example())
    change(data)
    return data


def set_in(*path: str | int, value: object) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        target: Any = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


def add_physical(**entry: object) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        data["physical_cells"].append(entry)

    return change


def drop(key: str) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        del data[key]

    return change


def node_types(data: dict[str, Any]) -> None:
    data["cell_types"]["A100-NODE"] = {"child": "A100", "count": 8}


REFUSALS: list[tuple[Callable[[dict[str, Any]], None], str]] = [
    (
        set_in("cell_types", "V100-NODE", "count", value=0),
        "cell_types.V100-NODE.count: must be a positive integer, got 0",
    ),
    (
        set_in("cell_types", "V100-NODE", "count", value=True),
        "cell_types.V100-NODE.count: must be a positive integer, got True",
    ),
    (
        set_in("cell_types", "V100-NODE", "count", value="4"),
        "cell_types.V100-NODE.count: must be a positive integer, got '4'",
    ),
    (
        set_in("cell_types", "V100-NODE", "count", value=2.0),
        "cell_types.V100-NODE.count: must be a positive integer, got 2.0",
    ),
    (
        set_in("physical_cells", 0, "count", value=-1),
        "physical_cells.0.count: must be a positive integer, got -1",
    ),
    (
        set_in("virtual_clusters", "nlp", "V100-RACK", value=False),
        "virtual_clusters.nlp.V100-RACK: must be a positive integer, got False",
    ),
    (
        set_in("cell_types", "V100-NODE", "node", value="yes"),
        "cell_types.V100-NODE.node: must be true or false, got 'yes'",
    ),
    (
        set_in("cell_types", "V100-NODE", "children", value=4),
        "cell_types.V100-NODE.children: unknown key (expected one of: child, count, node)",
    ),
    (
        set_in("physical_cells", 0, "racks", value=4),
        "physical_cells.0.racks: unknown key (expected one of: type, count, names)",
    ),
    (
        set_in("virtual_cluster", value={}),
        "virtual_cluster: unknown key (expected one of: cell_types, physical_cells, "
        "virtual_clusters, departments, maintenance, health_check, reservations)",
    ),
    (drop("physical_cells"), "physical_cells: required key is missing"),
    (set_in("cell_types", "V100-NODE", value=8), "cell_types.V100-NODE: must be a mapping, got 8"),
    (
        set_in("cell_types", "V100/NODE", value={"child": "V100", "count": 8}),
        "cell_types.V100/NODE: invalid name: must not contain '/' (it separates the levels of cell "
        "names), got 'V100/NODE'",
    ),
    (set_in("cell_types", value={}), "cell_types: must define at least one cell type"),
    # unknown cell types
    (
        set_in("cell_types", "V100-RACK", "child", value="v100-node"),
        "cell_types.V100-RACK.child: unknown cell type 'v100-node' (did you mean 'V100-NODE'? "
        "names are case-sensitive)",
    ),
    (
        set_in("cell_types", "V100-RACK", "child", value="V100-NOD"),
        "cell_types.V100-RACK.child: unknown cell type 'V100-NOD' (did you mean 'V100-NODE'?): as "
        "a GPU type it leaves the chain V100-RACK > V100-NOD without a node level",
    ),
    (
        set_in("physical_cells", 0, "type", value="V100-RAK"),
        "physical_cells.0.type: unknown cell type 'V100-RAK' (did you mean 'V100-RACK'?)",
    ),
    (
        set_in("physical_cells", 0, "type", value="V100"),
        "physical_cells.0.type: unknown cell type 'V100': it is a GPU type, and a physical cell "
        "must be a node or contain nodes",
    ),
    (
        set_in("virtual_clusters", "vision", "V100-NODES", value=1),
        "virtual_clusters.vision.V100-NODES: unknown cell type 'V100-NODES' (did you mean "
        "'V100-NODE'?)",
    ),
    (
        set_in("virtual_clusters", "vision", "v100", value=1),
        "virtual_clusters.vision.v100: unknown cell type 'v100': it is a GPU type, and a VC is "
        "given cells",
    ),
    # cycles and node levels
    (
        set_in("cell_types", "V100-2GPU", "child", value="V100-RACK"),
        "cell_types.V100-2GPU.child: cell types form a cycle: V100-2GPU > V100-RACK > V100-NODE > "
        "V100-2GPU",
    ),
    (
        set_in("cell_types", "LOOP", value={"child": "LOOP", "count": 1}),
        "cell_types.LOOP.child: cell types form a cycle: LOOP > LOOP",
    ),
    (
        set_in("cell_types", "V100-RACK", "node", value=True),
        "cell_types.V100-RACK.node: the chain V100-RACK > V100-NODE > V100-2GPU > V100 has 2 node "
        "levels (V100-RACK, V100-NODE); mark only one",
    ),
    (
        node_types,
        "cell_types.A100-NODE: no level of the chain A100-NODE > A100 is marked node: true; once "
        "any cell type is marked, every chain needs exactly one",
    ),
    # physical cells
    (set_in("physical_cells", value=[]), "physical_cells: must list at least one cell"),
    (
        set_in("physical_cells", 0, "type", value="V100-2GPU"),
        "physical_cells.0.type: V100-2GPU is below node level (it sits inside V100-NODE); a "
        "physical cell must be a node or contain nodes",
    ),
    (
        set_in("physical_cells", 0, "names", value=["r0", "r1"]),
        "physical_cells.0: give either count (how many cells) or names (one per cell)",
    ),
    (
        set_in("physical_cells", 0, value={"type": "V100-RACK"}),
        "physical_cells.0: give either count (how many cells) or names (one per cell)",
    ),
    (
        add_physical(type="V100-NODE", names=[]),
        "physical_cells.1.names: must list at least one name",
    ),
    (
        add_physical(type="V100-NODE", names=["a", "b", "a"]),
        "physical_cells.1.names.2: name 'a' is listed twice (also at physical_cells.1.names.0)",
    ),
    (
        add_physical(type="V100-NODE", names=["V100-RACK-1"]),
        "physical_cells.1.names.0: name 'V100-RACK-1' is also the generated name of a cell of "
        "physical_cells.0; pick another",
    ),
    (
        set_in("physical_cells", 0, "count", value=MAX_GPUS),
        f"physical_cells: the cluster would have {64 * MAX_GPUS // 2} GPUs, more than the limit of "
        f"{MAX_GPUS}; check the counts",
    ),
    # virtual clusters
    (
        set_in("virtual_clusters", "vision", value={}),
        "virtual_clusters.vision: a VC must be given at least one cell (leave virtual_clusters out "
        "to give the whole cluster to one 'default' VC)",
    ),
    (
        set_in("virtual_clusters", "nlp", value={"V100-RACK": 3}),
        "virtual_clusters.nlp.V100-RACK: the VCs ask for 3 V100-RACK cells in all (nlp 3) but the "
        "cluster has 2",
    ),
]


@pytest.mark.parametrize(("change", "expected"), REFUSALS, ids=[e for _, e in REFUSALS])
def test_refusals_name_the_key_path_on_one_line(
    change: Callable[[dict[str, Any]], None], expected: str
) -> None:
    assert refusal(mutate(change)) == expected


def test_node_name_listed_twice_across_entries() -> None:
    data = example()
    data["physical_cells"] += [
        {"type": "V100-NODE", "names": ["gpu-a", "gpu-b"]},
        {"type": "V100-NODE", "names": ["gpu-c", "gpu-a"]},
    ]
    assert refusal(data) == (
        "physical_cells.2.names.1: name 'gpu-a' is listed twice (also at physical_cells.1.names.0)"
    )


def test_vcs_asking_more_nodes_than_exist_are_refused() -> None:
    # 2 racks x 4 nodes = 8 V100-NODE cells; 5 + 4 = 9 are asked.
    data = example()
    data["virtual_clusters"] = {"vision": {"V100-NODE": 5}, "nlp": {"V100-NODE": 4}}
    message = refusal(data)
    assert message == (
        "virtual_clusters.nlp.V100-NODE: the VCs ask for 9 V100-NODE cells in all "
        "(vision 5, nlp 4) but the cluster has 8"
    )


def test_a_rack_given_to_a_vc_leaves_fewer_nodes_for_the_others() -> None:
    # 8 nodes exist, but the rack given to "big" holds 4 of them: 5 more nodes do not fit.
    data = example()
    data["virtual_clusters"] = {"big": {"V100-RACK": 1}, "small": {"V100-NODE": 5}}
    assert refusal(data) == (
        "virtual_clusters.small.V100-NODE: the VCs ask for 5 V100-NODE cells in all (small 5) "
        "but only 4 of the cluster's 8 are left outside the bigger cells given to VCs"
    )
    # ...and switch pairs: 2 racks = 32 pairs; a rack (16) and 3 nodes (12) leave 4.
    data["virtual_clusters"] = {
        "big": {"V100-RACK": 1},
        "mid": {"V100-NODE": 3},
        "small": {"V100-2GPU": 3},
        "tiny": {"V100-2GPU": 2},
    }
    assert refusal(data).startswith(
        "virtual_clusters.tiny.V100-2GPU: the VCs ask for 5 V100-2GPU cells in all "
        "(small 3, tiny 2) but only 4 of the cluster's 32"
    )


def test_not_a_mapping() -> None:
    assert refusal([1, 2]).startswith("the config must be a mapping")
    assert refusal(None) == "the config is empty"


# -- YAML files ---------------------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def file_refusal(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_cluster_config(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    return message[len(f"{path}: ") :]


def test_load_example_file(tmp_path: Path) -> None:
    config = load_cluster_config(write(tmp_path, EXAMPLE_YAML))
    assert config.cluster.total_gpus == 64
    assert vc_gpu_quota(config) == {"vision": 26, "nlp": 32}


def test_file_semantic_error_names_file_and_key_path(tmp_path: Path) -> None:
    path = write(tmp_path, EXAMPLE_YAML.replace("count: 4, node: true", "count: 0, node: true"))
    assert file_refusal(path) == "cell_types.V100-NODE.count: must be a positive integer, got 0"


def test_file_yaml_syntax_error_gives_the_line(tmp_path: Path) -> None:
    path = write(
        tmp_path, EXAMPLE_YAML.replace("{type: V100-RACK, count: 2}", "{type: V100-RACK, count: 2")
    )
    assert file_refusal(path).startswith("line 7, column ")
    path = write(tmp_path, "cell_types:\n  a: b\n c: d\n")
    assert file_refusal(path).startswith("line 3, column 2: invalid YAML: ")


def test_file_duplicate_key_is_refused_with_its_line(tmp_path: Path) -> None:
    text = EXAMPLE_YAML.replace(
        "  V100-RACK:", "  V100-NODE: {child: V100, count: 8, node: true}\n  V100-RACK:"
    )
    assert file_refusal(write(tmp_path, text)) == (
        "line 4, column 3: invalid YAML: found duplicate key 'V100-NODE' "
        "(while constructing a mapping)"
    )


def test_file_empty_missing_or_not_a_mapping(tmp_path: Path) -> None:
    assert file_refusal(write(tmp_path, "# nothing\n")) == "the file is empty"
    assert file_refusal(tmp_path / "absent.yaml").startswith("cannot read the file: ")
    assert file_refusal(write(tmp_path, "- 1\n- 2\n")).startswith("the config must be a mapping")
    (tmp_path / "binary.yaml").write_bytes(b"\xff\xfe\x00")
    assert file_refusal(tmp_path / "binary.yaml") == "the file is not UTF-8 text"
