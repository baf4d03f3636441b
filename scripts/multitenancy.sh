#!/usr/bin/env bash
# Reproduce docs/multitenancy.md: the Gavel-MSR workload with one VC per trace file, VC cells sized
# from each VC's demand, under quota (YARN-CS with lending) and hived (cells with lending), with
# fifo, las and gittins inside the VCs, and fairshare with fifo, each against every VC alone on its
# own cells. Takes about 18 minutes on 2 cores.
# Run from the repository root after the README's first command: bash scripts/multitenancy.sh
set -euo pipefail
corral=${CORRAL:-.venv/bin/corral}
trace=gavel:../shared/data/gavel-msr/seed0
out=${1:-runs/multitenancy}
"$corral" vc-config --trace "$trace" --cluster 64x8 --racks 8 --out "$out/vcs.yaml"
for admission in quota hived; do
  # quota: lending idle quota (the default), in the queue's order (not --quota-lend-last,
  # which the documented run predates)
  "$corral" simulate --trace "$trace" --config "$out/vcs.yaml" --admission "$admission" \
    --no-quota-lend-last --placement consolidate --compare fifo,las,gittins --private-baseline \
    --out "$out/$admission"
done
# fairshare: shares by weight alone, as documented (0: no decayed usage; the default is 7 days)
"$corral" simulate --trace "$trace" --config "$out/vcs.yaml" --admission fairshare \
  --fairshare-half-life-s 0 --placement consolidate --policy fifo --private-baseline \
  --out "$out/fairshare"
"$corral" plot-vcs "$out/quota" "$out/hived" --out "$out/vc-queueing.png"
