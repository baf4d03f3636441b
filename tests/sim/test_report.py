from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from corral.core.job import Job, JobSpec, JobStatus
from corral.sim.metrics import JOB_COLUMNS, summarize, utilization
from corral.sim.report import (
    downsample_step,
    format_duration,
    format_hours,
    summary_table,
    write_outputs,
)
from corral.sim.result import SimResult, Timeline

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
REQUIRED_KEYS = {
    "policy",
    "placement",
    "cluster",
    "jobs",
    "failed",
    "unfinished",
    "avg_jct_s",
    "p50_jct_s",
    "p95_jct_s",
    "p99_jct_s",
    "avg_queue_s",
    "avg_pending_s",
    "makespan_s",
    "utilization",
    "preemptions",
    "relaxed_jobs",
    "rounds",
    "wall_s",
    "options",
}


def make_job(job_id: str, submit: float, start: float | None, finish: float | None) -> Job:
    job = Job(spec=JobSpec(id=job_id, submit_time=submit, gpus=2))
    job.first_started_at = start
    job.finished_at = finish
    if finish is not None:
        job.status = JobStatus.SUCCEEDED
    elif start is not None:
        job.status = JobStatus.RUNNING
    return job


def make_result(policy: str, n_jobs: int = 5, scale: float = 1.0) -> SimResult:
    jobs = [
        make_job(f"j{i}", 600.0 * i, 600.0 * i + 60.0, 600.0 * i + 3600.0 * scale * (i + 1))
        for i in range(n_jobs)
    ]
    jobs.append(make_job("late", 10.0, None, None))
    timeline = Timeline()
    for k in range(50):
        t = 900.0 * k
        timeline.record(t, allocated=k % 9, pending=(k * 7) % 5, running=k % 4)
    return SimResult(
        policy=policy,
        placement="consolidated",
        cluster="2x4",
        total_gpus=8,
        jobs=jobs,
        measured=None,
        timeline=timeline,
        preemptions=1,
        rounds=50,
        wall_s=0.25,
        options={"path": Path("/tmp/trace.csv")},
    )


def test_write_outputs_files(tmp_path: Path) -> None:
    results = [make_result("fifo"), make_result("las", n_jobs=8, scale=0.5)]
    out_dir = tmp_path / "out" / "nested"
    summaries = write_outputs(results, out_dir, plot=True)

    data = json.loads((out_dir / "summary.json").read_text())
    assert len(data["runs"]) == 2
    for run in data["runs"]:
        assert REQUIRED_KEYS <= set(run)
    assert data["runs"][0]["options"] == {"path": "/tmp/trace.csv"}
    assert [s["policy"] for s in summaries] == ["fifo", "las"]
    assert summaries[1]["jobs"] == 8

    for name, expected_rows in (
        ("jobs-fifo-consolidated.csv", 6),
        ("jobs-las-consolidated.csv", 9),
    ):
        with (out_dir / name).open(newline="") as handle:
            reader = csv.reader(handle)
            header = next(reader)
            rows = list(reader)
        assert tuple(header) == JOB_COLUMNS
        assert len(rows) == expected_rows

    for name in ("jct_cdf.png", "utilization.png", "queue.png"):
        payload = (out_dir / name).read_bytes()
        assert payload.startswith(PNG_SIGNATURE), name
        assert len(payload) > 10_000, name


def test_write_outputs_without_plots(tmp_path: Path) -> None:
    write_outputs([make_result("fifo")], tmp_path, plot=False)
    assert (tmp_path / "summary.json").exists()
    assert not list(tmp_path.glob("*.png"))


def test_same_policy_twice_gets_two_csvs(tmp_path: Path) -> None:
    write_outputs([make_result("fifo"), make_result("fifo")], tmp_path, plot=False)
    assert sorted(p.name for p in tmp_path.glob("*.csv")) == [
        "jobs-fifo-consolidated-2.csv",
        "jobs-fifo-consolidated.csv",
    ]


def test_plots_survive_runs_without_data(tmp_path: Path) -> None:
    empty = SimResult(
        policy="fifo",
        placement="any",
        cluster="",
        total_gpus=0,
        jobs=[],
        measured=None,
        timeline=Timeline(),
        preemptions=0,
        rounds=0,
        wall_s=0.0,
    )
    summaries = write_outputs([empty], tmp_path, plot=True)
    assert summaries[0]["avg_jct_s"] is None
    assert (tmp_path / "jct_cdf.png").read_bytes().startswith(PNG_SIGNATURE)


def big_timeline(points: int = 500_000) -> Timeline:
    rng = np.random.default_rng(1)
    times = np.cumsum(rng.exponential(30.0, size=points))
    # Bursty load: a slow wave plus noise, clipped to the 512-GPU cluster.
    wave = 256 + 200 * np.sin(times / 50_000.0)
    allocated = np.clip(wave + rng.normal(0, 60, size=points), 0, 512).astype(int)
    pending = rng.poisson(20, size=points)
    return Timeline(
        time_s=times.tolist(),
        allocated_gpus=allocated.tolist(),
        pending_jobs=pending.tolist(),
        running_jobs=[0] * points,
    )


def test_downsampling_keeps_time_weighted_mean() -> None:
    timeline = big_timeline()
    exact = utilization(timeline, 512)
    times, allocated = downsample_step(timeline.time_s, timeline.allocated_gpus)
    assert len(times) == len(allocated) <= 2000
    assert times[0] == timeline.time_s[0] and times[-1] == timeline.time_s[-1]
    reduced = Timeline(time_s=list(times), allocated_gpus=list(allocated))
    assert utilization(reduced, 512) == pytest.approx(exact, rel=0.01)
    assert allocated.min() >= 0 and allocated.max() <= 512


def test_downsampling_leaves_short_series_alone() -> None:
    times, values = downsample_step([0.0, 1.0, 5.0], [3, 1, 0])
    assert times.tolist() == [0.0, 1.0, 5.0]
    assert values.tolist() == [3.0, 1.0, 0.0]


def test_big_timeline_plots_stay_small(tmp_path: Path) -> None:
    result = make_result("fifo")
    result.timeline = big_timeline()
    result.total_gpus = 512
    write_outputs([result], tmp_path, plot=True)
    for name in ("utilization.png", "queue.png"):
        assert (tmp_path / name).stat().st_size < 1_000_000


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (float("nan"), "-"),
        (0, "0s"),
        (0.5, "0.5s"),
        (12, "12s"),
        (59.7, "1.0m"),
        (270, "4.5m"),
        (45 * 60, "45m"),
        (3.2 * 3600, "3.2h"),
        (3 * 86400, "3.0d"),
        (-90, "-1.5m"),
    ],
)
def test_format_duration(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (float("nan"), "-"),
        (0, "0.0"),
        (12, "0.003"),  # 12 s = 0.00333 h
        (1.5, "<0.001"),  # not zero: 0.0004 h
        (270, "0.075"),  # 4.5 min
        (45 * 60, "0.75"),
        (3.2 * 3600, "3.2"),
        (3 * 86400, "72.0"),  # three days are 72 h, not '3.0d'
        (561.8 * 3600, "561.8"),
        (-90, "-0.025"),
    ],
)
def test_format_hours(seconds: float | None, text: str) -> None:
    assert format_hours(seconds) == text


def table_lines(text: str, header: str) -> dict[str, list[str]]:
    """The rows of a printed table by their first cell, split on runs of two or more spaces."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if header in line)
    rows = {}
    for line in lines[start + 1 :]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) > 3:
            rows[cells[0]] = cells[1:]
    return rows


def test_summary_table() -> None:
    summaries = [summarize(make_result("fifo")), summarize(make_result("las", scale=0.5))]
    table = summary_table(summaries)
    # policy/placement, jobs, four JCT columns, queueing, pending, makespan, utilisation (all
    # and while jobs wait), preemptions
    assert len(table.columns) == 12
    assert table.row_count == 2
    console = Console(record=True, width=250)
    console.print(table)
    text = console.export_text()
    headers = [str(column.header) for column in table.columns]
    assert headers[2:9] == [
        "avg JCT",
        "p50 JCT",
        "p95 JCT",
        "p99 JCT",
        "avg queueing",
        "avg pending",
        "makespan",
    ]
    assert "Simulation summary (durations in hours)" in text
    rows = table_lines(text, "avg JCT")
    # fifo: JCTs 1h, 2h, ..., 5h -> mean 3.0, p50 3.0; las (scale 0.5): 0.5h..2.5h -> mean and
    # p50 1.5: every duration a bare number of hours, none in minutes or days.
    assert rows["fifo/consolidated"][1:3] == ["3.0", "3.0"]
    assert rows["las/consolidated"][1:3] == ["1.5", "1.5"]
    # Each job first starts 60 s after its submission (queueing 60 s = 0.017 h) and never
    # waits again (pending 0): both printed, in hours.
    assert rows["fifo/consolidated"][5:7] == ["0.017", "0.0"]
    assert not re.search(r"\d[smd]\b", text)
    # The two waits are defined where they are printed.
    assert "queueing: from submission to the first start" in text
    assert "pending: all the time spent waiting, including after each preemption" in text
    util = summaries[0]["utilization"]
    assert isinstance(util, float)
    assert f"{100 * util:.1f}%" in text


def test_summary_table_handles_missing_values() -> None:
    summary = summarize(
        SimResult(
            policy="fifo",
            placement="any",
            cluster="",
            total_gpus=8,
            jobs=[],
            measured=None,
            timeline=Timeline(),
            preemptions=0,
            rounds=0,
            wall_s=0.0,
        )
    )
    console = Console(record=True, width=200)
    console.print(summary_table([summary]))
    assert "0.0%" in console.export_text()
