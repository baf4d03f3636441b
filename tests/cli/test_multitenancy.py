"""`corral simulate --admission ...` end to end on a small two-VC cluster."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from click.testing import CliRunner

from corral.cli.main import app

CONFIG = {
    "cell_types": {"NODE": {"child": "V100", "count": 4, "node": True}},
    "physical_cells": [{"type": "NODE", "count": 2}],
    "virtual_clusters": {"busy": {"NODE": 1}, "quiet": {"NODE": 1}},
}
HEADER = (
    "job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue\n"
)


def write(tmp_path: Path) -> tuple[Path, Path]:
    config = tmp_path / "vcs.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    # busy submits four 4-GPU jobs of 1000 s at once; quiet one 4-GPU job at t=100.
    rows = [f"b{i},u,busy,4,1,1,COMPLETED,0,,,1000,q" for i in range(4)]
    rows.append("q0,u,quiet,4,1,1,COMPLETED,100,,,1000,q")
    trace = tmp_path / "log.csv"
    trace.write_text(HEADER + "\n".join(rows) + "\n")
    return config, trace


def run(tmp_path: Path, *args: str) -> dict:
    config, trace = write(tmp_path)
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "--trace",
            f"helios:{trace}",
            "--config",
            str(config),
            "--policy",
            "fifo",
            "--placement",
            "consolidate",
            "--restore-s",
            "0",
            "--private-baseline",
            "--out",
            str(out),
            *args,
        ],
    )
    assert result.exit_code == 0, result.output
    return json.loads((out / "summary.json").read_text())["runs"][0]


def test_lent_gpus_come_back_at_once_under_quota_and_hived(tmp_path: Path):
    quota = run(tmp_path, "--admission", "quota")  # lends idle quota by default
    # busy borrows quiet's node at t=0; quiet's job at t=100 reclaims it at once (fifo order
    # inside busy is kept), so quiet waits 0 s: no anomaly for quiet, busy gains.
    assert quota["per_vc"]["quiet"]["avg_queue_s"] == 0.0
    hived = run(tmp_path, "--admission", "hived")  # lends idle cells by default
    assert hived["sharing_anomaly_vcs"] == []
    assert hived["per_vc"]["quiet"]["avg_queue_s"] == 0.0
    # Alone on one node, busy's four jobs start at 0, 1000, 2000, 3000: 1500 s on average.
    assert hived["per_vc"]["busy"]["private_avg_queue_s"] == 1500.0
    # Shared with lending, busy's second job runs on quiet's idle node from t=0 until quiet
    # reclaims it at t=100, so busy queues less than alone.
    assert hived["per_vc"]["busy"]["avg_queue_s"] < 1500.0


def test_unknown_vc_in_the_trace_is_refused(tmp_path: Path):
    config, trace = write(tmp_path)
    trace.write_text(HEADER + "x,u,elsewhere,1,1,1,COMPLETED,0,,,10,q\n")
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "--trace",
            f"helios:{trace}",
            "--config",
            str(config),
            "--admission",
            "hived",
            "--out",
            str(tmp_path / "o"),
        ],
    )
    assert result.exit_code == 2
    assert "elsewhere" in result.output and "busy, quiet" in result.output
