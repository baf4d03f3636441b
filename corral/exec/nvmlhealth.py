"""NVML's health signals of this machine's NVIDIA GPUs, and the verdict on them.

Read through nvidia-ml-py (`pynvml`, imported when `NvmlReader.open` runs; absent, or NVML not
loadable: the reader says why and the checks are skipped), per GPU:

* XID errors, as NVML's critical-XID events (`nvmlEventTypeXidCriticalError`), drained without
  waiting at each read. Only the XIDs of `FATAL_XIDS` (a fault of the GPU, its memory, NVLink
  or its firmware, that needs a reset or service) make it unhealthy; the others (13, 31, 43:
  a program's own fault) do not. An XID is kept until an admin resumes the node (`forget`): the
  event does not repeat, the fault stays.
* volatile uncorrectable ECC errors (since the last reset): any is unhealthy;
* retired pages pending (a page awaiting retirement at the next reset), and on GPUs that remap
  rows instead, a remapping pending or failed: unhealthy until reset;
* a lost GPU: NVML answers `GPU_IS_LOST` for it, or sees fewer GPUs than the node has.

`read_gpu` is the only code that asks NVML about a device; `gpu_verdict` and `node_verdict`
judge plain values (`GpuSignals`), so the rules are tested without a GPU.
`scripts/nvml_health_check.py` prints what a machine's NVML shows and the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: XIDs that mean the GPU needs a reset or service (NVIDIA's XID catalogue), with a few words.
FATAL_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping event",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}


@dataclass(frozen=True, slots=True)
class GpuSignals:
    """What NVML says of one GPU (None: not supported or not readable on it)."""

    index: int
    lost: bool = False
    xids: tuple[int, ...] = ()
    ecc_uncorrected_volatile: int | None = None
    retired_pages_pending: bool | None = None
    remap_pending: bool | None = None
    remap_failed: bool | None = None


def gpu_verdict(gpu: GpuSignals) -> str | None:
    """Why the GPU is unhealthy (None: it is not)."""
    where = f"GPU {gpu.index}"
    if gpu.lost:
        return f"{where} lost (GPU_IS_LOST)"
    fatal = [xid for xid in gpu.xids if xid in FATAL_XIDS]
    if fatal:
        return f"{where} XID {fatal[0]} ({FATAL_XIDS[fatal[0]]})"
    if gpu.ecc_uncorrected_volatile:
        return f"{where} {gpu.ecc_uncorrected_volatile} volatile uncorrectable ECC error(s)"
    if gpu.retired_pages_pending:
        return f"{where} retired pages pending (needs a reset)"
    if gpu.remap_failed:
        return f"{where} row remapping failed"
    if gpu.remap_pending:
        return f"{where} row remapping pending (needs a reset)"
    return None


def node_verdict(gpus: list[GpuSignals], expected: int | None = None) -> str | None:
    """Why the node is unhealthy from its GPUs' signals (the first GPU's reason; None: it is
    not). `expected`: the node's GPU count, more than NVML sees means GPUs were lost."""
    for gpu in gpus:
        reason = gpu_verdict(gpu)
        if reason is not None:
            return reason
    if expected is not None and len(gpus) < expected:
        return f"NVML sees {len(gpus)} of the node's {expected} GPUs: the others are lost"
    return None


def _lost(nvml: Any, error: Exception) -> bool:
    return getattr(error, "value", None) == getattr(nvml, "NVML_ERROR_GPU_IS_LOST", 15)


def _supported(nvml: Any, read: Any) -> Any:
    """read()'s value; None where NVML does not support it on this GPU (or cannot tell)."""
    try:
        return read()
    except nvml.NVMLError as error:
        if _lost(nvml, error):
            raise
        return None


def read_gpu(nvml: Any, index: int, xids: tuple[int, ...] = ()) -> GpuSignals:
    """NVML's signals of GPU `index` (`xids`: those its events reported)."""
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        ecc = _supported(
            nvml,
            lambda: nvml.nvmlDeviceGetTotalEccErrors(
                handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
            ),
        )
        pending = _supported(nvml, lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))
        rows = _supported(nvml, lambda: nvml.nvmlDeviceGetRemappedRows(handle))
    except nvml.NVMLError as error:
        if _lost(nvml, error):
            return GpuSignals(index, lost=True, xids=xids)
        raise
    remap_pending = remap_failed = None
    if rows is not None:  # (corrected rows, uncorrected rows, pending, failure occurred)
        remap_pending, remap_failed = bool(rows[2]), bool(rows[3])
    return GpuSignals(
        index,
        xids=xids,
        ecc_uncorrected_volatile=None if ecc is None else int(ecc),
        retired_pages_pending=None if pending is None else bool(pending),
        remap_pending=remap_pending,
        remap_failed=remap_failed,
    )


@dataclass
class NvmlReader:
    """This machine's GPUs through NVML: `open` (False: `unavailable` says why), `read`,
    `close`. XIDs seen are kept per GPU until `forget`."""

    unavailable: str = ""
    nvml: Any = None
    count: int = 0
    events: Any = None
    seen_xids: dict[int, list[int]] = field(default_factory=dict)

    def open(self) -> bool:
        try:
            import pynvml  # type: ignore[import-untyped]
        except ImportError:
            self.unavailable = "nvidia-ml-py is not installed"
            return False
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:
            self.unavailable = f"NVML is not available ({error})"
            return False
        self.nvml = pynvml
        self.count = pynvml.nvmlDeviceGetCount()
        try:
            self.events = pynvml.nvmlEventSetCreate()
            for index in range(self.count):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                try:
                    pynvml.nvmlDeviceRegisterEvents(
                        handle, pynvml.nvmlEventTypeXidCriticalError, self.events
                    )
                except pynvml.NVMLError:  # not supported on this GPU: ECC and the rest still are
                    pass
        except pynvml.NVMLError:
            self.events = None
        return True

    def _drain_xids(self) -> None:
        nvml = self.nvml
        if self.events is None:
            return
        for _ in range(1000):  # bounded: a storm of events does not hold the check
            try:
                data = nvml.nvmlEventSetWait_v2(self.events, 0)
            except nvml.NVMLError:  # timeout: none left
                return
            try:
                index = int(nvml.nvmlDeviceGetIndex(data.device))
            except nvml.NVMLError:
                index = -1
            self.seen_xids.setdefault(index, []).append(int(data.eventData))

    def read(self) -> list[GpuSignals]:
        """Every GPU's signals now (a GPU NVML no longer counts is left out)."""
        nvml = self.nvml
        self._drain_xids()
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError:
            count = 0
        return [read_gpu(nvml, i, tuple(self.seen_xids.get(i, ()))) for i in range(count)]

    def forget(self) -> None:
        self.seen_xids.clear()

    def close(self) -> None:
        if self.nvml is None:
            return
        try:
            if self.events is not None:
                self.nvml.nvmlEventSetFree(self.events)
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass
        self.nvml = None
