"""Microsoft Philly's cluster_job_log (msr-fiddle/philly-traces): a JSON list of jobs.

Each job: status, vc, jobid, user, submitted_time and attempts, where an attempt has start_time,
end_time (None while still running when the log was cut) and detail, a list of {ip, gpus}. A job is
replayed as its last attempt: its size is the GPUs of that attempt, its run time that attempt's
length. Earlier attempts (retries after a failure) are not replayed; the policies under test decide
their own preemptions and retries.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from corral.core.job import JobSpec
from corral.core.text import count_noun
from corral.sim.perfmodel import PerfModel
from corral.sim.traces.base import (
    Trace,
    TraceError,
    TraceFormat,
    check_unique_ids,
    count_note,
    default_perf,
    existing_path,
    no_options,
    text,
    timestamp,
)


def read(location: str, *, perf: PerfModel | None = None, seed: int = 0, **options: Any) -> Trace:
    no_options("philly", options)
    path = existing_path(location, "philly")
    name = str(location)
    perf = default_perf(perf)
    records = _load_json(path, name)
    jobs: list[JobSpec] = []
    where_of: list[str] = []
    statuses: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    for index, record in enumerate(records):
        where = f"{name}: job {index}"
        if not isinstance(record, dict):
            raise TraceError(f"{where}: expected an object, got {type(record).__name__}")
        job_id = text(record.get("jobid"), where, "jobid")
        where = f"{name}: job {index} ({job_id})"
        submit = timestamp(record.get("submitted_time"), where, "submitted_time")
        attempts = record.get("attempts")
        if not isinstance(attempts, list):
            raise TraceError(f"{where}: attempts: must be a list, got {type(attempts).__name__}")
        if not attempts:
            skipped["never started (no attempts)"] += 1
            continue
        last = attempts[-1]
        last_where = f"{where}: attempts[{len(attempts) - 1}]"
        if not isinstance(last, dict):
            raise TraceError(f"{last_where}: expected an object")
        gpus = _count_gpus(last.get("detail"), last_where)
        if last.get("end_time") is None:
            skipped["unfinished (last attempt has no end_time)"] += 1
            continue
        run_s = _last_run_time(attempts, where)
        if run_s is None:
            skipped["no attempt with both start_time and end_time"] += 1
            continue
        if gpus == 0:
            skipped["no GPUs in the last attempt"] += 1
            continue
        if run_s <= 0:
            skipped["non-positive run time"] += 1
            continue
        model = ""  # the log does not say which model a job trains
        statuses[text(record.get("status"), where, "status", default="")] += 1
        jobs.append(
            JobSpec(
                id=job_id,
                submit_time=submit,
                gpus=gpus,
                user=text(record.get("user"), where, "user", default="user"),
                vc=text(record.get("vc"), where, "vc", default="default"),
                model=model,
                duration_s=run_s,
                spread_slowdown=perf.spread_slowdown(model, gpus),
            )
        )
        where_of.append(f"job {index}")
    check_unique_ids(jobs, where_of, name)
    notes = [count_note(statuses, "replayed jobs by status")] if statuses else []
    notes += [f"skipped {count_noun(n, 'job')}: {why}" for why, n in sorted(skipped.items())]
    return Trace(jobs=jobs, source=f"philly:{location}", notes=notes)


def _load_json(path: Path, name: str) -> list[Any]:
    import gzip

    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            records = json.load(handle)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{name}: line {exc.lineno}: not valid JSON: {exc.msg}") from None
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise TraceError(f"{name}: cannot read: {' '.join(str(exc).split())}") from None
    if not isinstance(records, list):
        raise TraceError(f"{name}: expected a JSON list of jobs at the top level")
    return records


def _count_gpus(detail: object, where: str) -> int:
    """Distinct (machine, GPU) pairs: the job's size."""
    if not isinstance(detail, list):
        raise TraceError(f"{where}: detail: must be a list, got {type(detail).__name__}")
    seen: set[tuple[str, str]] = set()
    for i, machine in enumerate(detail):
        if not isinstance(machine, dict):
            raise TraceError(f"{where}: detail[{i}]: expected an object")
        ip = text(machine.get("ip"), where, f"detail[{i}].ip")
        gpus = machine.get("gpus")
        if not isinstance(gpus, list):
            kind = type(gpus).__name__
            raise TraceError(f"{where}: detail[{i}].gpus: must be a list, got {kind}")
        for gpu in gpus:
            seen.add((ip, text(gpu, where, f"detail[{i}].gpus")))
    return len(seen)


def _last_run_time(attempts: list[Any], where: str) -> float | None:
    """Length of the last attempt that has both a start and an end time."""
    for i in range(len(attempts) - 1, -1, -1):
        attempt = attempts[i]
        if not isinstance(attempt, dict):
            raise TraceError(f"{where}: attempts[{i}]: expected an object")
        start, end = attempt.get("start_time"), attempt.get("end_time")
        if start is None or end is None:
            continue
        at = f"{where}: attempts[{i}]"
        return timestamp(end, at, "end_time") - timestamp(start, at, "start_time")
    return None


FORMAT = TraceFormat(
    "philly",
    "Microsoft Philly's `cluster_job_log` (JSON, or .gz): each job replayed as its last attempt",
    "philly:PATH",
    read=read,
)
