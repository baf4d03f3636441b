"""Alibaba's openb GPU-sharing trace as FGD's packing experiment: `openb:NODES_CSV,PODS_CSV`.

From alibaba/clusterdata, cluster-trace-gpu-v2023 (the FGD paper, Weng et al., ATC'23):

- `openb_node_list_gpu_node.csv`: `sn,cpu_milli,memory_mib,gpu,model`, one node a row: the
  cluster (`Trace.nodes`, which replaces `--cluster`), each node with its CPU and memory;
- `openb_pod_list_*.csv`: `name,cpu_milli,memory_mib,num_gpu,gpu_milli` and, in most variants,
  `gpu_spec` (accepted GPU models, `V100M16|V100M32`; blank: any) and times, which the experiment
  does not use. A pod is a job (`JobSpec`) asking for CPU, memory and no GPU, a share of one GPU
  (`num_gpu` 1, `gpu_milli` below 1000) or whole GPUs.

The arrivals are the experiment's, as in the paper's artifact (hkust-adsl/kubernetes-scheduler-
simulator, `-tune 1.3 --shuffle-pod`): every pod of the list, plus pods drawn from it with
replacement until the next draw would take the GPU request above `load` (default 1.3) x the
cluster's GPU capacity, in a random order (seeded by `--seed`), one a second. Jobs never end, and
one that cannot be placed when it arrives fails (`Trace.place_or_fail`). FGD's target workload is
the pod list's task types and their counts (`Trace.workload`), not the inflated arrivals'.

`openb:NODES,PODS,load=1.0` sets the load. GPU models are compared in lowercase, as elsewhere in
corral. Errors are one line naming the file, line and field. (`alibaba:PODS` reads the same pod
lists as whole-GPU jobs with their own times, for the ordinary policies.)
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from corral.core.cluster import MILLI, NodeDef
from corral.core.fragmentation import Workload
from corral.core.job import JobSpec
from corral.core.text import count_noun
from corral.sim.perfmodel import PerfModel
from corral.sim.traces.base import (
    Trace,
    TraceError,
    TraceFormat,
    csv_records,
    existing_path,
    integer,
    no_options,
    text,
)

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
TASK_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
DEFAULT_LOAD = 1.3


def read(location: str, *, perf: PerfModel | None = None, seed: int = 0, **options: Any) -> Trace:
    no_options("openb", options)
    parts = [part.strip() for part in location.split(",")]
    paths = [part for part in parts if "=" not in part]
    settings = dict(part.split("=", 1) for part in parts if "=" in part)
    if len(paths) != 2 or not all(paths):
        raise TraceError(f"openb: expected openb:NODES_CSV,PODS_CSV[,load=X], got {location!r}")
    unknown = sorted(set(settings) - {"load"})
    if unknown:
        raise TraceError(f"openb: unknown option {unknown[0]!r} (known: load)")
    try:
        load = float(settings.get("load", DEFAULT_LOAD))
    except ValueError:
        load = -1.0
    if not 0 < load <= 10:
        raise TraceError(f"openb: load: must be in (0, 10], got {settings.get('load')!r}")
    nodes_path, pods_path = paths
    nodes, skipped = read_nodes(nodes_path)
    pods = read_tasks(pods_path)
    capacity = sum(node.gpus for node in nodes) * MILLI
    jobs = arrival_sequence(pods, capacity, load, random.Random(seed))
    jobs = [dataclasses.replace(spec, submit_time=float(i)) for i, spec in enumerate(jobs)]
    notes = [
        f"{count_noun(len(pods), 'pod')}, {count_noun(len(jobs), 'arrival')} "
        f"up to {100 * load:.0f}% of the GPU capacity "
        f"(seed {seed}), one a second; jobs never end, and fail when they cannot be placed "
        "on arrival"
    ]
    if skipped:
        notes.append(
            f"skipped {count_noun(skipped, 'node')} without GPUs (the cluster holds GPU nodes)"
        )
    return Trace(
        jobs=jobs,
        source=f"openb:{pods_path}",
        notes=notes,
        nodes=nodes,
        workload=Workload.from_specs(pods),
        place_or_fail=True,
        target_load=load,
    )


def read_nodes(location: str | Path) -> tuple[list[NodeDef], int]:
    """The nodes with GPUs, and how many without GPUs were skipped."""
    path = existing_path(str(location), "openb nodes")
    name = str(location)
    nodes: list[NodeDef] = []
    skipped = 0
    first_line: dict[str, int] = {}
    for line, row in csv_records(path, NODE_COLUMNS, name):
        where = f"{name}: line {line}"
        node_name = text(row["sn"], where, "sn")
        if node_name in first_line:
            raise TraceError(
                f"{where}: sn: duplicate node {node_name!r} (first at line {first_line[node_name]})"
            )
        first_line[node_name] = line
        gpus = integer(row["gpu"], where, "gpu")
        model = row["model"].strip().lower()
        if gpus and not model:
            raise TraceError(f"{where}: model: missing for a node with {gpus} GPUs")
        cpu = integer(row["cpu_milli"], where, "cpu_milli")
        memory = integer(row["memory_mib"], where, "memory_mib")
        if not gpus:
            skipped += 1
            continue
        nodes.append(
            NodeDef(name=node_name, gpus=gpus, gpu_type=model, cpu_milli=cpu, memory_mib=memory)
        )
    if not nodes:
        raise TraceError(f"{name}: no nodes with GPUs")
    return nodes, skipped


def read_tasks(location: str | Path) -> list[JobSpec]:
    """The pods as jobs, in file order, all submitted at 0 and never ending."""
    path = existing_path(str(location), "openb tasks")
    name = str(location)
    jobs: list[JobSpec] = []
    first_line: dict[str, int] = {}
    for line, row in csv_records(path, TASK_COLUMNS, name):
        where = f"{name}: line {line}"
        task_name = text(row["name"], where, "name")
        if task_name in first_line:
            raise TraceError(
                f"{where}: name: duplicate task {task_name!r} (first at line {first_line[task_name]})"
            )
        first_line[task_name] = line
        gpus = integer(row["num_gpu"], where, "num_gpu")
        milli = integer(row["gpu_milli"], where, "gpu_milli")
        if gpus == 0 and milli != 0:
            raise TraceError(f"{where}: gpu_milli: must be 0 for a task without GPUs, got {milli}")
        if gpus == 1 and not 1 <= milli <= MILLI:
            raise TraceError(f"{where}: gpu_milli: must be 1..{MILLI} for one GPU, got {milli}")
        if gpus > 1 and milli != MILLI:
            raise TraceError(
                f"{where}: gpu_milli: a task of {gpus} GPUs takes whole GPUs ({MILLI}), got {milli}"
            )
        spec = row.get("gpu_spec", "")
        models = frozenset(m.strip().lower() for m in spec.split("|") if m.strip()) or None
        cpu = integer(row["cpu_milli"], where, "cpu_milli")
        memory = integer(row["memory_mib"], where, "memory_mib")
        if gpus == 0 and not (cpu or memory):
            raise TraceError(f"{where}: a task without GPUs must ask for CPU or memory")
        jobs.append(
            JobSpec(
                id=task_name,
                submit_time=0.0,
                gpus=gpus,
                gpu_milli=milli if gpus else MILLI,
                cpu_milli=cpu,
                memory_mib=memory,
                gpu_types=models if gpus else None,
            )
        )
    if not jobs:
        raise TraceError(f"{name}: no tasks")
    return jobs


def arrival_sequence(
    tasks: Sequence[JobSpec], capacity_milli: int, target_load: float, rng: random.Random
) -> list[JobSpec]:
    """The trace's tasks topped up (or cut down) to `target_load` x capacity of GPU request,
    shuffled. Drawn tasks keep the id of the task they copy, with a `~k` suffix; cutting down
    drops random tasks that ask for GPUs."""
    if not tasks:
        raise TraceError("no tasks")
    target = target_load * capacity_milli
    sequence = list(tasks)
    requested = sum(t.total_gpu_milli for t in sequence)
    if requested > target:  # drop random GPU tasks (CPU-only ones do not change the request)
        rng.shuffle(sequence)
        for index in range(len(sequence) - 1, -1, -1):
            if requested <= target:
                break
            if sequence[index].total_gpu_milli:
                requested -= sequence.pop(index).total_gpu_milli
    else:
        copies = 0
        while True:
            drawn = tasks[rng.randrange(len(tasks))]
            if requested + drawn.total_gpu_milli > target:
                break
            copies += 1
            sequence.append(dataclasses.replace(drawn, id=f"{drawn.id}~{copies}"))
            requested += drawn.total_gpu_milli
    rng.shuffle(sequence)
    return sequence


FORMAT = TraceFormat(
    "openb",
    "FGD's packing experiment on Alibaba's openb nodes and pods: placed on arrival or never",
    "openb:NODES_CSV,PODS_CSV[,load=L]",
    read=read,
)
