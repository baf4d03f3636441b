"""Tiresias's simulator trace (SymbioticLab/Tiresias, e.g. 60_job.csv).

Columns `job_id,num_gpu,submit_time,iterations,model_name,duration,interval`, times in seconds;
`duration` is the run time on a consolidated placement. `interval` (the gap to the next job) is
redundant with `submit_time` and ignored; `iterations` and `model_name` may be absent. The
format gives a streaming reader only: a whole trace is what it streams (`TraceFormat.load`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from corral.core.job import JobSpec
from corral.sim.perfmodel import PerfModel
from corral.sim.traces.base import (
    TraceFormat,
    csv_records,
    default_perf,
    existing_path,
    integer,
    no_options,
    number,
    text,
)

REQUIRED = ("job_id", "num_gpu", "submit_time", "duration")


def stream(
    location: str, *, perf: PerfModel | None = None, seed: int = 0, **options: Any
) -> Iterator[tuple[str, JobSpec]]:
    """The jobs in file order, each with where it is ("line 7"), read as they are asked for."""
    no_options("tiresias", options)
    return _records(existing_path(location, "tiresias"), str(location), default_perf(perf))


def _records(path: Path, name: str, perf: PerfModel) -> Iterator[tuple[str, JobSpec]]:
    for line, row in csv_records(path, REQUIRED, name):
        where = f"{name}: line {line}"
        gpus = integer(row["num_gpu"], where, "num_gpu", positive=True)
        model = row.get("model_name", "")
        steps = row.get("iterations", "")
        yield (
            f"line {line}",
            JobSpec(
                id=text(row["job_id"], where, "job_id"),
                submit_time=number(row["submit_time"], where, "submit_time"),
                gpus=gpus,
                model=model,
                duration_s=number(row["duration"], where, "duration", positive=True),
                total_steps=number(steps, where, "iterations") if steps else None,
                spread_slowdown=perf.spread_slowdown(model, gpus),
            ),
        )


FORMAT = TraceFormat(
    "tiresias",
    "Tiresias's simulator CSV (job_id, num_gpu, submit_time, duration), e.g. 60_job.csv",
    "tiresias:PATH",
    stream=stream,
)
