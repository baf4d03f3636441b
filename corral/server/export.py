"""`corral export-trace`: the manager's own job history as a trace `corral simulate` replays.

The format is Helios's `cluster_log.csv` (corral.sim.traces.helios reads it), one row per job that
ran: its GPUs, VC, user, submit time and run time. The run time is the seconds its attempts ran
(`executed_s`: preempted attempts included, so work a job redid after a checkpoint counts too);
jobs that never ran (cancelled while waiting) have nothing to replay and are left out.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import yaml

from corral.server.factory import CONFIG_KEY
from corral.server.store import Store

COLUMNS = (
    "job_id",
    "user",
    "vc",
    "gpu_num",
    "cpu_num",
    "node_num",
    "state",
    "submit_time",
    "start_time",
    "end_time",
    "duration",
    "queue",
)
HELIOS_STATE = {"SUCCEEDED": "COMPLETED", "FAILED": "FAILED", "CANCELLED": "CANCELLED"}


def config_path(out: Path) -> Path:
    """Where the scheduler config goes beside a trace: `trace.csv` -> `trace.scheduler.yaml`."""
    return out.with_name(out.stem + ".scheduler.yaml")


def export_config(store: Store, out: Path) -> Path | None:
    """Write the scheduler config the manager last ran with beside the trace (None: a store no
    manager of this version has run on)."""
    stored = store.get_meta(CONFIG_KEY)
    if stored is None:
        return None
    path = config_path(out)
    text = yaml.safe_dump({"scheduler": json.loads(stored)}, sort_keys=False)
    note = "# the scheduler config of the manager this trace comes from; replay its VCs with the\n"
    note += "# manager's own cluster config (corral simulate --config FILE)\n"
    path.write_text(note + text)
    return path


def export_trace(store: Store, out: Path) -> tuple[int, int]:
    """Write the finished jobs that ran; returns (written, left out)."""
    written = skipped = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = out.with_name(out.name + ".tmp")
    with temporary.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        for job in sorted(store.finished_jobs(), key=lambda j: (j.submitted_at, int(j.id))):
            if job.executed_s <= 0 or job.started_at is None or job.finished_at is None:
                skipped += 1
                continue
            writer.writerow(
                (
                    job.id,
                    job.user,
                    job.vc,
                    job.gpus,
                    0,
                    1,
                    HELIOS_STATE.get(job.status, job.status),
                    f"{job.submitted_at:.3f}",
                    f"{job.started_at:.3f}",
                    f"{job.finished_at:.3f}",
                    f"{job.executed_s:.3f}",
                    f"{job.started_at - job.submitted_at:.3f}",
                )
            )
            written += 1
    temporary.replace(out)
    return written, skipped
