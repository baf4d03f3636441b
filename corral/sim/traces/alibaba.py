"""Alibaba's openb pod lists (alibaba/clusterdata, cluster-trace-gpu-v2023; the FGD paper, ATC'23).

Columns `name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,
deletion_time,scheduled_time`, times in seconds. A task is submitted at `creation_time` and runs
for `deletion_time - scheduled_time`. Only `name` and `num_gpu` are required: some variants
(openb_pod_list_multigpu50.csv) stop after `gpu_milli`. Without times, every task is submitted at 0
and its duration is unknown (None: it runs until the simulation ends, as in FGD's packing
experiments, which place tasks and never remove them).

corral gives whole GPUs only, for now: a task asking for a fraction of one GPU (gpu_milli < 1000)
gets one whole GPU.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from corral.core.job import JobSpec
from corral.core.text import count_noun
from corral.sim.perfmodel import PerfModel
from corral.sim.traces.base import (
    Trace,
    TraceFormat,
    check_unique_ids,
    count_note,
    csv_records,
    existing_path,
    integer,
    no_options,
    number,
    text,
)

REQUIRED = ("name", "num_gpu")


def read(location: str, *, perf: PerfModel | None = None, seed: int = 0, **options: Any) -> Trace:
    no_options("alibaba", options)
    path = existing_path(location, "alibaba")
    name = str(location)
    jobs: list[JobSpec] = []
    where_of: list[str] = []
    cpu_only = fractional = no_duration = 0
    has_times: bool | None = None
    phases: Counter[str] = Counter()
    for line, row in csv_records(path, REQUIRED, name):
        where = f"{name}: line {line}"
        if has_times is None:
            has_times = "creation_time" in row
        gpus = integer(row["num_gpu"], where, "num_gpu")
        if gpus == 0:
            cpu_only += 1
            continue
        milli = row.get("gpu_milli", "")
        if milli and number(milli, where, "gpu_milli") < 1000 and gpus == 1:
            fractional += 1
        duration: float | None = None
        submit = 0.0
        if has_times:
            submit = number(row["creation_time"], where, "creation_time")
            deleted, scheduled = row.get("deletion_time", ""), row.get("scheduled_time", "")
            if not deleted or not scheduled:
                no_duration += 1
                continue
            duration = number(deleted, where, "deletion_time") - number(
                scheduled, where, "scheduled_time"
            )
            if duration <= 0:
                no_duration += 1
                continue
        spec = row.get("gpu_spec", "")
        gpu_types = frozenset(t.strip().lower() for t in spec.split("|") if t.strip()) or None
        phases[row.get("pod_phase", "")] += 1
        jobs.append(
            JobSpec(
                id=text(row["name"], where, "name"),
                submit_time=submit,
                gpus=gpus,
                gpu_types=gpu_types,
                duration_s=duration,
            )
        )
        where_of.append(f"line {line}")
    check_unique_ids(jobs, where_of, name)
    notes: list[str] = []
    if cpu_only:
        notes.append(f"skipped {count_noun(cpu_only, 'CPU-only record')} (num_gpu 0)")
    if no_duration:
        notes.append(
            f"skipped {count_noun(no_duration, 'record')} without a positive duration "
            "(deletion_time - scheduled_time)"
        )
    if fractional:
        notes.append(
            f"gave one whole GPU to {count_noun(fractional, 'task')} that asked for a "
            "fraction of one (gpu_milli < 1000)"
        )
    if has_times is False:
        notes.append(
            "no creation/deletion times in this file: every task is submitted at 0 with "
            "an unknown duration"
        )
    if phases and any(phases):
        notes.append(count_note(phases, "replayed tasks by pod_phase"))
    return Trace(jobs=jobs, source=f"alibaba:{location}", notes=notes)


FORMAT = TraceFormat(
    "alibaba",
    "Alibaba's openb pod lists (cluster-trace-gpu-v2023) as whole-GPU jobs with their times",
    "alibaba:PATH",
    read=read,
)
