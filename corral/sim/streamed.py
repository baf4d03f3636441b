"""Where a streamed run (`corral simulate --stream`) puts its results as it goes.

Each job's row is written to jobs-POLICY-PLACEMENT.csv as the job ends, in the order jobs end
(the jobs still waiting or running when the run stops come last), and counted into the
summary's `JobStats`; the engine then drops the job. Decisions (`--decisions`) are written as
they are made, each instant's in `decision_order`, so that the file is the one a whole run
writes. Memory stays bounded by the jobs in the system, plus `JobStats`' few floats per job.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import TracebackType
from typing import IO

from corral.core.actions import Action
from corral.core.job import Job
from corral.core.tracefile import decision_order
from corral.sim.jobstats import JobStats
from corral.sim.metrics import JOB_COLUMNS, job_values
from corral.sim.result import decision_record


class StreamedOutput:
    """The files of one streamed run, written while it runs (a context manager: closed, and
    the last instant's decisions written, also when the run fails half-way)."""

    def __init__(self, jobs_csv: Path, decisions: Path | None, gpu_names: list[str]) -> None:
        self.stats = JobStats()
        self.jobs_csv = jobs_csv
        self.decisions = decisions
        self.gpu_names = gpu_names
        self._jobs_file: IO[str] = jobs_csv.open("w", newline="")
        self._rows = csv.writer(self._jobs_file)
        self._rows.writerow(JOB_COLUMNS)
        self._decisions_file: IO[str] | None = None
        if decisions is not None:
            self._decisions_file = decisions.open("w")
        self._instant: list[dict[str, object]] = []  # the decisions of the latest instant

    def job_ended(self, job: Job) -> None:
        self._rows.writerow(job_values(job, True))
        self.stats.add(job, True)

    def decided(self, at: float, action: Action) -> None:
        record = decision_record(at, action, self.gpu_names)
        if record is None:
            return
        if self._instant and self._instant[0]["at"] != at:
            self._write_instant()
        self._instant.append(record)

    def finish(self, left: list[Job]) -> JobStats:
        """The jobs still waiting or running at the end are written last; the summary's stats."""
        for job in left:
            self.job_ended(job)
        return self.stats

    def _write_instant(self) -> None:
        assert self._decisions_file is not None
        for record in sorted(self._instant, key=decision_order):
            self._decisions_file.write(json.dumps(record) + "\n")
        self._instant.clear()

    def close(self) -> None:
        if self._instant:
            self._write_instant()
        self._jobs_file.close()
        if self._decisions_file is not None:
            self._decisions_file.close()

    def __enter__(self) -> StreamedOutput:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()
