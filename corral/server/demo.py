"""`corral up --demo`: the embedded manager with declared GPUs runs a small workload of two teams.

Two VCs share one 4-GPU machine, 2 GPUs guaranteed each. Team vision (alice) starts two training
jobs; with team nlp idle, the second runs on nlp's GPUs, borrowed. When bob of nlp submits, his VC
takes its GPUs back: the borrowed job is preempted (SIGTERM, its checkpoint written), waits, and
resumes from its checkpoint when GPUs free up. A job with a typo fails fast the same way three
times and is stopped as a user error instead of being retried forever. Everything is real: the
API over HTTP, SQLite, one process per worker.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from corral.client import Client
from corral.server.boot import RunningServer, ServerOptions, build_manager

TRAIN_SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train.py"

DEMO_CLUSTER = """\
# The demo's machine: 4 GPUs as two pairs; each VC is guaranteed one pair.
cell_types:
  GPU-PAIR: {child: gpu, count: 2}
  DEMO-NODE: {child: GPU-PAIR, count: 2, node: true}
physical_cells:
  - {type: DEMO-NODE, count: 1}
virtual_clusters:
  vision: {GPU-PAIR: 1}
  nlp: {GPU-PAIR: 1}
"""

FINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def training_job(name: str, vc: str, gpus: int, steps: int, workers: int = 1) -> dict[str, object]:
    return {
        "name": name,
        "vc": vc,
        "gpus": gpus,
        "workers": workers,
        "command": [sys.executable, str(TRAIN_SCRIPT)],
        "env": {"TRAIN_STEPS": str(steps), "STEP_SECONDS": "0.25"},
        "grace_seconds": 10,
        "max_retries": 1,
    }


def run_demo(options: ServerOptions, console: Console) -> None:
    if not TRAIN_SCRIPT.is_file():
        from corral.server.boot import BootError

        raise BootError(f"{TRAIN_SCRIPT}: the demo's training script is missing (run from a clone)")
    options.data_dir.mkdir(parents=True, exist_ok=True)
    config = options.data_dir / "demo-cluster.yaml"
    config.write_text(DEMO_CLUSTER)
    options.config = config
    if options.gpus is None:
        options.gpus = 4
    options.settings.retry_backoff_s = 1.0
    options.settings.fast_fail_s = 30.0
    manager = build_manager(options)
    server = RunningServer(manager, options.host, options.port).start()
    try:
        _play(server.url, options.data_dir, console)
    finally:
        server.stop()


def _play(url: str, data_dir: Path, console: Console) -> None:
    admin = Client(url, (data_dir / "admin.token").read_text().strip())
    token = (data_dir / "admin.token").read_text().strip()
    console.print(f"corral demo: manager up at {url} (4 declared GPUs, VCs vision and nlp)")
    console.print(f"  dashboard  {url}/#token={token}", highlight=False, soft_wrap=True)
    console.print(f"  state      {data_dir}", highlight=False)
    alice = Client(url, admin.create_token("alice", vc="vision")["token"])
    bob = Client(url, admin.create_token("bob", vc="nlp")["token"])
    started = time.monotonic()
    ids = [
        alice.submit(training_job("resnet50", "vision", 2, steps=60))["id"],
        alice.submit(training_job("vit-base", "vision", 2, steps=60, workers=2))["id"],
    ]
    console.print("t=  0s  alice (vision) submits resnet50 and vit-base, 2 GPUs each")
    _wait_until(admin, lambda jobs: all(j["status"] == "RUNNING" for j in jobs), ids, 30)
    console.print(
        f"t={time.monotonic() - started:3.0f}s  both run: vit-base on nlp's idle GPUs (borrowed)"
    )
    time.sleep(5)
    ids.append(bob.submit(training_job("bert-large", "nlp", 2, steps=30))["id"])
    ids.append(
        bob.submit(
            {
                "name": "typo",
                "vc": "nlp",
                "gpus": 1,
                "command": [sys.executable, "-c", "import torchh"],
                "max_retries": 5,
            }
        )["id"]
    )
    console.print(
        f"t={time.monotonic() - started:3.0f}s  bob (nlp) submits bert-large (2 GPUs) and a job "
        "with a typo (max_retries 5)"
    )
    seen: set[tuple[str, str]] = set()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        jobs = {j["id"]: j for j in admin.jobs() if j["id"] in ids}
        for job in jobs.values():
            mark = (job["id"], f"{job['status']}/{job['preemptions']}/{job['attempts']}")
            if mark in seen:
                continue
            seen.add(mark)
            note = _narrate(job)
            if note:
                console.print(f"t={time.monotonic() - started:3.0f}s  {note}", highlight=False)
        if all(j["status"] in FINAL for j in jobs.values()):
            break
        time.sleep(0.5)
    _summary(admin, ids, console)
    resumed = [
        line
        for job_id in ids
        for line in admin.logs(job_id)[0].splitlines()
        if line.startswith("resumed from step")
    ]
    for line in resumed:
        console.print(f"  a preempted job's log: {line}", highlight=False)
    console.print(f"done in {time.monotonic() - started:.0f} s; state kept in {data_dir}")


def _narrate(job: dict[str, object]) -> str:
    name, status = job["name"], job["status"]
    if status == "PENDING" and int(job["preemptions"]) > 0:  # type: ignore[call-overload]
        return f"{name} preempted ({job['reason']}); it checkpointed and waits"
    if status == "PENDING" and int(job["failures"]) > 0:  # type: ignore[call-overload]
        return f"{name} attempt {job['attempts']} failed: {job['reason']}"
    if status == "RUNNING" and int(job["preemptions"]) > 0:  # type: ignore[call-overload]
        return f"{name} resumed on {', '.join(job['placement'])}"  # type: ignore[arg-type]
    if status == "RUNNING" and int(job["attempts"]) == 1:  # type: ignore[call-overload]
        return f"{name} runs on {', '.join(job['placement'])}"  # type: ignore[arg-type]
    if status in FINAL:
        return f"{name} {status.lower()}: {job['reason']}"  # type: ignore[union-attr]
    return ""


def _wait_until(client: Client, done: object, ids: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = [j for j in client.jobs() if j["id"] in ids]
        if done(jobs):  # type: ignore[operator]
            return
        time.sleep(0.2)


def _summary(client: Client, ids: list[str], console: Console) -> None:
    table = Table(title="demo jobs")
    for column in ("id", "name", "user", "vc", "status", "gpus", "attempts", "preempted", "reason"):
        table.add_column(column)
    for job in sorted((j for j in client.jobs() if j["id"] in ids), key=lambda j: int(j["id"])):
        table.add_row(
            job["id"],
            job["name"],
            job["user"],
            job["vc"],
            job["status"],
            str(job["gpus"]),
            str(job["attempts"]),
            str(job["preemptions"]),
            str(job["reason"])[:70],
        )
    console.print(table)
