#!/usr/bin/env bash
# Reproduce docs/failures.md: fifo, las and gittins on the Gavel-MSR workload (all 15 VCs' jobs in
# one queue, 64 x 8 V100 in 8 racks, consolidated placement), without failures; with nodes that
# fail (MTBF 30 days per node) and recover (MTTR 1 hour); and with those plus Philly's failure
# classes (user errors that fail early and repeat; infrastructure failures that do not use up
# retries), every job checkpointing each hour of work. The core's retry rule (backoff, user-error rule) decides what a failure means, as
# in `corral up`. Takes about 5 minutes on 2 cores. Writes runs/failures/ (or $1) and prints the
# table.
# Run from the repository root after the README's first command: bash scripts/failures.sh
set -euo pipefail
corral=${CORRAL:-.venv/bin/corral}
python=${PYTHON:-.venv/bin/python}
out=${1:-runs/failures}
common=(--trace gavel:../shared/data/gavel-msr/seed0 --cluster 64x8 --racks 8 --admission none
  --placement consolidate
  --compare fifo,las,gittins --seed 0)
"$corral" simulate "${common[@]}" --out "$out/none"
"$corral" simulate "${common[@]}" --node-failures 2592000,3600 --checkpoint-every-s 3600 \
  --out "$out/nodes"
"$corral" simulate "${common[@]}" --failure-model philly --node-failures 2592000,3600 \
  --checkpoint-every-s 3600 --out "$out/philly"

"$python" - "$out" <<'PY'
"""The table of docs/failures.md from the three runs above. JCTs are averaged over the jobs that
succeeded in every run (a job that fails early frees the cluster for the others, which would
make failures look like a speed-up)."""
import csv
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
RUNS = ("none", "nodes", "philly")
POLICIES = ("fifo", "las", "gittins")


def jobs(run: str, policy: str) -> dict[str, dict[str, str]]:
    with (out / run / f"jobs-{policy}-consolidate.csv").open() as handle:
        return {row["job_id"]: row for row in csv.DictReader(handle)}


summaries = {
    run: {r["policy"]: r for r in json.loads((out / run / "summary.json").read_text())["runs"]}
    for run in RUNS
}
print(
    "| policy | avg JCT, no failures | avg JCT, node failures | avg JCT, Philly classes + nodes "
    "| GPU-hours lost: nodes / Philly + nodes | jobs failed (of them by the user-error rule) |"
)
print("|---|---:|---:|---:|---:|---:|")
for policy in POLICIES:
    rows = {run: jobs(run, policy) for run in RUNS}
    common = [
        job for job in rows["none"] if all(rows[r][job]["status"] == "SUCCEEDED" for r in RUNS)
    ]
    jct = {
        run: sum(float(rows[run][job]["jct_s"]) for job in common) / len(common) / 3600
        for run in RUNS
    }
    nodes, philly = summaries["nodes"][policy], summaries["philly"][policy]
    failed = sum(row["status"] == "FAILED" for row in rows["philly"].values())
    print(
        f"| {policy} | {jct['none']:,.1f} h | {jct['nodes']:,.1f} h | {jct['philly']:,.1f} h "
        f"| {nodes['gpu_hours_lost']:,.0f} / {philly['gpu_hours_lost']:,.0f} "
        f"| {failed:,} ({philly['user_error_jobs']:,}) |"
    )
print(
    f"\n{len(common):,} jobs succeeded in every run ({policy}); node failures: "
    f"{summaries['nodes']['las']['node_failures']:,} (las, nodes run)"
)
PY
