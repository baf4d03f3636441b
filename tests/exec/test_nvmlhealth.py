"""NVML's health signals judged (corral.exec.nvmlhealth): the verdict logic on plain values, and
the reading through a stand-in for pynvml's calls (no NVIDIA GPU here; a machine with one runs
scripts/nvml_health_check.py to see its real values)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from corral.exec.nvmlhealth import GpuSignals, NvmlReader, gpu_verdict, node_verdict, read_gpu


def test_a_gpu_with_nothing_wrong_or_nothing_readable_is_healthy() -> None:
    assert gpu_verdict(GpuSignals(0)) is None  # nothing supported: nothing wrong seen
    clean = GpuSignals(1, ecc_uncorrected_volatile=0, retired_pages_pending=False)
    assert gpu_verdict(clean) is None
    assert gpu_verdict(GpuSignals(2, remap_pending=False, remap_failed=False)) is None


@pytest.mark.parametrize(
    ("signals", "reason"),
    [
        (GpuSignals(3, lost=True, xids=(79,)), "GPU 3 lost (GPU_IS_LOST)"),
        (GpuSignals(0, xids=(13, 79)), "GPU 0 XID 79 (GPU has fallen off the bus)"),
        (GpuSignals(0, xids=(48,), ecc_uncorrected_volatile=2), "GPU 0 XID 48 (double-bit ECC"),
        (GpuSignals(1, ecc_uncorrected_volatile=2), "GPU 1 2 volatile uncorrectable ECC error(s)"),
        (GpuSignals(1, retired_pages_pending=True), "GPU 1 retired pages pending (needs a reset)"),
        (GpuSignals(2, remap_failed=True, remap_pending=True), "GPU 2 row remapping failed"),
        (GpuSignals(2, remap_pending=True), "GPU 2 row remapping pending (needs a reset)"),
    ],
)
def test_each_signal_makes_the_gpu_unhealthy_with_its_reason(
    signals: GpuSignals, reason: str
) -> None:
    verdict = gpu_verdict(signals)
    assert verdict is not None and verdict.startswith(reason), verdict


def test_xids_of_a_programs_own_fault_do_not() -> None:
    # 13 (graphics engine exception), 31 (MMU fault), 43 (a program stopped): the job's, not the
    # GPU's; 0: the boundary below every XID.
    assert gpu_verdict(GpuSignals(0, xids=(13, 31, 43, 0))) is None


def test_the_node_takes_its_first_unhealthy_gpu_or_its_lost_ones() -> None:
    gpus = [GpuSignals(0), GpuSignals(1, ecc_uncorrected_volatile=1), GpuSignals(2, lost=True)]
    assert node_verdict(gpus) == "GPU 1 1 volatile uncorrectable ECC error(s)"
    assert node_verdict([GpuSignals(0), GpuSignals(1)], expected=2) is None
    # NVML sees 2 GPUs of the node's 3: one fell off the bus and is no longer counted.
    assert node_verdict([GpuSignals(0), GpuSignals(1)], expected=3) == (
        "NVML sees 2 of the node's 3 GPUs: the others are lost"
    )


class NvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


def fake_nvml(**devices: dict[str, Any]) -> Any:
    """A stand-in for pynvml's calls that read_gpu makes: `devices["gN"]` gives GPU N's answers
    (a value, or an NvmlError to raise)."""

    def answer(index: int, key: str) -> Any:
        value = devices[f"g{index}"].get(key, NvmlError(3))  # 3: NVML_ERROR_NOT_SUPPORTED
        if isinstance(value, Exception):
            raise value
        return value

    def handle(index: int) -> int:
        if devices[f"g{index}"].get("lost"):
            raise NvmlError(15)
        return index

    return SimpleNamespace(
        NVMLError=NvmlError,
        NVML_ERROR_GPU_IS_LOST=15,
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1,
        NVML_VOLATILE_ECC=0,
        nvmlDeviceGetHandleByIndex=handle,
        nvmlDeviceGetTotalEccErrors=lambda h, kind, counter: answer(h, "ecc"),
        nvmlDeviceGetRetiredPagesPendingStatus=lambda h: answer(h, "pending"),
        nvmlDeviceGetRemappedRows=lambda h: answer(h, "rows"),
    )


def test_reading_a_gpu_keeps_what_nvml_supports_and_sees_a_lost_one() -> None:
    nvml = fake_nvml(
        g0={"ecc": 0, "pending": 0, "rows": (0, 0, 0, 0)},
        g1={"ecc": 4},  # retired pages and row remapping not supported
        g2={"lost": True},
        g3={"ecc": NvmlError(15)},  # lost between two calls
    )
    assert read_gpu(nvml, 0) == GpuSignals(
        0,
        ecc_uncorrected_volatile=0,
        retired_pages_pending=False,
        remap_pending=False,
        remap_failed=False,
    )
    assert read_gpu(nvml, 1, xids=(48,)) == GpuSignals(1, xids=(48,), ecc_uncorrected_volatile=4)
    assert read_gpu(nvml, 2) == GpuSignals(2, lost=True)
    assert read_gpu(nvml, 3) == GpuSignals(3, lost=True)


def test_without_nvml_the_reader_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_pynvml(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "pynvml":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    reader = NvmlReader()
    assert reader.open() is False
    assert reader.unavailable == "nvidia-ml-py is not installed"


def test_on_a_machine_without_nvidia_gpus_the_reader_says_nvml_is_not_available() -> None:
    reader = NvmlReader()
    if reader.open():  # a machine with NVIDIA GPUs: scripts/nvml_health_check.py shows them
        reader.close()
        pytest.skip("NVML is available here")
    assert reader.unavailable.startswith("NVML is not available"), reader.unavailable
