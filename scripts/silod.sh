#!/usr/bin/env bash
# Reproduce docs/silod.md: node data caches on Gavel-MSR (15,264 jobs, 64 nodes x 8 V100 in 8
# racks, las, 1 Gbit/s of remote storage per node), cache-oblivious (consolidate + lru) against
# SiloD (cache-aware + silod) over cache sizes, the two halves of SiloD apart at 100 GB, and each
# team reading its own data sets (--datasets per-vc). Writes runs/silod/*, prints the table and
# draws docs/img/silod-cache-size.png. 16 runs of about 20 s each, two at a time: about 3 minutes
# on 2 free cores (12 minutes on a loaded machine).
# Run from the repository root after the README's first command: bash scripts/silod.sh
set -euo pipefail
corral=${CORRAL:-.venv/bin/corral}
python=${PYTHON:-.venv/bin/python}
out=${1:-runs/silod}
common=(--trace gavel:../shared/data/gavel-msr/seed0 --cluster 64x8 --racks 8 --policy las
  --storage-gbps 1)
mkdir -p "$out"

# name | options
runs=(
  "ideal|--placement consolidate"
  "nocache|--cache-gb-per-node 0 --placement consolidate"
)
for gb in 50 100 200 400; do
  runs+=("oblivious-$gb|--cache-gb-per-node $gb --placement consolidate --cache-policy lru")
  runs+=("silod-$gb|--cache-gb-per-node $gb --placement cache-aware --cache-policy silod")
done
runs+=("allocation-100|--cache-gb-per-node 100 --placement consolidate --cache-policy silod")
runs+=("placement-100|--cache-gb-per-node 100 --placement cache-aware --cache-policy lru")
pervc="--cache-gb-per-node 200 --datasets per-vc"
runs+=("oblivious-pervc-200|$pervc --placement consolidate --cache-policy lru")
runs+=("silod-pervc-200|$pervc --placement cache-aware --cache-policy silod")
runs+=("allocation-pervc-200|$pervc --placement consolidate --cache-policy silod")
runs+=("placement-pervc-200|$pervc --placement cache-aware --cache-policy lru")

for run in "${runs[@]}"; do
  name=${run%%|*}
  opts=${run#*|}
  # shellcheck disable=SC2086
  echo "nice $corral simulate ${common[*]} $opts --out $out/$name > $out/$name.log 2>&1"
done | xargs -P 2 -I{} sh -c "{}"

"$python" - "$out" <<'EOF'
import csv
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

out = Path(sys.argv[1])


def load(name):
    summary = json.loads((out / name / "summary.json").read_text())["runs"][0]
    (jobs_csv,) = (out / name).glob("jobs-*.csv")
    with jobs_csv.open() as handle:
        resnet = [float(r["jct_s"]) for r in csv.DictReader(handle)
                  if r["model"].startswith("ResNet-50") and r["jct_s"]]
    summary["resnet50_avg_jct_s"] = sum(resnet) / len(resnet)
    return summary


def cell(value, scale=1.0, fmt="{:.1f}"):
    return "-" if value is None else fmt.format(value * scale)


order = ["ideal", "nocache"]
order += [f"{kind}-{gb}" for gb in (50, 100, 200, 400) for kind in ("oblivious", "silod")]
order += ["allocation-100", "placement-100"]
order += [f"{kind}-pervc-200" for kind in ("oblivious", "silod", "allocation", "placement")]
names = [name for name in order if (out / name / "summary.json").exists()]
runs = {name: load(name) for name in names}
print("| run | avg JCT (h) | ResNet-50 avg JCT (h) | p95 JCT (h) | makespan (d) | hit ratio | "
      "avg speed | first-epoch stalls (GPU-h) |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for name, s in runs.items():
    print(f"| {name} | {cell(s['avg_jct_s'], 1/3600)} | {cell(s['resnet50_avg_jct_s'], 1/3600)} | "
          f"{cell(s['p95_jct_s'], 1/3600)} | {cell(s['makespan_s'], 1/86400)} | "
          f"{cell(s.get('cache_hit_ratio'), 100, '{:.1f} %')} | "
          f"{cell(s.get('avg_speed'), 1, '{:.3f}')} | "
          f"{cell(s.get('first_epoch_stall_gpu_h'), 1, '{:,.0f}')} |")

sizes = [0, 50, 100, 200, 400]
fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
for ax, key, title in (
    (axes[0], "avg_jct_s", "all 15,264 jobs"),
    (axes[1], "resnet50_avg_jct_s", "ResNet-50 jobs (ImageNet, 140 GB)"),
):
    for kind, style in (("oblivious", "o-"), ("silod", "s-")):
        values = [runs["nocache"][key]] + [runs[f"{kind}-{gb}"][key] for gb in sizes[1:]]
        label = "cache-oblivious (consolidate + lru)" if kind == "oblivious" else \
            "SiloD (cache-aware + silod)"
        ax.plot(sizes, [v / 3600 for v in values], style, label=label)
    ax.axhline(runs["ideal"][key] / 3600, color="grey", ls="--", label="IO not limiting")
    ax.set_xlabel("cache per node (GB)")
    ax.set_ylabel("average JCT (hours)")
    ax.set_title(title)
    ax.set_xticks(sizes)
    ax.grid(alpha=0.3)
axes[0].legend()
fig.suptitle("Gavel-MSR on 64 x 8 V100, las, remote storage 1 Gbit/s per node")
fig.tight_layout()
image = Path("docs/img/silod-cache-size.png")
fig.savefig(image, dpi=110)
print(f"wrote {image}")
EOF
