from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.core.job import Job, JobSpec, JobStatus
from corral.sim.metrics import (
    JOB_COLUMNS,
    job_rows,
    summarize,
    utilization,
    utilization_while_waiting,
)
from corral.sim.report import write_outputs
from corral.sim.result import SimResult, Timeline
from corral.sim.streamed import StreamedOutput


def make_job(
    job_id: str,
    submit: float,
    *,
    status: JobStatus = JobStatus.SUCCEEDED,
    start: float | None = None,
    finish: float | None = None,
    pending_s: float = 0.0,
    gpus: int = 1,
    relaxed: bool = False,
) -> Job:
    job = Job(spec=JobSpec(id=job_id, submit_time=submit, gpus=gpus, user="u", vc="vc1"))
    job.status = status
    job.first_started_at = start
    job.finished_at = finish
    job.pending_s = pending_s
    job.relaxed = relaxed
    return job


def make_result(
    jobs: list[Job],
    *,
    measured: set[str] | None = None,
    timeline: Timeline | None = None,
    total_gpus: int = 8,
) -> SimResult:
    return SimResult(
        policy="fifo",
        placement="consolidated",
        cluster="1x8",
        total_gpus=total_gpus,
        jobs=jobs,
        measured=measured,
        timeline=timeline or Timeline(),
        preemptions=3,
        rounds=42,
        wall_s=1.5,
        options={"seed": 7},
    )


def three_jobs() -> list[Job]:
    # JCTs 10, 20, 60; queueing 1, 2, 3; pending 1, 2, 9; the last finishes at 70.
    return [
        make_job("a", 0.0, start=1.0, finish=10.0, pending_s=1.0),
        make_job("b", 5.0, start=7.0, finish=25.0, pending_s=2.0),
        make_job("c", 10.0, start=13.0, finish=70.0, pending_s=9.0, relaxed=True),
    ]


def test_jct_percentiles_queue_and_makespan() -> None:
    summary = summarize(make_result(three_jobs()))
    assert summary["jobs"] == 3
    assert summary["failed"] == 0
    assert summary["unfinished"] == 0
    assert summary["avg_jct_s"] == pytest.approx(30.0)
    assert summary["p50_jct_s"] == pytest.approx(20.0)
    # numpy linear: rank 0.95 * 2 = 1.9 -> 20 + 0.9 * (60 - 20)
    assert summary["p95_jct_s"] == pytest.approx(56.0)
    assert summary["p99_jct_s"] == pytest.approx(59.2)
    assert summary["avg_queue_s"] == pytest.approx(2.0)
    assert summary["avg_pending_s"] == pytest.approx(4.0)
    assert summary["makespan_s"] == pytest.approx(70.0)
    assert summary["relaxed_jobs"] == 1


def test_run_fields_are_copied() -> None:
    summary = summarize(make_result(three_jobs()))
    assert summary["policy"] == "fifo"
    assert summary["placement"] == "consolidated"
    assert summary["cluster"] == "1x8"
    assert summary["preemptions"] == 3
    assert summary["rounds"] == 42
    assert summary["wall_s"] == 1.5
    assert summary["options"] == {"seed": 7}


def test_utilization_is_time_weighted() -> None:
    # 4 of 8 GPUs for 10 s, then none for 10 s.
    timeline = Timeline(
        time_s=[0.0, 10.0, 20.0],
        allocated_gpus=[4, 0, 0],
        pending_jobs=[0, 0, 0],
        running_jobs=[1, 0, 0],
    )
    assert utilization(timeline, 8) == pytest.approx(0.25)
    assert summarize(make_result([], timeline=timeline))["utilization"] == pytest.approx(0.25)


def test_utilization_uneven_steps_and_offset_start() -> None:
    # 8 GPUs for 1 s, 2 GPUs for 3 s, starting at t=100: (8 + 6) / (8 * 4)
    timeline = Timeline(
        time_s=[100.0, 101.0, 104.0],
        allocated_gpus=[8, 2, 5],
        pending_jobs=[0, 0, 0],
        running_jobs=[0, 0, 0],
    )
    assert utilization(timeline, 8) == pytest.approx(14 / 32)


def test_utilization_while_waiting_counts_only_instants_with_a_waiting_job() -> None:
    # [0,10): 6 of 8 GPUs, 2 jobs waiting; [10,30): 8 GPUs, 1 waiting; [30,130): 1 GPU, none
    # waiting (a long tail). While waiting: (6*10 + 8*20) / (8 * 30) = 220/240; over the whole
    # run: (60 + 160 + 100) / (8 * 130) = 320/1040.
    timeline = Timeline(
        time_s=[0.0, 10.0, 30.0, 130.0],
        allocated_gpus=[6, 8, 1, 0],
        pending_jobs=[2, 1, 0, 0],
        running_jobs=[3, 4, 1, 0],
    )
    assert utilization_while_waiting(timeline, 8) == pytest.approx(220 / 240)
    assert utilization(timeline, 8) == pytest.approx(320 / 1040)
    never = Timeline(
        time_s=[0.0, 5.0], allocated_gpus=[2, 0], pending_jobs=[0, 0], running_jobs=[1, 0]
    )
    assert utilization_while_waiting(never, 8) is None


@pytest.mark.parametrize("times", [[], [5.0]])
def test_utilization_zero_span(times: list[float]) -> None:
    n = len(times)
    timeline = Timeline(
        time_s=times, allocated_gpus=[8] * n, pending_jobs=[0] * n, running_jobs=[0] * n
    )
    assert utilization(timeline, 8) == 0.0


def test_measured_subset_excludes_others_but_makespan_covers_all() -> None:
    jobs = [
        *three_jobs(),
        make_job("warmup", 0.0, start=0.0, finish=5000.0, pending_s=100.0),
        make_job("lost", 1.0, status=JobStatus.FAILED, start=2.0, finish=3.0),
    ]
    summary = summarize(make_result(jobs, measured={"a", "b", "c", "lost"}))
    assert summary["jobs"] == 3
    assert summary["failed"] == 1
    assert summary["avg_jct_s"] == pytest.approx(30.0)
    # queueing over the four measured jobs that started: 1, 2, 3, 1
    assert summary["avg_queue_s"] == pytest.approx(7 / 4)
    assert summary["avg_pending_s"] == pytest.approx(12 / 4)
    assert summary["makespan_s"] == pytest.approx(5000.0)


def test_failed_and_unfinished_jobs() -> None:
    jobs = [
        make_job("ok", 0.0, start=0.0, finish=10.0),
        make_job("bad", 0.0, status=JobStatus.FAILED, start=1.0, finish=4.0),
        make_job("run", 0.0, status=JobStatus.RUNNING, start=5.0),
        make_job("wait", 0.0, status=JobStatus.PENDING, pending_s=50.0),
    ]
    summary = summarize(make_result(jobs))
    assert (summary["jobs"], summary["failed"], summary["unfinished"]) == (1, 1, 2)
    assert summary["avg_jct_s"] == pytest.approx(10.0)  # successes only
    assert summary["avg_queue_s"] == pytest.approx(2.0)  # (0 + 1 + 5) / 3 started jobs
    assert summary["makespan_s"] == pytest.approx(10.0)


def test_empty_and_unsuccessful_runs_do_not_crash() -> None:
    empty = summarize(make_result([]))
    assert empty["jobs"] == 0
    assert empty["avg_jct_s"] is None
    assert empty["p99_jct_s"] is None
    assert empty["avg_queue_s"] is None
    assert empty["makespan_s"] is None
    assert empty["utilization"] == 0.0
    json.dumps(empty, allow_nan=False)

    none_done = summarize(make_result([make_job("x", 0.0, status=JobStatus.PENDING)]))
    assert none_done["jobs"] == 0
    assert none_done["unfinished"] == 1
    assert none_done["avg_jct_s"] is None
    assert none_done["p50_jct_s"] is None


def test_summary_is_plain_json() -> None:
    timeline = Timeline(
        time_s=[0.0, 10.0], allocated_gpus=[3, 0], pending_jobs=[1, 0], running_jobs=[1, 0]
    )
    summary = summarize(make_result(three_jobs(), timeline=timeline))
    for key, value in summary.items():
        if key == "per_vc":
            values = [v for vc in value.values() for v in vc.values()]
        elif key != "options":
            values = [value]
        else:
            continue
        for item in values:
            assert type(item) in (int, float, str, type(None)), key
    assert json.loads(json.dumps(summary, allow_nan=False)) == summary


def test_job_rows() -> None:
    jobs = [
        make_job("a", 0.0, start=1.0, finish=10.0, pending_s=1.0, gpus=4, relaxed=True),
        make_job("p", 2.0, status=JobStatus.PENDING, pending_s=8.0),
        make_job("f", 3.0, status=JobStatus.FAILED, start=4.0, finish=6.0),
    ]
    jobs[0].attempts, jobs[0].preemptions, jobs[0].failures = 2, 1, 0
    rows = job_rows(make_result(jobs, measured={"a", "f"}))
    assert len(rows) == 3
    assert all(tuple(row) == JOB_COLUMNS for row in rows)
    assert rows[0] == {
        "job_id": "a",
        "user": "u",
        "vc": "vc1",
        "gpus": 4,
        "model": "",
        "submit_s": 0.0,
        "first_start_s": 1.0,
        "finish_s": 10.0,
        "jct_s": 10.0,
        "queue_s": 1.0,
        "pending_s": 1.0,
        "status": "SUCCEEDED",
        "attempts": 2,
        "preemptions": 1,
        "failures": 0,
        "relaxed": True,
        "measured": True,
    }
    assert rows[1]["first_start_s"] is None
    assert rows[1]["jct_s"] is None and rows[1]["queue_s"] is None
    assert rows[1]["measured"] is False
    assert rows[2]["finish_s"] == 6.0 and rows[2]["jct_s"] is None  # JCT is for successes
    assert rows[2]["status"] == "FAILED"


def rows_jobs() -> list[Job]:
    jobs = [
        make_job("a", 0.0, start=1.0, finish=10.0, pending_s=1.0, gpus=4, relaxed=True),
        make_job("p", 2.0, status=JobStatus.PENDING, pending_s=8.0),
        make_job("f", 3.0, status=JobStatus.FAILED, start=4.0, finish=6.0),
    ]
    jobs[0].attempts, jobs[0].preemptions, jobs[0].failures = 2, 1, 0
    return jobs


# The rows of `rows_jobs`, as csv writes them: floats by repr, None as an empty cell (p never
# started: no start, finish, JCT or queueing; f failed: no JCT), lines ended by CRLF.
HEADER = ",".join(JOB_COLUMNS)
A_ROW = "a,u,vc1,4,,0.0,1.0,10.0,10.0,1.0,1.0,SUCCEEDED,2,1,0,True,{}"
P_ROW = "p,u,vc1,1,,2.0,,,,,8.0,PENDING,0,0,0,False,{}"
F_ROW = "f,u,vc1,1,,3.0,4.0,6.0,,1.0,0.0,FAILED,0,0,0,False,{}"


def test_the_jobs_csv_is_written_cell_by_cell_as_worked_out(tmp_path: Path) -> None:
    write_outputs([make_result(rows_jobs(), measured={"a", "f"})], tmp_path, plot=False)
    text = (tmp_path / "jobs-fifo-consolidated.csv").read_bytes().decode()
    rows = [A_ROW.format(True), P_ROW.format(False), F_ROW.format(True)]
    assert text == "".join(line + "\r\n" for line in [HEADER, *rows])


def test_a_streamed_jobs_csv_is_written_as_a_whole_runs(tmp_path: Path) -> None:
    # A streamed run measures every job; its rows come in the order jobs end (here f, a, p).
    a, p, f = rows_jobs()
    with StreamedOutput(tmp_path / "jobs.csv", None, []) as out:
        out.job_ended(f)
        out.job_ended(a)
        stats = out.finish([p])
    text = (tmp_path / "jobs.csv").read_bytes().decode()
    rows = [F_ROW.format(True), A_ROW.format(True), P_ROW.format(True)]
    assert text == "".join(line + "\r\n" for line in [HEADER, *rows])
    assert (stats.jobs, stats.succeeded, stats.failed, stats.unfinished) == (3, 1, 1, 1)


def test_per_vc_groups_jobs_and_fragmentation_counts_stranded_free_gpus() -> None:
    from corral.core.job import Priority

    jobs = [
        make_job("a", 0.0, start=10.0, finish=20.0, gpus=4),
        make_job("b", 0.0, start=30.0, finish=40.0, gpus=1),
    ]
    jobs[0].attained_gpu_s, jobs[1].attained_gpu_s = 40.0, 10.0
    spec = jobs[1].spec
    jobs[1].spec = type(spec)(
        id=spec.id,
        submit_time=spec.submit_time,
        gpus=spec.gpus,
        vc="other",
        priority=Priority.OPPORTUNISTIC,
        duration_s=10.0,
    )
    # 8 GPUs: 10 s with 4 free of which 3 stranded, then 10 s with 8 free, none stranded.
    timeline = Timeline(
        time_s=[0.0, 10.0, 20.0],
        allocated_gpus=[4, 0, 0],
        pending_jobs=[0, 0, 0],
        running_jobs=[1, 0, 0],
        stranded_gpus=[3, 0, 0],
    )
    summary = summarize(make_result(jobs, timeline=timeline))
    per_vc = summary["per_vc"]
    assert set(per_vc) == {"vc1", "opportunistic"}
    assert per_vc["vc1"]["avg_queue_s"] == 10.0 and per_vc["vc1"]["multi_gpu_avg_queue_s"] == 10.0
    assert per_vc["opportunistic"]["multi_gpu_avg_queue_s"] is None
    assert per_vc["vc1"]["gpu_share"] == 0.8 and per_vc["opportunistic"]["gpu_share"] == 0.2
    # stranded GPU-seconds 3 x 10 = 30 over free GPU-seconds 4 x 10 + 8 x 10 = 120
    assert summary["fragmentation"] == 0.25
