"""How fast the everyday `corral` commands answer: wall time of each, as a user's shell runs it.

It starts a real `corral up` (127.0.0.1, a temporary data directory, the local executor with
declared GPUs), then times, each over --runs runs, `python -c pass` (the interpreter's own
start), `corral --help`, `corral submit job.yaml`, `corral ls` (its default 50 newest jobs)
and `corral ls --all` with --jobs jobs stored. Those jobs go into the store directly while the
manager is stopped (there is no bulk-submit API), as finished jobs, and the manager is started
again on them. Output goes to /dev/null, as when piped. Prints figures; never fails on time.

Run: python benchmarks/cli_speed.py [--runs 20] [--jobs 10000]
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from corral.client import Client, ClientError
from corral.server.store import JobRow, Store

CORRAL = [sys.executable, "-m", "corral.cli"]
START_S = 120.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def corral_up(data_dir: Path, port: int, gpus: int) -> Iterator[str]:
    """`corral up` as a process; yields its URL once it answers, stops it (SIGINT) after."""
    url = f"http://127.0.0.1:{port}"
    log = (data_dir.parent / "up.log").open("ab")
    process = subprocess.Popen(
        [*CORRAL, "up", "--data-dir", str(data_dir), "--port", str(port), "--gpus", str(gpus)]
        + ["--single-user"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + START_S
        while True:
            if process.poll() is not None:
                tail = Path(log.name).read_text().strip().splitlines()[-5:]
                raise SystemExit(f"corral up exited with {process.returncode}: " + "\n".join(tail))
            token = data_dir / "admin.token"
            try:
                if token.is_file():
                    with Client(url, token.read_text().strip(), timeout=5) as client:
                        client.whoami()
                    break
            except ClientError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"corral up did not answer within {START_S:g} s")
            time.sleep(0.1)
        yield url
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def timed(argv: list[str], runs: int, env: dict[str, str]) -> list[float]:
    """Wall seconds of each of `runs` runs of argv (stdout to /dev/null; a failure stops it)."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        times.append(time.perf_counter() - start)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.decode()}")
    return times


def insert_finished_jobs(data_dir: Path, count: int) -> None:
    """`count` SUCCEEDED jobs straight into the store (the manager is stopped meanwhile)."""
    store = Store(Store.sqlite_url(data_dir))
    first = store.max_job_id() + 1
    now = time.time()
    rows = []
    for index in range(first, first + count):
        spec = {"name": f"stored-{index}", "gpus": 1 + index % 4, "command": "true"}
        row = JobRow.new(
            index,
            name=spec["name"],  # type: ignore[arg-type]
            user="admin",
            vc="default",
            priority="guaranteed",
            gpus=spec["gpus"],  # type: ignore[arg-type]
            spec=spec,
            submitted_at=now - count + index,
        )
        row.status, row.reason = "SUCCEEDED", "succeeded"
        rows.append(row)
    for at in range(0, len(rows), 1000):
        store.insert_jobs(rows[at : at + 1000])
    store.close()


def conditions() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        model = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
        cpu = model
    except (OSError, StopIteration):
        pass
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{os.cpu_count()} CPUs ({cpu}), load average {load}, Python "
        f"{platform.python_version()}, {platform.system()} {platform.release()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs of each command")
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs `ls --all` lists")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs `corral up` declares")
    args = parser.parse_args()
    results: list[tuple[str, list[float]]] = []
    with tempfile.TemporaryDirectory(prefix="corral-cli-speed-") as tmp:
        data_dir = Path(tmp) / "data"
        job = Path(tmp) / "job.yaml"
        job.write_text("name: quick\ngpus: 1\ncommand: 'true'\n")
        port = free_port()
        env = dict(os.environ)
        results.append(("python3 -c pass", timed([sys.executable, "-c", "pass"], args.runs, env)))
        results.append(("corral --help", timed([*CORRAL, "--help"], args.runs, env)))
        with corral_up(data_dir, port, args.gpus) as url:
            env |= {"CORRAL_URL": url, "CORRAL_TOKEN": (data_dir / "admin.token").read_text()}
            with Client(url, env["CORRAL_TOKEN"]) as client:
                # Every GPU busy: the submitted jobs wait, and no job process competes with the
                # commands for the CPU while they are timed.
                blocker = client.submit(
                    {"name": "blocker", "gpus": args.gpus, "command": "sleep 3600"}
                )["id"]
                while client.job(blocker)["status"] != "RUNNING":
                    time.sleep(0.1)
                submit = [*CORRAL, "submit", str(job)]
                results.append(("corral submit job.yaml", timed(submit, max(args.runs, 50), env)))
                listed = len(client.jobs(limit=50))
                ls = timed([*CORRAL, "ls"], args.runs, env)
                results.append((f"corral ls ({listed} jobs)", ls))
                for waiting in client.jobs(status="PENDING") + client.jobs(status="RUNNING"):
                    client.cancel(waiting["id"])
                while client.jobs(status="RUNNING"):
                    time.sleep(0.1)
        insert_finished_jobs(data_dir, args.jobs)
        with corral_up(data_dir, port, args.gpus) as url:
            total = len(Client(url, env["CORRAL_TOKEN"]).jobs())
            for argv, label in (
                (["ls", "--all"], f"corral ls --all ({total} jobs)"),
                (["ls", "--all", "-o", "json"], f"corral ls --all -o json ({total} jobs)"),
            ):
                results.append((label, timed([*CORRAL, *argv], args.runs, env)))
    print(f"cli_speed: {args.runs} runs each (submit: {max(args.runs, 50)}); {conditions()}")
    print(f"  corral is `{' '.join(Path(a).name for a in CORRAL)}`; stdout to /dev/null")
    width = max(len(label) for label, _ in results)
    print(f"  {'command':<{width}}  median     min     max")
    for label, times in results:
        ms = [t * 1000 for t in times]
        print(
            f"  {label:<{width}}  {statistics.median(ms):5.0f} ms {min(ms):5.0f} ms "
            f"{max(ms):5.0f} ms"
        )


if __name__ == "__main__":
    main()
