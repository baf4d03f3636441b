"""A streamed run: jobs read from an iterator as they arrive, results handed out as jobs end
and then dropped, and a timeline kept as sums; worked out by hand on a 2-GPU node."""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from corral.core import Cluster, JobSpec, Scheduler
from corral.core.placement import make_placement
from corral.core.policy import make_policy
from corral.sim.engine import Simulation
from corral.sim.metrics import fragmentation, utilization, utilization_while_waiting
from corral.sim.result import TimelineTotals
from corral.sim.runner import RunSettings, SimulationError, run_simulations


def spec(job_id: str, gpus: int, submit: float, duration: float) -> JobSpec:
    return JobSpec(id=job_id, submit_time=submit, gpus=gpus, duration_s=duration)


def trace() -> Iterator[JobSpec]:
    # a holds both GPUs over 0..100; b (1 GPU) arrives at 50, waits, and runs 100..160.
    yield spec("a", 2, 0, 100)
    yield spec("b", 1, 50, 60)


def scheduler() -> Scheduler:
    return Scheduler(Cluster.shorthand(1, 2), make_policy("fifo"), make_placement("consolidate"))


def test_a_streamed_run_hands_out_each_job_as_it_ends_and_keeps_none():
    ended: list[tuple[str, float | None, float]] = []
    core = scheduler()
    result = Simulation(
        trace(),
        core,
        keep_ended=False,
        on_end=lambda job: ended.append((job.id, job.finished_at, job.pending_s)),
    ).run()
    assert ended == [("a", 100.0, 0.0), ("b", 160.0, 50.0)]
    assert result.jobs == [] and core.jobs == {}


def test_timeline_totals_give_the_metrics_of_the_whole_timeline():
    totals = TimelineTotals(total_gpus=2)
    streamed = Simulation(trace(), scheduler(), timeline=totals).run()
    whole = Simulation(list(trace()), scheduler()).run()
    assert totals.time_s == [0.0, 160.0]  # the first and the last instant only
    # 2 GPUs over 0..100 and 1 over 100..160: 260 GPU-s of 2 x 160.
    assert utilization(streamed.timeline, 2) == pytest.approx(260 / 320)
    assert utilization(whole.timeline, 2) == pytest.approx(260 / 320)
    # b waits over 50..100, when both GPUs are in use.
    assert utilization_while_waiting(streamed.timeline, 2) == pytest.approx(1.0)
    assert utilization_while_waiting(whole.timeline, 2) == pytest.approx(1.0)
    # The only free GPU (100..160) sits on a node that is not wholly free: all stranded.
    assert fragmentation(streamed.timeline, 2) == pytest.approx(1.0)
    assert fragmentation(whole.timeline, 2) == pytest.approx(1.0)


def test_timeline_totals_move_the_last_point_and_sum_each_step_before_it():
    totals = TimelineTotals(total_gpus=4)
    points = [  # (now, allocated, pending, running, stranded)
        (0.0, 2, 1, 1, 0),
        (0.0, 1, 0, 1, 1),  # the same instant again: its values replace the first ones
        (10.0, 3, 2, 2, 1),  # 0..10 held 1 GPU (3 free, 1 stranded), none waiting
        (10.0, 2, 1, 2, 0),  # the same instant again: the last point's values replaced
        (30.0, 4, 0, 3, 0),  # 10..30 held 2 GPUs (2 free, none stranded), a job waiting
    ]
    seen = []
    for point in points:
        totals.record(*point)
        seen.append(
            (
                list(totals.time_s),
                list(totals.allocated_gpus),
                list(totals.pending_jobs),
                list(totals.running_jobs),
                list(totals.stranded_gpus),
            )
        )
    assert seen == [
        ([0.0], [2], [1], [1], [0]),
        ([0.0], [1], [0], [1], [1]),
        ([0.0, 10.0], [1, 3], [0, 2], [1, 2], [1, 1]),
        ([0.0, 10.0], [1, 2], [0, 1], [1, 2], [1, 0]),
        ([0.0, 30.0], [1, 4], [0, 0], [1, 3], [1, 0]),
    ]
    assert totals.allocated_gpu_s == 1 * 10 + 2 * 20
    assert totals.free_gpu_s == 3 * 10 + 2 * 20
    assert totals.stranded_gpu_s == 1 * 10 + 0 * 20
    assert totals.waiting_s == 20
    assert totals.allocated_waiting_gpu_s == 2 * 20


def test_a_stream_out_of_submission_order_is_refused():
    late_first = iter([spec("a", 1, 10, 5), spec("b", 1, 5, 5)])
    with pytest.raises(ValueError, match="job b: a streamed trace must be in submission order"):
        Simulation(late_first, scheduler()).run()


# -- `corral simulate --stream` ------------------------------------------------------------------

HEADER = "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"


def tiresias_file(path: Path, rows: list[str]) -> str:
    path.write_text(HEADER + "".join(row + "\n" for row in rows))
    return f"tiresias:{path}"


def simulate(tmp_path: Path, trace: str, *, stream: bool, **changes: object) -> list[dict]:
    settings = RunSettings(
        trace=trace,
        nodes=1,
        gpus_per_node=2,
        policies=["fifo"],
        spread_slowdown=False,
        stream=stream,
    )
    for name, value in changes.items():
        setattr(settings, name, value)
    out = tmp_path / ("streamed" if stream else "whole")
    return run_simulations(settings, out=out, plot=False, console=Console(quiet=True))


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_a_streamed_simulate_writes_each_job_as_it_ends_with_the_whole_runs_summary(tmp_path):
    # One node of 2 GPUs, fifo. a holds both over 0..100; b (1 GPU, at 50) and c (1 GPU, at
    # 60) wait and start at 100, c ends at 110, b at 160. Ends: a, c, b.
    trace = tiresias_file(tmp_path / "t.csv", ["a,2,0,,,100,", "b,1,50,,,60,", "c,1,60,,,10,"])
    (streamed,) = simulate(tmp_path, trace, stream=True)
    (whole,) = simulate(tmp_path, trace, stream=False)
    written = rows(tmp_path / "streamed" / "jobs-fifo-relax.csv")
    assert [row["job_id"] for row in written] == ["a", "c", "b"]  # in the order they ended
    assert [row["jct_s"] for row in written] == ["100.0", "50.0", "110.0"]
    assert [row["queue_s"] for row in written] == ["0.0", "40.0", "50.0"]
    assert streamed["avg_jct_s"] == pytest.approx(260 / 3)
    assert streamed["avg_queue_s"] == pytest.approx(30.0)
    assert streamed["makespan_s"] == 160.0 and streamed["jobs"] == 3
    # 2 GPUs over 0..100, 2 over 100..110, 1 over 110..160: 270 GPU-s of 2 x 160.
    assert streamed["utilization"] == pytest.approx(270 / 320)
    assert sorted(written, key=lambda row: row["job_id"]) == rows(
        tmp_path / "whole" / "jobs-fifo-relax.csv"
    )
    for key in ("jobs", "avg_jct_s", "p99_jct_s", "avg_queue_s", "makespan_s", "per_vc"):
        assert streamed[key] == whole[key], key


def test_a_streamed_run_decides_and_reports_as_a_whole_one(tmp_path):
    # A busy trace with preemptions and failed attempts: the same rows and decisions, and the
    # same summary up to the order of floating-point sums (jobs are added as they end).
    lines = []
    for i in range(120):
        gpus = (1, 2, 4, 8)[i % 4]
        lines.append(f"j{i},{gpus},{i * 90},,,{600 + (i * 7919) % 7200},")
    trace = tiresias_file(tmp_path / "busy.csv", lines)
    changes = dict(
        nodes=4, gpus_per_node=8, policies=["las"], decisions=True, failure_rate=0.05, seed=3
    )
    (streamed,) = simulate(tmp_path, trace, stream=True, **changes)
    (whole,) = simulate(tmp_path, trace, stream=False, **changes)
    assert whole["preemptions"] > 0 and whole["failed_attempts"] > 0  # the trace is busy
    for name in ("jobs-las-relax.csv", "decisions-las-relax.jsonl"):
        a = (tmp_path / "streamed" / name).read_text().splitlines()
        b = (tmp_path / "whole" / name).read_text().splitlines()
        assert a[0] == b[0] and sorted(a) == sorted(b), name
    decisions = tmp_path / "streamed" / "decisions-las-relax.jsonl"
    assert decisions.read_text() == (tmp_path / "whole" / "decisions-las-relax.jsonl").read_text()
    for key, value in whole.items():
        if key in ("wall_s", "options"):
            continue
        if isinstance(value, float):
            assert streamed[key] == pytest.approx(value, rel=1e-9), key
        elif key != "per_vc":
            assert streamed[key] == value, key


def test_a_streamed_trace_out_of_submission_order_is_refused_naming_its_line(tmp_path):
    trace = tiresias_file(tmp_path / "t.csv", ["a,1,10,,,5,", "b,1,5,,,5,"])
    with pytest.raises(SimulationError) as error:
        simulate(tmp_path, trace, stream=True)
    assert str(error.value) == (
        f"{tmp_path / 't.csv'}: line 3: submit_time: 5 is before the one at line 2 (10); a "
        "streamed trace must be in submission order (sort the file, or leave out --stream)"
    )


def test_a_streamed_trace_with_no_jobs_or_a_bad_field_is_refused_in_one_line(tmp_path):
    empty = tiresias_file(tmp_path / "empty.csv", [])
    with pytest.raises(SimulationError, match=r"empty\.csv: the trace has no jobs$"):
        simulate(tmp_path, empty, stream=True)
    bad = tiresias_file(tmp_path / "bad.csv", ["a,1,0,,,5,", "b,two,1,,,5,"])
    with pytest.raises(SimulationError, match=r"bad\.csv: line 3: num_gpu: must be a positive"):
        simulate(tmp_path, bad, stream=True)


def test_a_streamed_job_larger_than_the_cluster_is_refused_or_dropped(tmp_path):
    trace = tiresias_file(tmp_path / "t.csv", ["a,1,0,,,5,", "big,4,1,,,5,", "c,1,2,,,5,"])
    with pytest.raises(SimulationError, match=r"job big \(number 2 by arrival\): gpus=4 exceeds"):
        simulate(tmp_path, trace, stream=True)
    (summary,) = simulate(tmp_path, trace, stream=True, skip_oversized=True)
    assert summary["jobs"] == 2
    written = rows(tmp_path / "streamed" / "jobs-fifo-relax.csv")
    assert [row["job_id"] for row in written] == ["a", "c"]


@pytest.mark.parametrize(
    ("changes", "refusal"),
    [
        ({"window": (0, 2)}, "--stream: not with --window"),
        ({"policies": ["gittins"]}, "--stream: not with gittins without --gittins-history"),
        ({"policies": ["edf"]}, "--stream: not with deadlines"),
        ({"private_baseline": True}, "--stream: not with --private-baseline"),
    ],
)
def test_what_needs_the_whole_trace_is_refused_when_streamed(tmp_path, changes, refusal):
    trace = tiresias_file(tmp_path / "t.csv", ["a,1,0,,,5,"])
    with pytest.raises(SimulationError, match="^" + re.escape(refusal)):
        simulate(tmp_path, trace, stream=True, **changes)


def test_a_format_without_a_streaming_reader_is_refused(tmp_path):
    with pytest.raises(SimulationError) as error:
        simulate(tmp_path, "philly:/nonexistent", stream=True)
    assert str(error.value) == (
        "--stream: trace format 'philly' has no streaming reader (it is read whole); formats "
        "that stream: tiresias"
    )
