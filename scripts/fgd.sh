#!/usr/bin/env bash
# Reproduce docs/fgd.md: FGD's packing experiment (Weng et al., ATC'23) on Alibaba's openb trace,
# 1,213 nodes / 6,212 GPUs, fgd against best-fit, random-fit, gpu-packing and gpu-packing-cpu,
# median of 10 arrival orders, on the default pod list and on the gpushare40 and multigpu50
# variants. `corral fgd` runs `corral simulate --trace openb:NODES,PODS --policy fifo
# --placement P --seed S` for each placement P and order S and takes the medians.
# Runs the simulations of each variant side by side, one worker process per CPU (--workers 0;
# the same results as one by one): about 3.5 minutes on 2 cores (214 s without the plots,
# 2026-11-25).
# Run from the repository root after the README's first command: bash scripts/fgd.sh
set -euo pipefail
corral=${CORRAL:-.venv/bin/corral}
data=../shared/data/alibaba-openb
out=${1:-runs/fgd}
for variant in default gpushare40 multigpu50; do
  "$corral" fgd --nodes "$data/openb_node_list_gpu_node.csv" \
    --tasks "$data/openb_pod_list_$variant.csv" \
    --policies fgd,best-fit,random-fit,gpu-packing,gpu-packing-cpu --repeats 10 --seed 0 \
    --workers 0 --out "$out/$variant" --plot
done
mkdir -p docs/img
cp "$out/default/fgd.png" docs/img/fgd.png
cp "$out/gpushare40/fgd.png" docs/img/fgd-gpushare40.png
cp "$out/multigpu50/fgd.png" docs/img/fgd-multigpu50.png
