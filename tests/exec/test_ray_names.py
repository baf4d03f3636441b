"""How the Ray executor names Ray's nodes (corral/exec/ray.py: `ray_nodes`), from node lists
as `ray.nodes()` gives them: stable while a node lives, never two nodes with one name."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from corral.exec import ray as ray_exec


def node(
    node_id: str, host: str = "gpu01.lab", gpus: int = 4, name: str = "", **extra: Any
) -> dict[str, Any]:
    resources: dict[str, float] = {"CPU": 8.0, "GPU": float(gpus)}
    if name:
        resources[f"corral-node-{name}"] = 1.0
    return {
        "NodeID": node_id * 8,
        "Alive": True,
        "NodeManagerHostname": host,
        "NodeManagerAddress": "10.0.0.1",
        "Resources": resources,
        "Labels": {},
        **extra,
    }


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    nodes: list[dict[str, Any]] = []
    monkeypatch.setattr(ray_exec.ray, "nodes", lambda: list(nodes))
    return nodes


def names(known: dict[str, str]) -> list[str]:
    return [found.name for found in ray_exec.ray_nodes(known)]


def test_a_node_keeps_its_host_name_when_another_joins_on_its_host(
    cluster: list[dict[str, Any]],
) -> None:
    known: dict[str, str] = {}
    cluster.append(node("b"))
    assert names(known) == ["gpu01"]
    cluster.append(node("a"))  # a second Ray node on the same machine
    assert names(known) == ["gpu01", "gpu01-aaaaaaaa"]
    # A manager that starts now sees both at once: neither is the host's alone.
    assert names({}) == ["gpu01-aaaaaaaa", "gpu01-bbbbbbbb"]


def test_nodes_without_gpus_or_life_are_not_nodes(cluster: list[dict[str, Any]]) -> None:
    cluster += [node("a", gpus=0), node("b", Alive=False), node("c", host="gpu02")]
    assert names({}) == ["gpu02"]


def test_a_name_two_nodes_declare_is_the_first_ones(
    cluster: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    known: dict[str, str] = {}
    cluster.append(node("b", name="n1"))
    assert names(known) == ["n1"]
    cluster.append(node("a", host="gpu02", name="n1"))  # a mistake: the same name again
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            found = ray_exec.ray_nodes(known)
            assert [(f.name, f.node_id) for f in found] == [("n1", "b" * 8)]
    (warning,) = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert warning == "Ray node aaaaaaaa (10.0.0.1) is left out: node bbbbbbbb is already called n1"
    del cluster[0]  # the first leaves: the other may have the name now
    assert [(f.name, f.node_id) for f in ray_exec.ray_nodes(known)] == [("n1", "a" * 8)]


@pytest.mark.parametrize(
    ("chosen", "node_visible", "expected"),
    [
        ("1,3", None, "1,3"),  # the node owns all the machine's GPUs
        ("1,3", "", "1,3"),
        ("0", "4,5,6,7", "4"),
        ("1,3", "4, 5,6,7", "5,7"),
        ("0", "GPU-1a2b,GPU-3c4d", "GPU-1a2b"),
    ],
)
def test_the_cores_devices_are_the_nodes_own(
    chosen: str, node_visible: str | None, expected: str
) -> None:
    assert ray_exec.node_devices(chosen, node_visible) == expected
