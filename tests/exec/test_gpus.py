"""GPU discovery: declared GPUs, the error without NVML, product names to types, topology groups."""

from __future__ import annotations

import pytest

from corral.exec.gpus import (
    LocalGpu,
    NoGpusError,
    declared_gpus,
    discover_gpus,
    gpu_type_from_name,
    group_by_level,
    nvml_topology,
    uniform_group_size,
)


def test_declared_gpus() -> None:
    gpus = discover_gpus(3, gpu_type="A100")
    assert gpus == [
        LocalGpu(0, "declared-0", "declared", "a100"),
        LocalGpu(1, "declared-1", "declared", "a100"),
        LocalGpu(2, "declared-2", "declared", "a100"),
    ]
    assert [gpu.gpu_type for gpu in discover_gpus(2)] == ["gpu", "gpu"]
    with pytest.raises(ValueError, match=r"--gpus: must be a positive integer \(got 0\)"):
        declared_gpus(0)


def _nvml_works() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_without_nvml_the_error_tells_the_user_to_declare_gpus() -> None:
    if _nvml_works():
        pytest.skip("this machine has NVML")
    with pytest.raises(NoGpusError, match="pass --gpus N") as raised:
        discover_gpus(None)
    assert "\n" not in str(raised.value)
    with pytest.raises(NoGpusError, match="pass --gpus N"):
        nvml_topology()


@pytest.mark.parametrize(
    ("name", "gpu_type"),
    [
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100 80GB PCIe", "a100"),
        ("Tesla V100-SXM2-16GB", "v100"),
        ("Tesla V100S-PCIE-32GB", "v100s"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 NVL", "h100"),
        ("Tesla T4", "t4"),
        ("NVIDIA A10G", "a10g"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA GeForce RTX 3090", "rtx3090"),
        ("NVIDIA GeForce RTX 4090 Ti", "rtx4090ti"),
        ("NVIDIA RTX 6000 Ada Generation", "rtx6000ada"),
        ("Quadro RTX 8000", "rtx8000"),
        ("Tesla P100-PCIE-16GB", "p100"),
        ("NVIDIA", "gpu"),
    ],
)
def test_gpu_type_from_product_name(name: str, gpu_type: str) -> None:
    assert gpu_type_from_name(name) == gpu_type


def test_topology_groups() -> None:
    # GPUs 0-1 share a PCIe switch, 2-3 another; 0-3 sit on socket 0, 4-5 on socket 1.
    levels = {}
    for i in range(6):
        for j in range(i + 1, 6):
            if (i, j) in ((0, 1), (2, 3), (4, 5)):
                levels[(i, j)] = 10
            elif i < 4 and j < 4:
                levels[(i, j)] = 40
            else:
                levels[(i, j)] = 50
    assert group_by_level(6, levels, 20) == [[0, 1], [2, 3], [4, 5]]
    assert group_by_level(6, levels, 40) == [[0, 1, 2, 3], [4, 5]]
    assert group_by_level(6, levels, 50) == [[0, 1, 2, 3, 4, 5]]
    assert group_by_level(2, {}, 50) == [[0], [1]]


@pytest.mark.parametrize(
    ("groups", "count", "size"),
    [
        ([[0, 1, 2, 3], [4, 5, 6, 7]], 8, 4),  # two PCIe switches of four, as on a DGX-1
        ([[4, 5, 6, 7], [0, 1, 2, 3]], 8, 4),  # in any order
        ([[0, 1], [2, 3], [4, 5], [6, 7]], 8, 2),
        ([[0, 1, 2, 3, 4, 5, 6, 7]], 8, None),  # one switch for all: nothing to model
        ([[0, 2], [1, 3]], 4, None),  # not consecutive
        ([[0, 1, 2], [3]], 4, None),  # uneven
        ([], 4, None),
    ],
)
def test_switch_groups_become_a_switch_size_only_when_uniform(
    groups: list[list[int]], count: int, size: int | None
) -> None:
    assert uniform_group_size(groups, count) == size
