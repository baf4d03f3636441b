"""Alibaba's openb GPU-sharing trace as nodes and tasks for `corral fgd` (corral.core.sharing).

From alibaba/clusterdata, cluster-trace-gpu-v2023 (the FGD paper, ATC'23):

- `openb_node_list_gpu_node.csv`: `sn,cpu_milli,memory_mib,gpu,model`, one node a row;
- `openb_pod_list_*.csv`: `name,cpu_milli,memory_mib,num_gpu,gpu_milli` and, in most variants,
  `gpu_spec` (accepted GPU models, `V100M16|V100M32`; blank: any) and times, which the packing
  experiment does not use (tasks never leave).

GPU models are compared in lowercase, as elsewhere in corral. Unlike `alibaba.py` (the same pod
lists as whole-GPU jobs for `corral simulate`), this reader keeps fractional GPUs and CPU-only
tasks. Errors are one line naming the file, line and field.
"""

from __future__ import annotations

from pathlib import Path

from corral.core.sharing import MILLI, GpuNode, SharingTask, TaskShape
from corral.sim.traces.base import TraceError, csv_records, existing_path, integer, text

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
TASK_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


def read_nodes(location: str | Path) -> list[GpuNode]:
    path = existing_path(str(location), "openb nodes")
    name = str(location)
    nodes: list[GpuNode] = []
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
        nodes.append(
            GpuNode(
                name=node_name,
                cpu_milli=integer(row["cpu_milli"], where, "cpu_milli"),
                memory_mib=integer(row["memory_mib"], where, "memory_mib"),
                num_gpu=gpus,
                gpu_model=model,
            )
        )
    if not nodes:
        raise TraceError(f"{name}: no nodes")
    return nodes


def read_tasks(location: str | Path) -> list[SharingTask]:
    path = existing_path(str(location), "openb tasks")
    name = str(location)
    tasks: list[SharingTask] = []
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
        shape = TaskShape(
            cpu_milli=integer(row["cpu_milli"], where, "cpu_milli"),
            memory_mib=integer(row["memory_mib"], where, "memory_mib"),
            num_gpu=gpus,
            gpu_milli=milli,
            gpu_models=models if gpus else None,
        )
        tasks.append(SharingTask(task_name, shape))
    if not tasks:
        raise TraceError(f"{name}: no tasks")
    return tasks
