"""Check, on a machine with an NVIDIA GPU, that the limits corral sets for a share of a GPU hold.

corral gives a job with `gpus: 0.5` NVIDIA MPS's per-client limits (docs/fgd.md#live):
CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (its share of the GPU's memory) and
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (its share of the GPU's threads). An MPS server enforces them.
This script starts a private MPS control daemon, a real `corral up` (local executor, the GPUs
found through NVML, placement fgd, NVML health checks on) and runs through it:

1. one job of `gpus: SHARE` alone,
2. two jobs of `gpus: SHARE` submitted together (FGD packs them on one GPU),
3. one job of `gpus: 1` (no MPS limit),

each a probe (PyTorch) that allocates 1 GiB blocks until it holds the share's memory + 2 GiB
or is refused, and times bf16 matrix products for a few seconds. It also runs the probe directly,
outside corral, as the baseline. It prints a table, writes results.json to --out, and exits 0
when every limit held: a share's job could not allocate more than its share (allowing the 1 GiB
block that crossed it) and the whole-GPU job could; the two shares ran at the same time on the
same GPU; a share alone ran at most SHARE x 1.15 of the baseline's matrix rate per MHz of the
SM clock (NVML's, read halfway through).

Run with PyTorch installed and corral importable; the manager runs in single-user mode (as root
with --single-user), so the jobs and the MPS daemon run as the same user:

    python3 scripts/mps_check.py --out /tmp/mps-check
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

PROBE = r"""
import json, os, sys, time
import torch
target = int(sys.argv[1])
seconds = float(sys.argv[2])
dev = torch.device("cuda")


def sm_clock():  # the GPU's SM clock in MHz now (NVML), or None
    try:
        import pynvml
        pynvml.nvmlInit()
        uuid = "GPU-" + str(torch.cuda.get_device_properties(0).uuid)
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        return pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
    except Exception:
        return None


torch.cuda.init()
free, total = torch.cuda.mem_get_info()
blocks, refused = [], None
while len(blocks) < target:
    try:
        blocks.append(torch.empty(1 << 30, dtype=torch.uint8, device=dev))
    except torch.OutOfMemoryError as exc:
        refused = str(exc).splitlines()[0][:200]
        break
held = len(blocks)
del blocks
torch.cuda.empty_cache()
n = 8192
a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
for _ in range(3):
    a @ b
torch.cuda.synchronize()
began = time.time()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
count, clock = 0, None
start.record()
while time.time() - began < seconds:
    for _ in range(10):
        a @ b
    count += 10
    torch.cuda.synchronize()
    if clock is None and time.time() - began > seconds / 2:
        clock = sm_clock()
end.record()
torch.cuda.synchronize()
ms = start.elapsed_time(end)
print(json.dumps({
    "env": {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "CORRAL_GPU_SHARE",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")},
    "mem_get_info_gib": [round(free / 2**30, 2), round(total / 2**30, 2)],
    "target_gib": target, "held_gib": held, "refused": refused,
    "tflops": round(2 * n**3 * count / (ms / 1000) / 1e12, 1),
    "sm_mhz": clock,
    "matmul_window": [began, time.time()],
}), flush=True)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--share", type=float, default=0.5)
    parser.add_argument("--seconds", type=float, default=8.0, help="matrix products per probe")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="corral-mps-"))
    results: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    env = dict(os.environ)
    env["CUDA_MPS_PIPE_DIRECTORY"] = str(work / "mps-pipe")
    env["CUDA_MPS_LOG_DIRECTORY"] = str(work / "mps-log")
    for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
        Path(env[key]).mkdir()
    probe = work / "probe.py"
    probe.write_text(PROBE)
    results["nvidia_smi"] = _run(["nvidia-smi", "-L"], env)
    results["nvml_health"] = _run([sys.executable, "scripts/nvml_health_check.py"], env)
    control = shutil.which("nvidia-cuda-mps-control")
    results["mps_control"] = control
    manager = None
    verdicts = ["FAIL: the check did not finish (see the output above)"]
    try:
        if control:
            results["mps_start"] = _run([control, "-d"], env)
        total_gib = _gpu_memory_gib()
        share_gib = int(total_gib * args.share)
        target = share_gib + 2
        results["gpu_memory_gib"] = total_gib
        print(
            f"GPU memory {total_gib:.1f} GiB; share {args.share} -> {share_gib} GiB; probes "
            f"try {target} GiB",
            flush=True,
        )
        base = subprocess.run(
            [sys.executable, str(probe), str(target), str(args.seconds)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        results["baseline"] = _last_json(base.stdout) or {"error": base.stderr[-2000:]}
        print("baseline (outside corral, no MPS limit):", results["baseline"], flush=True)
        port = _free_port()
        data = work / "corral"
        log = open(args.out / "corral-up.log", "w")  # noqa: SIM115 (closed in finally)
        manager = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "corral.cli",
                "up",
                "--data-dir",
                str(data),
                "--port",
                str(port),
                "--placement",
                "fgd",
                "--policy",
                "fifo",
                "--nvml-health",
                *(["--single-user"] if os.geteuid() == 0 else []),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        api = Api(f"http://127.0.0.1:{port}", data / "admin.token", manager)
        api.ready()
        command = [sys.executable, str(probe), str(target), str(args.seconds)]
        alone = api.run_all([api.submit("share-alone", args.share, command)])
        pair = api.run_all([api.submit(f"share-{c}", args.share, command) for c in "ab"])
        whole = api.run_all([api.submit("whole", 1, command)])
        results["corral"] = {"alone": alone, "pair": pair, "whole": whole}
        results["nodes"] = api.get("/api/v1/nodes")
        results["verdicts"] = verdicts = _verdicts(results, args.share, share_gib)
    finally:
        if manager is not None:
            os.killpg(manager.pid, signal.SIGTERM)
            manager.wait(timeout=60)
        if control:
            results["mps_stop"] = _run([control], env, stdin="quit\n")
        logs = work / "mps-log"
        for name in ("control.log", "server.log"):
            if (logs / name).exists():
                shutil.copy(logs / name, args.out / f"mps-{name}")
        (args.out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    for line in verdicts:
        print(line)
    return 0 if all(line.startswith("PASS") for line in verdicts) else 1


class Api:
    """The REST API of the `corral up` under test, with its admin token."""

    def __init__(self, url: str, token_file: Path, process: subprocess.Popen[bytes]) -> None:
        self.url, self.token_file, self.process = url, token_file, process
        self.http = httpx.Client(base_url=url, timeout=30)

    def ready(self) -> None:
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"corral up exited with {self.process.returncode}")
            try:
                if self.token_file.exists() and self.http.get("/readyz").status_code == 200:
                    token = self.token_file.read_text().strip()
                    self.http.headers["Authorization"] = f"Bearer {token}"
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise SystemExit("corral up did not become ready in 120 s")

    def get(self, path: str) -> Any:
        answer = self.http.get(path)
        answer.raise_for_status()
        return answer.json()

    def submit(self, name: str, gpus: float, command: list[str]) -> str:
        spec = {"name": name, "gpus": gpus, "command": shlex.join(command)}
        answer = self.http.post("/api/v1/jobs", json=spec)
        if answer.status_code >= 300:
            raise SystemExit(f"submit {name}: {answer.status_code} {answer.text}")
        return str(answer.json()["id"])

    def run_all(self, ids: list[str]) -> list[dict[str, Any]]:
        deadline = time.time() + 300
        while True:
            jobs = [self.get(f"/api/v1/jobs/{job}") for job in ids]
            if all(j["status"] in ("SUCCEEDED", "FAILED", "CANCELLED", "REFUSED") for j in jobs):
                break
            if time.time() > deadline:
                raise SystemExit(f"jobs {ids} did not end in 300 s: {[j['status'] for j in jobs]}")
            time.sleep(1)
        out = []
        for job in jobs:
            text = self.http.get(f"/api/v1/jobs/{job['id']}/logs").text
            err = self.http.get(f"/api/v1/jobs/{job['id']}/logs", params={"stream": "stderr"})
            probe = _last_json(text)
            attempts = job.get("attempt_history", [])
            out.append(
                {
                    "id": job["id"],
                    "name": job["name"],
                    "status": job["status"],
                    "gpus": [a["gpus"] for a in attempts],
                    "probe": probe,
                    "stderr": None if probe else err.text[-2000:],
                }
            )
            print(f"{job['name']}: {job['status']} on {out[-1]['gpus']}: {probe}", flush=True)
        return out


def _verdicts(results: dict[str, Any], share: float, share_gib: int) -> list[str]:
    lines = []
    corral = results["corral"]
    shares = [*corral["alone"], *corral["pair"]]
    for job in shares:
        probe = job["probe"] or {}
        held = probe.get("held_gib")
        ok = held is not None and held <= share_gib
        lines.append(
            f"{'PASS' if ok else 'FAIL'} memory: {job['name']} (gpus {share}) held "
            f"{held} GiB of the {probe.get('target_gib')} it tried; its share is "
            f"{share_gib} GiB"
        )
    whole = corral["whole"][0]["probe"] or {}
    ok = whole.get("held_gib") == whole.get("target_gib")
    lines.append(
        f"{'PASS' if ok else 'FAIL'} memory: the whole-GPU job held "
        f"{whole.get('held_gib')} of {whole.get('target_gib')} GiB"
    )
    a, b = (j["probe"] or {} for j in corral["pair"])
    gpus = [j["gpus"] for j in corral["pair"]]
    overlap = bool(a and b) and min(a["matmul_window"][1], b["matmul_window"][1]) > max(
        a["matmul_window"][0], b["matmul_window"][0]
    )
    same = gpus[0] == gpus[1] and bool(gpus[0])
    lines.append(
        f"{'PASS' if overlap and same else 'FAIL'} packing: the two shares ran on "
        f"{gpus[0]} and {gpus[1]}, at the same time: {overlap}"
    )
    # A GPU that runs every SM is held to its power limit at a lower clock than one that runs
    # half of them (an H200: 1470 against 1965 MHz), so the rates are compared per MHz.
    base = results.get("baseline") or {}
    alone = corral["alone"][0]["probe"] or {}
    ratio = None
    if base.get("tflops") and alone.get("tflops") and base.get("sm_mhz") and alone.get("sm_mhz"):
        ratio = (alone["tflops"] / alone["sm_mhz"]) / (base["tflops"] / base["sm_mhz"])
    ok = ratio is not None and ratio <= share * 1.15
    lines.append(
        f"{'PASS' if ok else 'FAIL'} threads: a share alone ran {alone.get('tflops')} "
        f"TFLOP/s at {alone.get('sm_mhz')} MHz, the baseline {base.get('tflops')} at "
        f"{base.get('sm_mhz')} MHz: {ratio if ratio is None else round(ratio, 3)} of "
        f"its rate per MHz (at most {share} x 1.15)"
    )
    return lines


def _gpu_memory_gib() -> float:
    import pynvml  # type: ignore[import-untyped]

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return float(pynvml.nvmlDeviceGetMemoryInfo(handle).total) / 2**30
    finally:
        pynvml.nvmlShutdown()


def _run(argv: list[str], env: dict[str, str], stdin: str | None = None) -> dict[str, Any]:
    try:
        done = subprocess.run(
            argv, env=env, input=stdin, capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"$ {shlex.join(argv)}: {exc}", flush=True)
        return {"error": str(exc)}
    print(f"$ {shlex.join(argv)} -> {done.returncode}\n{done.stdout}{done.stderr}", flush=True)
    return {"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr}


def _last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return dict(json.loads(line))
            except ValueError:
                return None
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    sys.exit(main())
