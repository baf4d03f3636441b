#!/usr/bin/env bash
# Reproduce the pre-run ("precheck") tables of docs/failures.md: the Gavel-MSR workload (all 15
# VCs' jobs in one queue, 64 x 8 V100 in 8 racks, consolidated placement) under Philly's failure
# classes (corral/sim/failures.py: user errors that fail early and repeat, infrastructure failures
# per GPU-hour), every job checkpointing each hour of work: without pre-runs; with --precheck-s
# 300 (each job of more than one worker first runs as one worker until its first progress
# report, 60 s after its start by default); and with that first report at 120 s instead. First
# fifo, las and gittins with seed 0; then las with seeds 1 and 2 (other user-error jobs, other
# failure draws), to show how much of a difference the draws and the schedule make alone.
# Runs two simulations at a time; about 9 minutes on 2 idle cores. Writes runs/precheck/ (or $1)
# and prints the tables.
# Run from the repository root after the README's first command: bash scripts/precheck.sh
set -euo pipefail
python=${PYTHON:-.venv/bin/python}
out=${1:-runs/precheck}
common=(--trace gavel:../shared/data/gavel-msr/seed0 --cluster 64x8 --racks 8 --admission none
  --placement consolidate --failure-model philly --checkpoint-every-s 3600)
# name -> the pre-run flags of that configuration
declare -A configs=(
  [off]=""
  [on60]="--precheck-s 300"
  [on120]="--precheck-s 300 --precheck-report-s 120"
)

run() {  # DIR POLICIES SEED CONFIG: one `corral simulate`, its output in $out/DIR.log
  local dir=$1 policies=$2 seed=$3 config=$4
  # shellcheck disable=SC2086 # the flags of a configuration are words
  "$python" -m corral.cli simulate "${common[@]}" --compare "$policies" --seed "$seed" \
    ${configs[$config]} --out "$out/$dir" >"$out/$dir.log" 2>&1
}

pair() {  # two `run`s side by side (ARGS of the first as one string, of the second as another)
  # shellcheck disable=SC2086
  run $1 &
  local first=$!
  if [ -n "${2:-}" ]; then
    # shellcheck disable=SC2086
    run $2
  fi
  wait "$first"
}

mkdir -p "$out"
pair "s0-off fifo,las,gittins 0 off" "s0-on60 fifo,las,gittins 0 on60"
pair "s0-on120 fifo,las,gittins 0 on120" "s1-off las 1 off"
pair "s1-on60 las 1 on60" "s1-on120 las 1 on120"
pair "s2-off las 2 off" "s2-on60 las 2 on60"
pair "s2-on120 las 2 on120"

"$python" - "$out" <<'PY'
"""The tables of docs/failures.md from the runs above. JCTs are averaged over the jobs that
succeeded in every configuration of the policy and seed (as scripts/failures.sh does)."""
import csv
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
CONFIGS = {"off": "none", "on60": "300 s, report at 60 s", "on120": "300 s, report at 120 s"}


def jobs(run: str, policy: str) -> dict[str, dict[str, str]]:
    with (out / run / f"jobs-{policy}-consolidate.csv").open() as handle:
        return {row["job_id"]: row for row in csv.DictReader(handle)}


def summary(run: str, policy: str) -> dict[str, object]:
    runs = json.loads((out / run / "summary.json").read_text())["runs"]
    return next(r for r in runs if r["policy"] == policy)


def rows(seed: int, policy: str, first: str) -> tuple[list[str], int]:
    dirs = {config: f"s{seed}-{config}" for config in CONFIGS}
    table = {config: jobs(run, policy) for config, run in dirs.items()}
    common = [
        job
        for job in table["off"]
        if all(table[c][job]["status"] == "SUCCEEDED" for c in CONFIGS)
    ]
    lines = []
    for config, label in CONFIGS.items():
        s = summary(dirs[config], policy)
        jct = sum(float(table[config][job]["jct_s"]) for job in common) / len(common) / 3600
        user = s["gpu_hours_lost"] - s["gpu_hours_lost_infra"]
        lines.append(
            f"| {first} | {label} | {user:,.1f} | {s['gpu_hours_lost_infra']:,.1f} "
            f"| {s.get('precheck_gpu_hours', 0.0):,.1f} | {s['gpu_hours']:,.0f} | {jct:,.1f} h "
            f"| {s['failed']:,} ({s.get('precheck_failed', 0):,}) |"
        )
    return lines, len(common)


HEADER = (
    "| {} | pre-run | GPU-h lost to user errors | GPU-h lost to infrastructure "
    "| GPU-h in pre-runs | total GPU-h | avg JCT | jobs failed (in their pre-run) |\n"
    "|---|---|---:|---:|---:|---:|---:|---:|"
)
print("Seed 0:\n")
print(HEADER.format("policy"))
counts = {}
for policy in ("fifo", "las", "gittins"):
    lines, counts[policy] = rows(0, policy, policy)
    print("\n".join(lines))
print(
    "\nJCT over the jobs that succeeded in all three runs: "
    + ", ".join(f"{n:,} ({policy})" for policy, n in counts.items())
    + f"; pre-runs started: {summary('s0-on60', 'las')['prechecks']:,} (las, seed 0)"
)
print("\nlas, seeds 0 to 2:\n")
print(HEADER.format("seed"))
for seed in (0, 1, 2):
    lines, _ = rows(seed, "las", str(seed))
    print("\n".join(lines))
PY
