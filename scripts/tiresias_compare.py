"""Run the Tiresias simulator and corral on the same traces and print the average JCTs side by side.

Fetches nothing. Needs a checkout of SymbioticLab/Tiresias (its `simulator/` folder, run
unchanged) and a Python 2.7 with numpy (`pip install numpy==1.16.6`). From the repository root:

    .venv/bin/python scripts/tiresias_compare.py PATH/TO/Tiresias/simulator \\
        [--python2 python2.7] [--cluster 16x4] [--trace NAME=SPEC ...] [--out runs/tiresias]

Each trace is a Tiresias-format CSV: a path, or a synthetic spec `jobs=N,load=L,seed=S` that this
script writes with corral's generator (corral.sim.traces.synthetic: Philly-derived GPU counts
and run times, Poisson arrivals at offered load L of the cluster's GPUs, each job one of the
models of Tiresias's 60_job.csv; sizes capped at 32 GPUs, times rounded to whole seconds, as
Tiresias reads integers). Default traces: the three of the table in docs/policies.md.

Policies compared: Tiresias's `fifo`, `dlas-gpu` (2D-LAS: attained GPU-seconds) and
`dlas-gpu-gittins` (2D-Gittins inside the LAS queues; its `gittins` scheduler stops with a
TypeError as shipped: it reads `JOBS.job_dist_data`, which only the dlas-gpu-gittins path sets)
against corral's fifo, las and gittins, with `--preset tiresias` and with corral's defaults
(placement relax, restore 30 s, spread slowdowns, its LAS thresholds, Gittins learnt from the
trace itself). Tiresias always runs with `--scheme=yarn` on NODES x GPUS in one switch.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_TRACES = (
    "light=jobs=500,load=0.6,seed=1",
    "busy=jobs=1000,load=0.9,seed=2",
    "overloaded=jobs=2000,load=1.3,seed=3",
)
PAIRS = (("fifo", "fifo"), ("dlas-gpu", "las"), ("dlas-gpu-gittins", "gittins"))


def write_synthetic(spec: str, gpus: int, path: Path) -> None:
    """A Tiresias-format trace from corral's synthetic generator."""
    from corral.sim.traces import load_trace

    keys = dict(part.split("=", 1) for part in spec.split(","))
    seed = int(keys.pop("seed", "0"))
    location = ",".join(f"{k}={v}" for k, v in keys.items())
    trace = load_trace(f"synthetic:{location},gpus={gpus},max_gpus=32,models=mix", seed=seed)
    with path.open("w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(
            ["job_id", "num_gpu", "submit_time", "iterations", "model_name", "duration", "interval"]
        )
        submits = [round(job.submit_time) for job in trace.jobs]
        for i, job in enumerate(trace.jobs):
            gap = submits[i + 1] - submits[i] if i + 1 < len(submits) else 0
            duration = max(1, round(job.duration_s or 1))
            out.writerow([i, job.gpus, submits[i], duration, job.model, duration, gap])


def run_tiresias(
    simulator: Path, python2: str, trace: Path, cluster: tuple[int, int], schedule: str, out: Path
) -> tuple[float, float]:
    """(average JCT, CPU seconds) of one Tiresias run."""
    nodes, gpus = cluster
    spec = out / "cluster_spec.csv"
    spec.write_text(
        f"num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,mem_p_node\n"
        f"1,{nodes},{gpus},128,256\n"
    )
    log = out / f"tiresias-{schedule}"
    if log.exists():
        shutil.rmtree(log)
    before = os.times()
    subprocess.run(
        [
            python2,
            "run_sim.py",
            f"--cluster_spec={spec.resolve()}",
            "--scheme=yarn",
            f"--trace_file={trace.resolve()}",
            f"--schedule={schedule}",
            f"--log_path={log.resolve()}",
        ],
        cwd=simulator,
        check=True,
        stdout=subprocess.DEVNULL,  # it reads yarn-gput1000.csv there
    )
    after = os.times()
    with (log / "job.csv").open() as handle:
        jcts = [float(row["JCT"]) for row in csv.DictReader(handle)]
    return sum(jcts) / len(jcts), after.children_user - before.children_user


def corral_simulate(trace: Path, cluster: str, out: Path, *flags: str) -> list[dict]:
    """The runs of one `corral simulate` of a Tiresias-format trace (its summary.json)."""
    command = [
        sys.executable,
        "-m",
        "corral.cli",
        "simulate",
        "--trace",
        f"tiresias:{trace}",
        "--cluster",
        cluster,
        "--out",
        str(out),
        *flags,
    ]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "summary.json").read_text())["runs"]


def run_corral(trace: Path, cluster: tuple[int, int], preset: bool, out: Path) -> dict[str, float]:
    """Average JCT per policy of one `corral simulate --compare fifo,las,gittins`."""
    folder = out / ("corral-preset" if preset else "corral-defaults")
    flags = ["--compare", "fifo,las,gittins", *(["--preset", "tiresias"] if preset else [])]
    runs = corral_simulate(trace, f"{cluster[0]}x{cluster[1]}", folder, *flags)
    return {run["policy"]: float(run["avg_jct_s"]) for run in runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("simulator", type=Path, help="the Tiresias checkout's simulator/ folder")
    parser.add_argument("--python2", default="python2.7", help="a Python 2.7 with numpy")
    parser.add_argument("--cluster", default="16x4", help="NODESxGPUS (one switch)")
    parser.add_argument("--trace", action="append", help="NAME=PATH or NAME=jobs=N,load=L,seed=S")
    parser.add_argument("--out", type=Path, default=Path("runs/tiresias"))
    args = parser.parse_args()
    simulator = (
        args.simulator / "simulator" if (args.simulator / "simulator").is_dir() else args.simulator
    )
    if not (simulator / "run_sim.py").is_file():
        sys.exit(f"{simulator}: no run_sim.py (give the Tiresias checkout or its simulator/)")
    nodes, gpus = (int(x) for x in args.cluster.lower().split("x"))
    rows = []
    for entry in args.trace or DEFAULT_TRACES:
        name, _, spec = entry.partition("=")
        out = args.out / name
        out.mkdir(parents=True, exist_ok=True)
        if Path(spec).is_file():
            trace = Path(spec)
        else:
            trace = out / "trace.csv"
            write_synthetic(spec, nodes * gpus, trace)
        preset = run_corral(trace, (nodes, gpus), True, out)
        defaults = run_corral(trace, (nodes, gpus), False, out)
        for schedule, policy in PAIRS:
            started = time.time()
            theirs, cpu = run_tiresias(simulator, args.python2, trace, (nodes, gpus), schedule, out)
            print(
                f"  {name} {schedule}: {theirs:,.0f} s ({cpu:.0f} s CPU, "
                f"{time.time() - started:.0f} s wall)",
                file=sys.stderr,
            )
            rows.append((name, policy, schedule, theirs, preset[policy], defaults[policy]))
    print(
        "| trace | policy | Tiresias (schedule) | avg JCT, --preset tiresias | avg JCT, "
        "corral defaults |"
    )
    print("|---|---|---|---|---|")
    for name, policy, schedule, theirs, preset_jct, default_jct in rows:
        print(
            f"| {name} | {policy} | {theirs:,.0f} s ({schedule}) | {preset_jct:,.0f} s "
            f"({preset_jct / theirs:.3f}) | {default_jct:,.0f} s ({default_jct / theirs:.3f}) |"
        )


if __name__ == "__main__":
    main()
