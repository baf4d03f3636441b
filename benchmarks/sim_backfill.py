"""Backfill rules compared on the Gavel-MSR workload: fifo with `backfill` none, greedy and easy.

All 15 VCs' jobs of Gavel's Philly-derived trace (../shared/data/gavel-msr/seed0, 15,264 jobs) in
one queue, on 64 nodes of 8 V100 in 8 racks, consolidated placement (as docs/failures.md runs it),
every job's time limit 1.5 times its run time (`--time-limit-factor 1.5`). Simulated through
`corral simulate`'s own runner: the decisions the live manager makes. Prints, per rule: the
average JCT, the cluster's utilisation, the average and the 95th percentile waiting time of the
largest 5 % of jobs (by GPUs, ties by GPU-time: the jobs a greedy backfill starves), and the
average waiting time of the others.

Run (about 2 minutes a rule on one core): python benchmarks/sim_backfill.py [--factor 1.5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from rich.console import Console

from corral.core.framework import config_from_mapping
from corral.sim.metrics import summarize
from corral.sim.runner import RunSettings, shared_data_file, simulate_results

TABLE = shared_data_file("gavel-msr/simulation_throughputs.json")
DATA = TABLE.parent / "seed0" if TABLE is not None else Path("../shared/data/gavel-msr/seed0")
RULES = ("none", "greedy", "easy")


def settings(backfill: str, factor: float, trace: Path) -> RunSettings:
    return RunSettings(
        trace=f"gavel:{trace}",
        nodes=64,
        gpus_per_node=8,
        racks=8,
        policies=["fifo"],
        scheduler=config_from_mapping(
            {"backfill": backfill, "placement": "consolidate", "admission": "none"}
        ),
        time_limit_factor=factor,
    )


def measure(backfill: str, factor: float, trace: Path) -> dict[str, float]:
    quiet = Console(file=open("/dev/null", "w"))  # noqa: SIM115 - the runner's progress lines
    (result,) = simulate_results(settings(backfill, factor, trace), quiet)
    summary = summarize(result)
    jobs = [job for job in result.jobs if job.first_started_at is not None]
    ranked = sorted(
        jobs,
        key=lambda job: (job.spec.gpus, job.spec.gpus * (job.spec.duration_s or 0.0), job.id),
        reverse=True,
    )
    top = max(1, len(ranked) // 20)
    large = np.array([job.first_started_at - job.spec.submit_time for job in ranked[:top]])
    rest = np.array([job.first_started_at - job.spec.submit_time for job in ranked[top:]])
    return {
        "jct_h": float(summary["avg_jct_s"]) / 3600,  # type: ignore[arg-type]
        "utilization": float(summary["utilization"]),  # type: ignore[arg-type]
        "large_wait_h": float(large.mean()) / 3600,
        "large_p95_h": float(np.percentile(large, 95)) / 3600,
        "rest_wait_h": float(rest.mean()) / 3600,
        "large_jobs": float(top),
        "failed": float(sum(job.status.value == "FAILED" for job in result.jobs)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--factor", type=float, default=1.5, help="time limit / run time")
    parser.add_argument("--trace", type=Path, default=DATA, help="Gavel's seed0 directory")
    parser.add_argument("--rules", nargs="+", default=list(RULES), choices=RULES)
    args = parser.parse_args()
    if not args.trace.exists():
        sys.exit(f"{args.trace}: not found (the shared data, see ../shared/data/README.md)")
    rows = {rule: measure(rule, args.factor, args.trace) for rule in args.rules}
    some = next(iter(rows.values()))
    print(
        f"| fifo, backfill | avg JCT | utilisation | largest 5 % ({some['large_jobs']:.0f} jobs): "
        "avg wait | their p95 wait | other jobs: avg wait |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for rule, got in rows.items():
        print(
            f"| {rule} | {got['jct_h']:,.1f} h | {got['utilization']:.1%} "
            f"| {got['large_wait_h']:,.1f} h | {got['large_p95_h']:,.1f} h "
            f"| {got['rest_wait_h']:,.1f} h |"
        )
    failed = {rule: int(got["failed"]) for rule, got in rows.items()}
    print(f"\njobs past their time limit (failed): {failed}")


if __name__ == "__main__":
    main()
