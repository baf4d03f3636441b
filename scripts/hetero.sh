#!/usr/bin/env bash
# Reproduce docs/hetero.md: the Gavel-MSR workload (all 15 VCs, arrivals slowed 12x) on Gavel's
# 36 V100 + 36 P100 + 36 K80 cluster, type-agnostic `relax` against `hetero` (the same ordering
# policies, las and fifo with backfill), and `hetero` with its fairness floor at 0.8; then the
# comparison table (printed as markdown) and docs/img/hetero-jct-cdf.png.
# Takes about 4 minutes on 2 cores. Run from the repository root after the README's first
# command: bash scripts/hetero.sh [OUT_DIR]
set -euo pipefail
corral=${CORRAL:-.venv/bin/corral}
python=${PYTHON:-.venv/bin/python}
out=${1:-runs/hetero}
common=(--trace gavel:../shared/data/gavel-msr/seed0 --config docs/examples/hetero-gavel.yaml
  --arrival-scale 12 --skip-oversized --backfill)
"$corral" simulate "${common[@]}" --placement relax --compare las,fifo --out "$out/relax"
"$corral" simulate "${common[@]}" --placement hetero --compare las,fifo --out "$out/hetero"
"$corral" simulate "${common[@]}" --placement hetero --hetero-fairness 0.8 --policy las \
  --out "$out/hetero-fair"

"$python" - "$out" docs/img/hetero-jct-cdf.png <<'EOF'
import csv
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

out, png = Path(sys.argv[1]), Path(sys.argv[2])
runs = []  # (label, summary, sorted JCTs in hours), relax then hetero, las then fifo
for name in ("relax", "hetero", "hetero-fair"):
    for summary in json.loads((out / name / "summary.json").read_text())["runs"]:
        # the placement's options sit in the scheduler's section (hetero_fairness: older runs)
        hetero = summary["options"].get("scheduler", {}).get("hetero") or {}
        fairness = hetero.get("fairness") or summary["options"].get("hetero_fairness")
        label = f"{summary['policy']}/{summary['placement']}" + (
            f" (fairness {fairness})" if fairness else ""
        )
        path = out / name / f"jobs-{summary['policy']}-{summary['placement']}.csv"
        with path.open() as handle:
            hours = [float(r["jct_s"]) / 3600 for r in csv.DictReader(handle) if r["jct_s"]]
        runs.append((label, summary, np.sort(hours)))
runs.sort(key=lambda run: run[1]["policy"] != "las")  # stable: keeps relax, hetero, fair

DAY_S = 86400.0
print(  # one unit, days, for every time of the table
    "| policy/placement | avg JCT (days) | p50 JCT (days) | p95 JCT (days) | makespan (days) "
    "| utilisation | GPU time on fastest type | slowest job / equal share "
    "| jobs below half their equal share |"
)
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for label, s, _ in runs:
    cells = [f"{s[k] / DAY_S:,.2f}" for k in ("avg_jct_s", "p50_jct_s", "p95_jct_s")]
    cells.append(f"{s['makespan_s'] / DAY_S:,.1f}")
    print(
        f"| {label} | " + " | ".join(cells)
        + f" | {100 * s['utilization']:.1f} % | {100 * s['best_type_share']:.1f} %"
        + f" | {s['min_equal_share_ratio']:.2f} | {100 * s['below_half_equal_share']:.2f} % |"
    )

colours = {"las": "tab:blue", "fifo": "tab:red"}
fig, (cdf, bars) = plt.subplots(1, 2, figsize=(12, 5), gridspec_kw={"width_ratios": [2, 1]})
for label, s, hours in runs:
    hours = hours[hours > 0]
    style = ":" if "fairness" in label else "-" if "hetero" in label else "--"
    cdf.step(
        hours, np.arange(1, hours.size + 1) / hours.size, where="post", ls=style, lw=1.4,
        color=colours[s["policy"]], label=label,
    )
cdf.set_xscale("log")
cdf.set_xlabel("JCT (hours, log scale)")
cdf.set_ylabel("fraction of jobs")
cdf.set_title("Job completion time (CDF)")
cdf.grid(True, which="both", alpha=0.3)
cdf.legend(loc="lower right")
shares = [100 * s["best_type_share"] for _, s, _ in runs]
bars.barh(
    range(len(runs)), shares, color=[colours[s["policy"]] for _, s, _ in runs],
    alpha=0.8,
)
bars.set_yticks(range(len(runs)), [label for label, _, _ in runs])
bars.invert_yaxis()
bars.set_xlim(0, 100)
bars.set_xlabel("% of GPU time")
bars.set_title("GPU time on each job's fastest type")
for y, share in enumerate(shares):
    bars.text(share + 1, y, f"{share:.0f} %", va="center")
fig.suptitle("Gavel-MSR on 36 V100 + 36 P100 + 36 K80 (4-GPU nodes), arrivals slowed 12x")
fig.tight_layout()
png.parent.mkdir(parents=True, exist_ok=True)
fig.savefig(png, dpi=110)
plt.close(fig)
print(f"wrote {png}")
EOF
