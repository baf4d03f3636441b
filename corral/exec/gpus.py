"""This machine's GPUs: found through NVML, or declared (`corral up --gpus 8`) where there are none."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# Words in NVML product names that say nothing about the model.
_BRAND_WORDS = {"nvidia", "tesla", "geforce", "quadro", "generation"}
# Tokens from which on a product name describes form factor or memory, not the model.
_DETAIL = re.compile(r"^(\d+gb|pcie|sxm\d*|hbm\d*e?|nvl|mig)$", re.IGNORECASE)


class NoGpusError(RuntimeError):
    """No GPU could be found; the message tells the user what to do."""


@dataclass(slots=True)
class LocalGpu:
    index: int  # the CUDA/NVML device index, as used in CUDA_VISIBLE_DEVICES
    uuid: str
    name: str  # the product name, e.g. "NVIDIA A100-SXM4-80GB"
    gpu_type: str  # the short lower-case type a job spec asks for, e.g. "a100"
    #: Its memory in MiB (NVML's total), None when not known (declared GPUs).
    memory_mib: int | None = None


@dataclass(slots=True)
class GpuTopology:
    gpus: list[LocalGpu]
    # NVML common-ancestor level of each pair (i < j): 0 same board, 10 one PCIe switch,
    # 20 several switches, 30 one host bridge, 40 one CPU socket (NUMA node), 50 across sockets.
    levels: dict[tuple[int, int], int] = field(default_factory=dict)
    switch_groups: list[list[int]] = field(default_factory=list)  # under one PCIe switch
    socket_groups: list[list[int]] = field(default_factory=list)  # on one CPU socket


def gpu_type_from_name(name: str) -> str:
    """The short type of an NVML product name.

    "NVIDIA A100-SXM4-80GB" -> "a100", "Tesla V100-SXM2-16GB" -> "v100",
    "NVIDIA H100 80GB HBM3" -> "h100", "NVIDIA GeForce RTX 3090" -> "rtx3090".
    """
    parts: list[str] = []
    for token in name.replace("_", " ").split():
        if token.lower() in _BRAND_WORDS:
            continue
        model, *details = token.split("-")
        if _DETAIL.match(model):
            break
        parts.append(model.lower())
        if details:  # "A100-SXM4-80GB": what follows the dash is form factor and memory
            break
    return "".join(parts) or "gpu"


def declared_gpus(count: int, gpu_type: str = "gpu") -> list[LocalGpu]:
    if count < 1:
        raise ValueError(f"--gpus: must be a positive integer (got {count})")
    return [
        LocalGpu(index=i, uuid=f"declared-{i}", name="declared", gpu_type=gpu_type.lower())
        for i in range(count)
    ]


def _nvml() -> Any:
    hint = "pass --gpus N to declare N GPUs on a machine without them"
    try:
        import pynvml  # type: ignore[import-untyped]
    except ImportError as exc:
        raise NoGpusError(f"cannot find GPUs: nvidia-ml-py is not installed; {hint}") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NoGpusError(f"cannot find GPUs: NVML is not available ({exc}); {hint}") from exc
    if pynvml.nvmlDeviceGetCount() == 0:
        pynvml.nvmlShutdown()
        raise NoGpusError(f"cannot find GPUs: NVML found none; {hint}")
    return pynvml


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _nvml_gpus(pynvml: Any) -> list[LocalGpu]:
    gpus = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = _text(pynvml.nvmlDeviceGetName(handle))
        uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
        memory = _memory_mib(pynvml, handle)
        gpus.append(LocalGpu(index, uuid, name, gpu_type_from_name(name), memory))
    return gpus


def _memory_mib(pynvml: Any, handle: Any) -> int | None:
    """The device's memory in MiB (nvmlDeviceGetMemoryInfo's total, in bytes), None if NVML
    cannot tell."""
    try:
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) >> 20
    except (pynvml.NVMLError, AttributeError, TypeError, ValueError):
        return None


def smallest_memory_mib(gpus: list[LocalGpu]) -> int | None:
    """The smallest of these GPUs' memory in MiB; None when one of them is not known."""
    sizes = [gpu.memory_mib for gpu in gpus]
    if not sizes or any(size is None for size in sizes):
        return None
    return min(size for size in sizes if size is not None)


def discover_gpus(declared: int | None, gpu_type: str = "gpu") -> list[LocalGpu]:
    """`declared` GPUs of type `gpu_type` if given, else the GPUs NVML finds (NoGpusError if none)."""
    if declared is not None:
        return declared_gpus(declared, gpu_type)
    pynvml = _nvml()
    try:
        return _nvml_gpus(pynvml)
    finally:
        pynvml.nvmlShutdown()


def group_by_level(
    count: int, levels: dict[tuple[int, int], int], max_level: int
) -> list[list[int]]:
    """Connected groups of GPUs 0..count-1 whose pairwise level is at most `max_level`."""
    parent = list(range(count))

    def root(gpu: int) -> int:
        while parent[gpu] != gpu:
            parent[gpu] = parent[parent[gpu]]
            gpu = parent[gpu]
        return gpu

    for (first, second), level in levels.items():
        if level <= max_level:
            parent[root(first)] = root(second)
    groups: dict[int, list[int]] = {}
    for gpu in range(count):
        groups.setdefault(root(gpu), []).append(gpu)
    return sorted(groups.values())


def uniform_group_size(groups: list[list[int]], count: int) -> int | None:
    """The size of the GPU groups (e.g. under one PCIe switch) when they split the devices
    0..count-1 into consecutive runs of one size, the shape corral's cluster model describes
    (`gpus_per_switch`); None when they do not, or when one group holds them all."""
    if not groups:
        return None
    size = len(groups[0])
    expected = [list(range(start, start + size)) for start in range(0, count, size)]
    if size >= count or sorted(sorted(group) for group in groups) != expected:
        return None
    return size


def nvml_topology() -> GpuTopology:
    """The GPUs with their PCIe-switch and CPU-socket groups (NoGpusError without NVML)."""
    pynvml = _nvml()
    try:
        gpus = _nvml_gpus(pynvml)
        handles = [pynvml.nvmlDeviceGetHandleByIndex(gpu.index) for gpu in gpus]
        levels = {
            (i, j): int(pynvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j]))
            for i in range(len(handles))
            for j in range(i + 1, len(handles))
        }
    finally:
        pynvml.nvmlShutdown()
    return GpuTopology(
        gpus=gpus,
        levels=levels,
        switch_groups=group_by_level(len(gpus), levels, pynvml.NVML_TOPOLOGY_MULTIPLE),
        socket_groups=group_by_level(len(gpus), levels, pynvml.NVML_TOPOLOGY_NODE),
    )
