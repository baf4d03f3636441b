"""Replay a long trace with `corral simulate --stream` and print its CPU time and peak memory.

Writes the preemption-heavy Philly-like workload of `sim_preemption_heavy.py` (same generator,
options and seed) as a Tiresias-format CSV (`job_id,num_gpu,submit_time,iterations,model_name,
duration,interval`: 1,000,000 jobs are about 45 MB), then runs, each in its own process so that
each peak RSS is its own:

    corral simulate --trace tiresias:FILE --cluster 312x8 --racks 13 --placement relax
        --restore-s 30 --policy POLICY --stream --out OUT

(gittins with `--gittins-history`, 10,000 jobs of another seed, as the other benchmark). The
run reads the file as it goes, writes each job's row to jobs-POLICY-relax.csv as it ends and
keeps only the jobs in the system, so its memory does not grow with the trace; `--keep` runs
without `--stream` (the whole trace read first and every job kept), to compare.

Prints, per policy: the child's CPU seconds (user + system: reading the CSV, simulating,
writing the results), jobs/s, peak RSS, and the summary's preemptions and average JCT.
Never passes or fails on time.

Run: python benchmarks/sim_stream_replay.py [--jobs N] [--policies las,gittins] [--keep]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sim_preemption_heavy import workload  # noqa: E402

MEASURE = """
import json, resource, subprocess, sys
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps([usage.ru_utime + usage.ru_stime, usage.ru_maxrss]))
"""


def write_trace(path: Path, jobs: int, seed: int, gpus: int) -> None:
    shape = dict(load=0.85, gpus=gpus, diurnal=0.9, cap_s=48 * 3600.0)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            ["job_id", "num_gpu", "submit_time", "iterations", "model_name", "duration", "interval"]
        )
        for spec in workload(jobs, seed=seed, **shape):  # type: ignore[arg-type]
            writer.writerow(
                [spec.id, spec.gpus, repr(spec.submit_time), "", "", repr(spec.duration_s), ""]
            )


def write_history(path: Path, gpus: int) -> None:
    """Gittins's history: GPU-seconds of 10,000 jobs of another seed (`--gittins-history`)."""
    shape = dict(load=0.85, gpus=gpus, diurnal=0.9, cap_s=48 * 3600.0)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["duration"])
        for spec in workload(10_000, seed=1, **shape):  # type: ignore[arg-type]
            writer.writerow([repr(spec.gpus * (spec.duration_s or 0.0))])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--policies", default="las")
    parser.add_argument("--keep", action="store_true", help="without --stream, to compare")
    parser.add_argument("--dir", type=Path, help="keep the trace and results here")
    args = parser.parse_args()
    gpus = 312 * 8
    with tempfile.TemporaryDirectory() as scratch:
        base = args.dir or Path(scratch)
        base.mkdir(parents=True, exist_ok=True)
        trace = base / f"philly-like-{args.jobs}.csv"
        if not trace.exists():
            write_trace(trace, args.jobs, 0, gpus)
        history = base / "history.csv"
        write_history(history, gpus)
        size_mb = trace.stat().st_size / 1e6
        print(f"trace: {args.jobs:,} jobs, {size_mb:.0f} MB (Tiresias format)")
        corral = Path(sys.executable).with_name("corral")
        for policy in args.policies.split(","):
            out = base / f"out-{policy}"
            command = [
                str(corral),
                "simulate",
                f"--trace=tiresias:{trace}",
                "--cluster=312x8",
                "--racks=13",
                "--placement=relax",
                "--restore-s=30",
                f"--policy={policy}",
                f"--out={out}",
                *(["--gittins-history", str(history)] if policy == "gittins" else []),
                *([] if args.keep else ["--stream"]),
            ]
            # A process of its own measures the run, so that each peak RSS is that run's own.
            measured = subprocess.run(
                [sys.executable, "-c", MEASURE, *command],
                check=True,
                stdout=subprocess.PIPE,
                text=True,
                env=os.environ | {"COLUMNS": "200"},
            )
            cpu, peak_kib = json.loads(measured.stdout.splitlines()[-1])
            summary = json.loads((out / "summary.json").read_text())["runs"][0]
            print(
                f"{policy:8} + relax{' (kept)' if args.keep else ' (streamed)'}: {cpu:7.1f} s CPU, "
                f"{args.jobs / cpu:7,.0f} jobs/s, peak RSS {peak_kib / 1024:6,.0f} MiB, "
                f"{summary['preemptions']:,} preemptions, "
                f"avg JCT {summary['avg_jct_s'] / 3600:.2f} h"
            )
            sys.stdout.flush()


if __name__ == "__main__":
    main()
