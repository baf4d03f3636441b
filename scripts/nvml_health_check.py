"""Print what NVML shows of this machine's GPUs and the health verdict corral would draw from it
(corral.exec.nvmlhealth: XID errors, volatile uncorrectable ECC errors, retired pages pending,
row remapping, lost GPUs).

Run on a machine with NVIDIA GPUs and nvidia-ml-py installed (a dependency of the manager):

    .venv/bin/python scripts/nvml_health_check.py [--watch SECONDS]

With --watch it reads again every SECONDS (XID events arrive between reads) until interrupted.
Exits 0 when every GPU is healthy, 1 when one is not, 2 when NVML cannot be read.
"""

from __future__ import annotations

import argparse
import sys
import time

from corral.exec.nvmlhealth import NvmlReader, gpu_verdict, node_verdict


def show(reader: NvmlReader) -> bool:
    """Print one reading; whether every GPU is healthy."""
    nvml = reader.nvml
    gpus = reader.read()
    print(f"NVML driver {_text(nvml.nvmlSystemGetDriverVersion())}: {len(gpus)} GPU(s)")
    for gpu in gpus:
        name = "?"
        try:
            name = _text(nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(gpu.index)))
        except nvml.NVMLError:
            pass
        verdict = gpu_verdict(gpu) or "healthy"
        print(
            f"  GPU {gpu.index} {name}: lost={gpu.lost} xids={list(gpu.xids)} "
            f"ecc_uncorrected_volatile={gpu.ecc_uncorrected_volatile} "
            f"retired_pages_pending={gpu.retired_pages_pending} "
            f"remap_pending={gpu.remap_pending} remap_failed={gpu.remap_failed} -> {verdict}"
        )
    node = node_verdict(gpus, expected=reader.count)
    print(f"node: {node or 'healthy'}")
    return node is None


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--watch", type=float, default=None, metavar="SECONDS")
    args = parser.parse_args()
    reader = NvmlReader()
    if not reader.open():
        print(f"NVML cannot be read: {reader.unavailable}", file=sys.stderr)
        return 2
    try:
        healthy = show(reader)
        while args.watch:
            time.sleep(args.watch)
            healthy = show(reader) and healthy
    except KeyboardInterrupt:
        pass
    finally:
        reader.close()
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
