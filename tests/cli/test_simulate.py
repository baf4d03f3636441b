"""`corral simulate` end to end, as a user runs it."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from corral.cli.main import app

HEADER = "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"


def write_trace(path: Path, rows: list[str]) -> Path:
    path.write_text(HEADER + "".join(row + "\n" for row in rows))
    return path


@pytest.fixture
def small_trace(tmp_path: Path) -> Path:
    # A long 4-GPU job first, then short jobs that queue behind it on a 1x4 cluster.
    rows = [
        "0,4,0,100,resnet50,1000,0",
        "1,4,10,10,resnet50,50,10",
        "2,2,20,10,vgg16,30,10",
        "3,1,30,10,alexnet,20,10",
    ]
    return write_trace(tmp_path / "jobs.csv", rows)


def test_compare_writes_summary_csv_and_plots(small_trace: Path, tmp_path: Path):
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "--trace",
            f"tiresias:{small_trace}",
            "--cluster",
            "1x4",
            "--compare",
            "fifo,las,srtf",
            "--restore-s",
            "0",
            "--out",
            str(out),
            "--plot",
        ],
    )
    assert result.exit_code == 0, result.output
    runs = json.loads((out / "summary.json").read_text())["runs"]
    assert [r["policy"] for r in runs] == ["fifo", "las", "srtf"]
    assert not list(out.glob("decisions-*"))  # only with --decisions (they cost memory)
    for run in runs:
        for key in (
            "policy",
            "placement",
            "jobs",
            "avg_jct_s",
            "p50_jct_s",
            "p95_jct_s",
            "p99_jct_s",
            "avg_queue_s",
            "makespan_s",
            "utilization",
            "preemptions",
        ):
            assert key in run
        assert run["jobs"] == 4
    by_policy = {r["policy"]: r for r in runs}
    # fifo: job 0 runs 0..1000, then 1 (1000..1050), 2 and 3 together (1050..1080, 1050..1070).
    # JCTs: 1000, 1040, 1060, 1040 -> average 1035.
    assert by_policy["fifo"]["avg_jct_s"] == pytest.approx(1035)
    assert by_policy["fifo"]["preemptions"] == 0
    # srtf preempts the long job for each short one: they finish much sooner on average.
    assert by_policy["srtf"]["avg_jct_s"] < by_policy["fifo"]["avg_jct_s"] / 2
    for name in ("jct_cdf.png", "utilization.png", "queue.png"):
        assert (out / name).stat().st_size > 1000
    assert (out / "jobs-fifo-relax.csv").read_text().count("\n") == 5
    assert "avg" in result.output.lower() or "Avg" in result.output


def test_job_larger_than_cluster_is_refused_with_one_line(tmp_path: Path):
    trace = write_trace(tmp_path / "big.csv", ["0,1,0,1,resnet50,10,0", "1,16,5,1,resnet50,10,0"])
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "corral.cli",
            "simulate",
            "--trace",
            f"tiresias:{trace}",
            "--cluster",
            "1x8",
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "big.csv" in lines[0] and "job 1" in lines[0] and "gpus=16" in lines[0]
    assert not (tmp_path / "o" / "summary.json").exists()
    skipped = CliRunner().invoke(
        app,
        [
            "simulate",
            "--trace",
            f"tiresias:{trace}",
            "--cluster",
            "1x8",
            "--skip-oversized",
            "--out",
            str(tmp_path / "o"),
        ],
    )
    assert skipped.exit_code == 0, skipped.output
    assert "1 job on 1 node (1x8 v100), 8 GPUs, 1 rack; dropped 1 job larger than the cluster" in (
        skipped.output
    )


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--cluster", "8by8"], "--cluster"),
        (["--policy", "lottery"], "unknown policy 'lottery'"),
        (["--placement", "nowhere"], "unknown placement 'nowhere'"),
        (["--window", "5:2"], "--window"),
        (["--las-thresholds-gpu-s", "a,b"], "--las-thresholds-gpu-s: must be a finite number"),
        (["--las-thresholds-gpu-s", "9,3"], "--las-* options: thresholds_gpu_s must be strictly"),
        (["--relax-after-s", "-1"], "--relax-after-s: must be >= 0, got -1.0"),
        (["--stages", "packing,defrag"], "--stages: unknown stage 'defrag'"),
        (
            ["--admission", "quota", "--stages", "packing"],
            "admission quota does not run with packing",
        ),
        (
            ["--placement", "hetero", "--hetero-fairness", "1.5"],
            "--hetero-fairness: must be in (0, 1], got 1.5",
        ),
        (["--policy", "elasticflow", "--deadline-factor", "2:1"], "--deadline-factor"),
        (
            ["--policy", "timeslice", "--timeslice-quantum-s", "0"],
            "--timeslice-quantum-s: must be > 0",
        ),
        (["--precheck-s", "-1"], "--precheck-s: must be >= 0, got -1.0"),
        (["--precheck-report-s", "0"], "--precheck-report-s: must be positive"),
    ],
)
def test_bad_options_exit_non_zero_with_a_clear_message(
    small_trace: Path, tmp_path: Path, args, needle
):
    result = CliRunner().invoke(
        app, ["simulate", "--trace", f"tiresias:{small_trace}", "--out", str(tmp_path / "o"), *args]
    )
    assert result.exit_code == 2
    assert needle in result.output


def test_precheck_runs_a_pre_run_for_every_job_of_more_than_one_worker(
    small_trace: Path, tmp_path: Path
):
    # Jobs 0 and 1 (4 GPUs) and 2 (2 GPUs) each run a pre-run on one GPU first; job 3 (1 GPU)
    # cannot. Every pre-run passes (no failures), and every job still succeeds.
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "--trace",
            f"tiresias:{small_trace}",
            "--cluster",
            "1x4",
            "--policy",
            "fifo",
            "--precheck-s",
            "300",
            "--precheck-report-s",
            "5",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    (run,) = json.loads((out / "summary.json").read_text())["runs"]
    assert (run["prechecks"], run["precheck_passed"], run["precheck_failed"]) == (3, 3, 0)
    assert run["jobs"] == 4 and run["options"]["scheduler"]["precheck_s"] == 300.0
    assert run["options"]["precheck_report_s"] == 5.0
    assert "3 pre-runs, 3 passed, 0 failed" in result.output


def test_malformed_trace_names_file_line_and_field(tmp_path: Path):
    trace = write_trace(tmp_path / "bad.csv", ["0,1,0,1,resnet50,10,0", "1,two,5,1,resnet50,10,0"])
    result = CliRunner().invoke(
        app, ["simulate", "--trace", f"tiresias:{trace}", "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 2
    assert "bad.csv" in result.output and "line 3" in result.output and "num_gpu" in result.output


def test_a_corral_trace_runs_on_its_nodes_at_its_measured_speeds(tmp_path: Path):
    """The trace's nodes are the cluster, its throughput table the speeds (`Profiles`, as live);
    `--throughputs` replaces the table, `--config` the nodes; every start and preemption is in
    decisions-<policy>-<placement>.jsonl, GPUs named as the live manager names them."""
    fast = {"('bert', 2)": {"null": 8.0}}
    (tmp_path / "t.json").write_text(
        json.dumps({"a100": fast, "v100": {"('bert', 2)": {"null": 2.0}}})
    )
    trace = tmp_path / "h.corral.jsonl"
    trace.write_text(
        '{"kind": "trace", "version": 1, "throughputs": "t.json"}\n'
        '{"kind": "node", "name": "v1", "gpus": 2, "gpu_type": "v100"}\n'
        '{"kind": "node", "name": "a1", "gpus": 2, "gpu_type": "a100"}\n'
        '{"kind": "job", "id": "1", "submit_time": 0, "gpus": 2, "duration_s": 100, "model": "bert"}\n'
        '{"kind": "job", "id": "2", "submit_time": 1, "gpus": 2, "duration_s": 100, "model": "bert"}\n'
    )

    def run(*more: str) -> tuple[str, list[dict[str, object]], dict[str, str]]:
        out = tmp_path / f"out{len(more)}"
        args = [
            "simulate",
            "--trace",
            f"corral:{trace}",
            "--policy",
            "fifo",
            "--out",
            str(out),
            "--decisions",
        ]
        result = CliRunner().invoke(app, [*args, *more])
        assert result.exit_code == 0, result.output
        lines = (out / "decisions-fifo-relax.jsonl").read_text().splitlines()
        with (out / "jobs-fifo-relax.csv").open() as handle:
            finish = {row["job_id"]: row["finish_s"] for row in csv.DictReader(handle)}
        return result.output, [json.loads(line) for line in lines], finish

    output, decisions, finish = run()
    assert "2 nodes (1x2 a100, 1x2 v100), 4 GPUs" in output
    # The first job gets the type with the most free GPUs (a tie: by name), the second the other.
    assert decisions == [
        {"at": 0.0, "action": "start", "job": "1", "gpus": ["a1/0", "a1/1"], "resumed": False},
        {"at": 1.0, "action": "start", "job": "2", "gpus": ["v1/0", "v1/1"], "resumed": False},
    ]
    assert finish == {"1": "100.0", "2": "401.0"}  # on v100 at a quarter of a100's speed
    (tmp_path / "same.json").write_text(json.dumps({"a100": fast, "v100": fast}))
    _, _, finish = run("--throughputs", str(tmp_path / "same.json"))
    assert finish == {"1": "100.0", "2": "101.0"}
    config = tmp_path / "cluster.yaml"
    config.write_text(
        "cell_types:\n  NODE: {child: a100, count: 4, node: true}\n"
        "physical_cells:\n  - {type: NODE, names: [big]}\n"
    )
    output, decisions, _ = run("--config", str(config), "--admission", "none")
    assert "1 node (1x4 a100), 4 GPUs, 1 rack" in output
    assert decisions[1]["gpus"] == ["big/2", "big/3"]


def test_counts_of_one_are_printed_in_the_singular(tmp_path: Path):
    # One job of one GPU on one node of one GPU, under quota (one VC): every count printed is 1.
    runtimes = tmp_path / "runtimes.csv"
    runtimes.write_text("runtime\n600\n")
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "--trace",
            f"synthetic:jobs=1,gpus=1,max_gpus=1,runtimes={runtimes}",
            "--cluster",
            "1x1",
            "--admission",
            "quota",
            "--out",
            str(tmp_path / "out"),
        ],
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].endswith(": 1 job on 1 node (1x1 v100), 1 GPU, 1 rack, 1 VC, admission quota")
    assert lines[1].startswith("  note: 1 job, offered load 0.8 of 1 GPU, one job every 750.0s")
    assert lines[2] == "  note: job sizes capped at 1 GPU"
    runs = json.loads((tmp_path / "out" / "summary.json").read_text())["runs"]
    assert runs[0]["cluster"] == "1 node (1x1 v100), 1 GPU, 1 rack" and runs[0]["jobs"] == 1
    trace = write_trace(tmp_path / "two.csv", ["0,2,0,1,resnet50,10,0"])
    refused = CliRunner().invoke(
        app,
        ["simulate", "--trace", f"tiresias:{trace}", "--cluster", "1x1", "--out", str(tmp_path)],
    )
    assert refused.exit_code == 2
    assert "gpus=2 exceeds the 1 GPU the cluster has for it;" in refused.output
