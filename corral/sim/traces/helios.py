"""SenseTime's Helios trace (S-Lab-System-Group/HeliosData, SC'21): `cluster_log.csv`.

Columns `job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,
queue`. Times are either seconds or "YYYY-MM-DD HH:MM:SS" (both are accepted); `duration` is the
run time in seconds, and where it is blank `end_time - start_time` stands in. CPU-only jobs
(gpu_num 0) are skipped; every final state (COMPLETED, CANCELLED, FAILED, ...) is replayed.
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
    number_or_timestamp,
    text,
)

REQUIRED = ("job_id", "gpu_num", "submit_time")
DURATION_COLUMNS = (("duration",), ("start_time", "end_time"))


def read(location: str, *, perf: PerfModel | None = None, seed: int = 0, **options: Any) -> Trace:
    no_options("helios", options)
    path = existing_path(location, "helios")
    name = str(location)
    jobs: list[JobSpec] = []
    where_of: list[str] = []
    cpu_only = no_duration = 0
    states: Counter[str] = Counter()
    for line, row in csv_records(path, REQUIRED, name, one_of=DURATION_COLUMNS):
        where = f"{name}: line {line}"
        gpus = integer(row["gpu_num"], where, "gpu_num")
        if gpus == 0:
            cpu_only += 1
            continue
        submit = number_or_timestamp(row["submit_time"], where, "submit_time")
        duration = _duration(row, where)
        if duration is None or duration <= 0:
            no_duration += 1
            continue
        states[row.get("state", "")] += 1
        jobs.append(
            JobSpec(
                id=text(row["job_id"], where, "job_id"),
                submit_time=submit,
                gpus=gpus,
                user=text(row.get("user"), where, "user", default="user"),
                vc=text(row.get("vc"), where, "vc", default="default"),
                duration_s=duration,
            )
        )
        where_of.append(f"line {line}")
    check_unique_ids(jobs, where_of, name)
    notes: list[str] = []
    if cpu_only:
        notes.append(f"skipped {count_noun(cpu_only, 'CPU-only job')} (gpu_num 0)")
    if no_duration:
        notes.append(f"skipped {count_noun(no_duration, 'job')} without a positive run time")
    if any(states):
        notes.append(count_note(states, "replayed jobs by state"))
    return Trace(jobs=jobs, source=f"helios:{location}", notes=notes)


def _duration(row: dict[str, str], where: str) -> float | None:
    raw = row.get("duration", "")
    if raw:
        return number(raw, where, "duration")
    start, end = row.get("start_time", ""), row.get("end_time", "")
    if not start or not end:
        return None
    return number_or_timestamp(end, where, "end_time") - number_or_timestamp(
        start, where, "start_time"
    )


FORMAT = TraceFormat(
    "helios",
    "SenseTime's Helios `cluster_log.csv` (SC'21)",
    "helios:PATH",
    read=read,
)
