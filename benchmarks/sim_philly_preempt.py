"""Time `corral simulate` on a preemption-heavy Philly-scale trace in Tiresias's format.

What a user runs, end to end: the benchmark writes the trace as a Tiresias CSV
(`job_id,num_gpu,submit_time,iterations,model_name,duration,interval`, whole seconds, as
Tiresias reads integers), then runs the installed command on it, one process per run:

    corral simulate --trace tiresias:TRACE --cluster 312x8 --racks 13 --policy las --placement relax
    corral simulate ... --policy gittins                  (placement relax, learnt from the trace)
    corral simulate ... --preset tiresias --policy gittins  (and its las, for the ratio)
    corral simulate ... --policy las --placement relax --stream     (--million: 1,000,000 jobs)

The trace (generated once and kept in `--workdir`, named by its options):

* GPU counts from the Gavel/MSR Philly-derived mix, 1 to 64 GPUs, run times drawn from Philly's
  `philly_runtime.csv` (../shared/data/philly) and cut at 48 h, arrivals Poisson with a daily
  cycle, offered load 0.85 of 312 x 8 GPUs on average (1.6 at the daily peak): the workload of
  `benchmarks/sim_preemption_heavy.py` (its `workload`, seed `--seed`), so that queues build
  every day and `las` preempts often.
* Each job trains one of the ten models of Tiresias's 60_job.csv, drawn uniformly from a stream
  of its own (the placement's spread slowdowns then apply, as to a real trace); `iterations`
  is the run time, `interval` the gap to the next job.

For each run it prints the child's CPU seconds (user + system, from `wait4`), jobs per CPU
second, scheduling rounds and preemptions (the run's summary.json), peak RSS (`wait4`), and the
CPU the process had used when the simulation began, i.e. before its first event (start-up:
interpreter, imports, option checks, reading or opening the trace). Never passes or fails on
time. `--jobs` sets the size (default 100,000; `--small` is 30,000, the first four days: queues
build from the second day on, when the 48-hour jobs have filled the cluster; 10,000 jobs never
queue).

Run: python benchmarks/sim_philly_preempt.py [--jobs N | --small] [--runs las,gittins,...]
     [--million] [--workdir DIR]

Its first line says which core the runs use: the compiled build of a non-editable install (run
it with that install's python, from outside the source tree, where Python would import the
sources first), or the Python sources of an editable one.
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

import numpy as np
from sim_preemption_heavy import workload

from corral.sim.traces.synthetic import MIX_MODELS

NODES, GPUS_PER_NODE, RACKS = 312, 8, 13
CAP_H = 48.0
DIURNAL = 0.9

#: The runs by name: the flags given to `corral simulate` after the trace and cluster.
RUNS: dict[str, tuple[str, ...]] = {
    "las": ("--policy", "las", "--placement", "relax"),
    "gittins": ("--policy", "gittins", "--placement", "relax"),
    "tiresias-las": ("--preset", "tiresias", "--policy", "las"),
    "tiresias-gittins": ("--preset", "tiresias", "--policy", "gittins"),
    "las-stream": ("--policy", "las", "--placement", "relax", "--stream"),
}

#: Run in the child instead of the console script itself: the same command (corral.cli.main's
#: app, its environment set first as the command sets it), with the CPU time the process had used
#: when its first simulation began written to the file named by CORRAL_BENCH_STARTUP.
CHILD = """
import os, sys, time
from corral.cli.main import tool_environment
tool_environment("simulate")  # what `corral simulate` sets before it imports the simulator
import corral.sim.runner as runner
made = runner.Simulation
class Timed:
    def __init__(self, *args, **kwargs):
        self._simulation = made(*args, **kwargs)
    def __getattr__(self, name):
        return getattr(self._simulation, name)
    def run(self):
        path = os.environ.pop("CORRAL_BENCH_STARTUP", None)
        if path:
            with open(path, "w") as out:
                out.write(repr(time.process_time()))
        return self._simulation.run()
runner.Simulation = Timed
from corral.cli.main import app
sys.argv[0] = "corral"
app()
"""


def write_trace(path: Path, jobs: int, load: float, seed: int) -> None:
    """The benchmark's trace as a Tiresias CSV, written as it is generated (bounded memory)."""
    shape = dict(
        load=load, gpus=NODES * GPUS_PER_NODE, diurnal=DIURNAL, cap_s=CAP_H * 3600.0, seed=seed
    )
    models = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(3,)))
    partial = path.with_suffix(".partial")
    with partial.open("w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(
            ["job_id", "num_gpu", "submit_time", "iterations", "model_name", "duration", "interval"]
        )
        previous: list[object] | None = None
        picks = models.integers(len(MIX_MODELS), size=jobs)
        for i, spec in enumerate(workload(jobs, **shape)):  # type: ignore[arg-type]
            submit = round(spec.submit_time)
            duration = max(1, round(spec.duration_s or 1))
            if previous is not None:
                previous[-1] = submit - int(previous[2])  # type: ignore[call-overload]
                out.writerow(previous)
            previous = [i, spec.gpus, submit, duration, MIX_MODELS[picks[i]], duration, 0]
        if previous is not None:
            out.writerow(previous)
    partial.replace(path)


def trace_for(workdir: Path, jobs: int, load: float, seed: int) -> Path:
    path = workdir / f"philly-preempt-{jobs}-load{load:g}-seed{seed}.csv"
    if not path.is_file():
        print(f"writing {path} ...", flush=True)
        write_trace(path, jobs, load, seed)
    return path


def simulate_args(trace: Path, out: Path, flags: tuple[str, ...]) -> list[str]:
    """`corral simulate`'s arguments for a run of `flags` on the trace, writing to `out`."""
    return [
        "simulate",
        "--trace",
        f"tiresias:{trace}",
        "--cluster",
        f"{NODES}x{GPUS_PER_NODE}",
        "--racks",
        str(RACKS),
        "--out",
        str(out),
        *flags,
    ]


def command() -> list[str]:
    return [sys.executable, "-c", CHILD]


def core_kind() -> str:
    """Which core the children import: the compiled build or the Python sources (asked of a child,
    run as the runs are: from this working directory, with this environment)."""
    code = "from corral.core.compiled import compiled_core; print(compiled_core())"
    answer = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return "compiled core" if answer.stdout.strip() == "True" else "pure Python core"


def run(name: str, trace: Path, out: Path, extra: list[str]) -> dict[str, float]:
    """One `corral simulate` in a child process: its CPU, peak RSS, start-up and summary."""
    out.mkdir(parents=True, exist_ok=True)
    startup = out / "startup.txt"
    startup.unlink(missing_ok=True)
    args = [*command(), *simulate_args(trace, out, RUNS[name]), *extra]
    # Bytecode written and read as an installed package's is: with PYTHONDONTWRITEBYTECODE set,
    # every run's start would compile corral's sources again (some 0.3 s; sim_startup.py).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["CORRAL_BENCH_STARTUP"] = str(startup)
    with (out / "output.txt").open("w") as log:
        child = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        sys.exit(f"{name}: corral simulate failed ({child.returncode}); see {out / 'output.txt'}")
    summary = json.loads((out / "summary.json").read_text())["runs"][0]
    return {
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_mib": usage.ru_maxrss / 1024,
        "startup_s": float(startup.read_text()) if startup.is_file() else float("nan"),
        "jobs": float(summary["jobs"]),
        "rounds": float(summary["rounds"]),
        "preemptions": float(summary["preemptions"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--small", action="store_true", help="30,000 jobs")
    parser.add_argument("--load", type=float, default=0.85)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--runs",
        default="las,gittins,tiresias-las,tiresias-gittins",
        help=f"comma-separated, of {', '.join(RUNS)}",
    )
    parser.add_argument(
        "--million", action="store_true", help="also las streamed on 1,000,000 jobs (long)"
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "corral-bench-philly",
        help="where the traces are kept and the runs write (default: the system's temp dir)",
    )
    parser.add_argument(
        "--gittins-history", type=Path, help="passed to the preset's runs (default: the preset's)"
    )
    args = parser.parse_args()
    jobs = 30_000 if args.small else args.jobs
    names = [name for name in args.runs.split(",") if name]
    unknown = [name for name in names if name not in RUNS]
    if unknown:
        sys.exit(f"--runs: unknown {', '.join(unknown)} (known: {', '.join(RUNS)})")
    args.workdir.mkdir(parents=True, exist_ok=True)
    plan = [(name, jobs) for name in names]
    if args.million:
        plan.append(("las-stream", 1_000_000))
    load1 = os.getloadavg()[0]
    print(
        f"workload: Tiresias CSV, Philly sizes and run times (cut at {CAP_H:g} h), load "
        f"{args.load:g}, daily cycle {DIURNAL:g}, seed {args.seed}; "
        f"{NODES} x {GPUS_PER_NODE} GPUs in {RACKS} racks; {core_kind()}; load average {load1:.2f}",
        flush=True,
    )
    for name, size in plan:
        trace = trace_for(args.workdir, size, args.load, args.seed)
        extra: list[str] = []
        if name.startswith("tiresias") and args.gittins_history is not None:
            extra = ["--gittins-history", str(args.gittins_history)]
        figures = run(name, trace, args.workdir / f"run-{name}-{size}", extra)
        cpu = figures["cpu_s"]
        print(
            f"{name:17} {size:>9,} jobs: {cpu:7.2f} s CPU, {size / cpu:8,.0f} jobs/s, "
            f"{figures['rounds']:>10,.0f} rounds, {figures['preemptions']:>7,.0f} preemptions, "
            f"peak RSS {figures['peak_mib']:5,.0f} MiB, start-up {figures['startup_s']:.2f} s CPU",
            flush=True,
        )
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
