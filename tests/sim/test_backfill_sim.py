"""Backfill rules and time limits through `corral simulate`: corral's own trace format carries
each job's `time_limit_s`, `--time-limit-factor` fills the missing ones, and fifo decides with
`--backfill none`, `greedy` (also `--backfill` alone) and `easy` as the core's tests work out."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from click.testing import CliRunner

from corral.cli.main import app
from corral.core.cluster import NodeDef
from corral.core.job import JobSpec
from corral.core.tracefile import header_record, job_record, node_record


def write_trace(path: Path, jobs: list[JobSpec]) -> Path:
    lines = [header_record(0.0, source="test")]
    lines += [node_record(NodeDef(f"n{i}", 4)) for i in range(2)]
    lines += [job_record(spec) for spec in jobs]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def job(job_id: str, gpus: int, submit: float, run_s: float, limit: float | None) -> JobSpec:
    return JobSpec(job_id, submit, gpus, duration_s=run_s, time_limit_s=limit)


def simulate(trace: Path, out: Path, *flags: str) -> dict[str, dict[str, str]]:
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "--trace",
            f"corral:{trace}",
            "--policy",
            "fifo",
            "--restore-s",
            "0",
            "--out",
            str(out),
            *flags,
        ],
    )
    assert result.exit_code == 0, result.output
    (jobs_csv,) = out.glob("jobs-fifo-*.csv")
    with jobs_csv.open() as handle:
        return {row["job_id"]: row for row in csv.DictReader(handle)}


def test_backfill_rules_in_the_simulator(tmp_path: Path):
    placed = ("--placement", "consolidate")
    # Two nodes of 4 GPUs. A (3 GPUs, runs 100 s, limit 100) starts at 0 on node 0, B (4 GPUs,
    # runs 500 s, limit 500) on node 1; GPU 3 stays free. At 10: H (4 GPUs, 100 s), then L
    # (1 GPU, runs 200 s, limit 200), then S (1 GPU, runs 50 s, limit 90).
    # - none: H blocks L and S. A ends at 100 and H starts on node 0; L and S then find no
    #   free GPU (node 1 is B's until 500) until H ends at 200: they start at 200.
    # - greedy: L takes GPU 3 at 10 (until 210); A ends at 100 and S takes GPU 0; H waits for
    #   L: it starts at 210.
    # - easy: H's shadow time is 100 (A's limit), reserved node 0. L would end at 210 on GPU 3:
    #   it waits. S ends by 100: it starts at 10 on GPU 3 and ends at 60. H starts at 100;
    #   L at 200, when H ends.
    trace = write_trace(
        tmp_path / "t.corral.jsonl",
        [
            job("A", 3, 0, 100, 100),
            job("B", 4, 0, 500, 500),
            job("H", 4, 10, 100, 1000),
            job("L", 1, 10, 200, 200),
            job("S", 1, 10, 50, 90),
        ],
    )
    starts = {}
    for name, flags in {
        "none": (*placed, "--backfill", "none"),
        "greedy": (*placed, "--backfill"),
        "easy": (*placed, "--backfill", "easy"),
    }.items():
        rows = simulate(trace, tmp_path / name, *flags)
        starts[name] = {job_id: float(row["first_start_s"]) for job_id, row in rows.items()}
        assert {row["status"] for row in rows.values()} == {"SUCCEEDED"}
    assert starts["none"] == {"A": 0, "B": 0, "H": 100, "L": 200, "S": 200}
    assert starts["greedy"] == {"A": 0, "B": 0, "H": 210, "L": 10, "S": 100}
    assert starts["easy"] == {"A": 0, "B": 0, "H": 100, "L": 200, "S": 10}


def test_time_limit_factor_and_a_job_past_its_limit(tmp_path: Path):
    # X runs 100 s with no limit in the trace: --time-limit-factor 0.5 gives it 50 s, so it
    # fails at 50 (the job ends FAILED, as live). Y's own limit (300) is kept: it succeeds at
    # 200.
    trace = write_trace(
        tmp_path / "t.corral.jsonl",
        [job("X", 1, 0, 100, None), job("Y", 1, 0, 200, 300)],
    )
    rows = simulate(trace, tmp_path / "out", "--time-limit-factor", "0.5")  # (relax)
    assert (rows["X"]["status"], float(rows["X"]["finish_s"])) == ("FAILED", 50.0)
    assert (rows["Y"]["status"], float(rows["Y"]["finish_s"])) == ("SUCCEEDED", 200.0)


RESERVED = """\
cell_types:
  NODE: {child: v100, count: 4, node: true}
physical_cells:
  - {type: NODE, count: 1}
reservations:
  - {name: demo, start: 100, duration: 100, gpus: 2, users: [alice]}
"""


def test_a_reservation_in_the_cluster_config(tmp_path: Path):
    # One node of 4 GPUs; demo keeps 2 GPUs (0 and 1: the only node's first two) for alice
    # from 100 to 200. fifo, greedy backfill, placement any. At 0: Y (bob, 2 GPUs, runs 300,
    # limit 500) would run into the window on 0-1: placed again on 2-3. X (bob, 1 GPU, runs
    # 40, limit 50) ends before 100: GPU 0. Z (bob, 1 GPU, runs 30, no limit) waits. At 100
    # alice's A (1 GPU, runs 50) starts on GPU 0 (X ended at 40). At 200 the window closes:
    # Z starts. Without the reservation Z starts at 0.
    config = tmp_path / "cluster.yaml"
    config.write_text(RESERVED)
    jobs = [
        JobSpec("Y", 0, 2, user="bob", duration_s=300, time_limit_s=500),
        JobSpec("X", 0, 1, user="bob", duration_s=40, time_limit_s=50),
        JobSpec("Z", 0, 1, user="bob", duration_s=30),
        JobSpec("A", 100, 1, user="alice", duration_s=50),
    ]
    trace = tmp_path / "t.corral.jsonl"
    trace.write_text(
        "".join(json.dumps(line) + "\n" for line in [header_record(0.0), *map(job_record, jobs)])
    )
    common = ("--placement", "any", "--backfill", "greedy", "--admission", "none")
    rows = simulate(trace, tmp_path / "res", *common, "--config", str(config))
    assert {j: float(r["first_start_s"]) for j, r in rows.items()} == {
        "Y": 0,
        "X": 0,
        "A": 100,
        "Z": 200,
    }
    rows = simulate(trace, tmp_path / "free", *common, "--cluster", "1x4")
    assert float(rows["Z"]["first_start_s"]) == 0
