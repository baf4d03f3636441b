"""`corral fgd` (a thin alias of `corral simulate` on an openb trace, medians over arrival
orders) end to end on a small openb-style cluster written here."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from corral.cli.main import app

NODES = """sn,cpu_milli,memory_mib,gpu,model
n0,32000,131072,2,T4
n1,64000,262144,4,V100M16
n2,96000,393216,8,G2
"""
TASKS_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
TASKS = [
    "p0,8000,16384,1,1000,",
    "p1,4000,8192,1,500,",
    "p2,4000,8192,1,250,V100M16|V100M32",
    "p3,2000,4096,0,0,",
    "p4,16000,65536,4,1000,",
    "p5,4000,8192,1,700,",
]


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODES)
    tasks = tmp_path / "pods.csv"
    tasks.write_text(TASKS_HEADER + "".join(row + "\n" for row in TASKS))
    return nodes, tasks


def invoke(*args: str):
    return CliRunner().invoke(app, ["fgd", *args])


def test_fgd_writes_summary_curves_and_plot(files: tuple[Path, Path], tmp_path: Path):
    nodes, tasks = files
    out = tmp_path / "out"
    result = invoke(
        "--nodes", str(nodes), "--tasks", str(tasks), "--policies", "fgd,best-fit,gpu-packing",
        "--repeats", "2", "--out", str(out), "--plot",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["gpus"] == 14 and summary["nodes"] == 3 and summary["trace_tasks"] == 6
    assert [run["policy"] for run in summary["runs"]] == ["fgd", "best-fit", "gpu-packing"]
    assert len(summary["workload_types"]) == 6  # every task has its own shape
    with (out / "curves.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    # 131 grid points (0%..130% by 1%) per policy; the first point is the empty cluster.
    assert len(rows) == 3 * 131
    assert rows[0]["arrived_share"] == "0.0" and float(rows[0]["allocated_share"]) == 0.0
    assert (out / "fgd.png").stat().st_size > 0
    assert "GPU-sharing placement" in result.output and "fgd" in result.output


def test_fgd_in_workers_writes_what_it_writes_one_run_at_a_time(files, tmp_path: Path):
    # 3 placements x 2 orders = 6 runs in 3 worker processes; random-fit draws from each
    # run's seed, so a run that took another's seed or order would show in its curves.
    nodes, tasks = files
    written = {}
    for workers in ("1", "3"):
        out = tmp_path / workers
        result = invoke(
            "--nodes", str(nodes), "--tasks", str(tasks), "--policies",
            "fgd,random-fit,gpu-packing", "--repeats", "2", "--workers", workers, "--out", str(out),
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        summary = json.loads((out / "summary.json").read_text())
        for run in summary["runs"]:
            run.pop("seconds", None)
        written[workers] = summary, (out / "curves.csv").read_text()
    assert written["3"] == written["1"]
    assert "workers" not in written["1"][0]["settings"]


def test_fgd_without_plot_writes_no_png(files: tuple[Path, Path], tmp_path: Path):
    nodes, tasks = files
    out = tmp_path / "out"
    result = invoke(
        "--nodes", str(nodes), "--tasks", str(tasks), "--policies", "random-fit",
        "--repeats", "1", "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (out / "summary.json").exists() and not (out / "fgd.png").exists()


def test_malformed_task_file_exits_2_with_one_line(files: tuple[Path, Path], tmp_path: Path):
    nodes, _ = files
    bad = tmp_path / "bad.csv"
    bad.write_text(TASKS_HEADER + "p0,8000,16384,1,1000,\np1,4000,8192,1,1200,\n")
    result = invoke("--nodes", str(nodes), "--tasks", str(bad), "--out", str(tmp_path / "o"))
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert "bad.csv" in lines[0] and "line 3" in lines[0] and "gpu_milli" in lines[0]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--policies", "fgd,tetris"], "unknown placement 'tetris'"),
        (["--policies", "relax"], "unknown placement 'relax' for jobs that share GPUs"),
        (["--repeats", "0"], "--repeats"),
        (["--target-load", "0"], "--target-load"),
        (["--coverage", "1.5"], "--coverage"),
        (["--workers", "-1"], "--workers: must not be negative"),
    ],
)
def test_bad_options_exit_2(files: tuple[Path, Path], tmp_path: Path, args, needle):
    nodes, tasks = files
    result = invoke("--nodes", str(nodes), "--tasks", str(tasks), "--out", str(tmp_path), *args)
    assert result.exit_code == 2
    assert needle in result.output


def test_missing_node_file_exits_2(files: tuple[Path, Path], tmp_path: Path):
    _, tasks = files
    result = invoke("--nodes", str(tmp_path / "nope.csv"), "--tasks", str(tasks))
    assert result.exit_code == 2
    assert "nope.csv: no such file" in result.output
