"""ElasticFlow in the simulator: deadlines from durations, scaling ranges from the table, an
elastic run replayed by the event loop, the deadline metrics and `corral simulate` with it."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from corral.cli.main import app
from corral.core import Cluster, JobSpec, JobStatus
from corral.core.elastic import ElasticScheduler
from corral.core.job import Elastic, Job
from corral.core.placement import make_placement
from corral.sim.engine import Simulation
from corral.sim.metrics import summarize
from corral.sim.perfmodel import PerfModel
from corral.sim.runner import RunSettings, elastic_range, with_deadlines


def write_table(path: Path, curves: dict[str, dict[int, float]]) -> Path:
    table = {
        "v100": {str((model, n)): {"null": v} for model, c in curves.items() for n, v in c.items()}
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table))
    return path


def test_deadlines_are_drawn_from_each_duration_seeded_and_the_same_for_every_policy():
    jobs = [
        JobSpec(id=str(i), submit_time=10.0 * i, gpus=1, duration_s=100.0 * (i + 1))
        for i in range(50)
    ]
    jobs.append(JobSpec(id="unknown", submit_time=0, gpus=1))  # no duration: no deadline
    settings = RunSettings(trace="", policies=["las", "edf"], deadline_factor=(0.5, 1.5), seed=3)
    timed = with_deadlines(jobs, settings, None)
    factors = [(s.deadline - s.submit_time) / s.duration_s for s in timed[:-1]]
    assert all(0.5 <= f <= 1.5 for f in factors)
    assert max(factors) - min(factors) > 0.5  # spread over the range, not one value
    assert timed[-1].deadline is None
    assert all(s.elastic is None for s in timed)  # no throughput table: not elastic
    assert with_deadlines(jobs, settings, None) == timed  # seeded
    other_seed = with_deadlines(jobs, RunSettings(trace="", policies=["edf"], seed=4), None)
    assert [s.deadline for s in other_seed] != [s.deadline for s in timed]
    # default 0.5:1.5 with a deadline policy; nothing without one
    assert with_deadlines(jobs, RunSettings(trace="", policies=["fifo"]), None) == jobs


def test_an_elastic_job_grows_only_as_far_as_the_table_measured_its_model(tmp_path):
    # "A" measured on 1, 2 and 4 GPUs; "B" on 1 only: the table scales B linearly, perfect
    # scaling that was never measured, so B jobs never grow past what they asked for.
    perf = PerfModel.from_gavel_table(
        write_table(tmp_path / "t.json", {"A": {1: 10.0, 2: 18.0, 4: 30.0}, "B": {1: 5.0}})
    )

    def limits(model: str, gpus: int) -> Elastic | None:
        return elastic_range(perf, JobSpec(id="x", submit_time=0, gpus=gpus, model=model))

    assert limits("A", 2) == Elastic(1, 4, 2)
    assert limits("A", 8) == Elastic(1, 8, 8)
    assert limits("B", 4) == Elastic(1, 4, 4)
    assert limits("B", 1) == Elastic(1, 1, 1)
    assert limits("nope", 1) is None


CURVE = {1: 1.0, 2: 1.8, 4: 3.2}


def elastic_job(job_id: str, work: float, deadline: float, submit: float) -> JobSpec:
    return JobSpec(
        id=job_id,
        submit_time=submit,
        gpus=1,
        model="m",
        duration_s=work,
        deadline=deadline,
        elastic=Elastic(1, 4, 1),
    )


def test_the_event_loop_replays_a_shrink_a_grow_and_a_refusal():
    # The core test's scenario (tests/core/test_elastic.py), end times now set by the loop: A
    # (3200 s) runs on 4 GPUs, shrinks to 2 when B (200 s due at 350) arrives at 100, and grows
    # back to 4 when B ends at 100 + 200 / 1.8 = 211.11, having done 502 s; it restores for 10 s
    # and ends at 221.11 + 2698 / 3.2 = 1064.24. C (1000 s due 100 s after it arrives at 150)
    # is refused: 4 GPUs would take 312.5 s. Deadlines met: A and B, of 3.
    cluster = Cluster.shorthand(1, 4)
    scheduler = ElasticScheduler(
        cluster, make_placement("consolidate"), lambda job, g: CURVE[g], restore_s=10
    )
    jobs = [
        elastic_job("A", 3200, 10_000, 0),
        elastic_job("B", 200, 350, 100),
        elastic_job("C", 1000, 250, 150),
    ]
    result = Simulation(jobs, scheduler).run()
    by_id = {job.id: job for job in result.jobs}
    assert by_id["B"].finished_at == pytest.approx(100 + 200 / 1.8)
    assert by_id["A"].finished_at == pytest.approx(100 + 200 / 1.8 + 10 + 2698 / 3.2)
    assert by_id["C"].status is JobStatus.REFUSED and by_id["C"].attempts == 0
    assert (scheduler.tally.shrinks, scheduler.tally.grows) == (1, 1)
    summary = summarize(result)
    assert summary["deadline_met_share"] == pytest.approx(2 / 3)
    assert (summary["deadlines_met"], summary["admitted"], summary["refused"]) == (2, 2, 1)
    assert summary["jobs"] == 2 and summary["unfinished"] == 0
    assert cluster.free_gpus == 4


def test_without_deadlines_the_summary_has_no_deadline_entries():
    cluster = Cluster.shorthand(1, 1)
    scheduler = ElasticScheduler(cluster, make_placement("consolidate"), lambda job, g: 1.0)
    job = JobSpec(id="x", submit_time=0, gpus=1, duration_s=5)
    result = Simulation([job], scheduler).run()
    assert result.jobs[0].finished_at == 5
    assert "deadline_met_share" not in summarize(result)


def write_gavel(tmp_path: Path) -> Path:
    """Three 1-GPU jobs of 100 s (1000 steps at 10 steps/s) arriving at 0, 0 and 40."""
    write_table(tmp_path / "simulation_throughputs.json", {"M": {1: 10.0, 2: 18.0, 4: 32.0}})
    traces = tmp_path / "seed0"
    traces.mkdir()
    line = "M\tpython train.py\t--steps\t1\t1000\t{}\t1\n"
    (traces / "vc.trace").write_text(line.format(0) + line.format(0) + line.format(40))
    return traces


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["simulate", *args])
    return result.exit_code, result.output


def test_simulate_compares_elasticflow_with_the_baselines_on_the_same_deadlines(tmp_path):
    # lambda = 0.5: each job is due 50 s after it arrives, half its length on the 1 GPU it asked
    # for, so edf, las and fifo meet none. elasticflow runs vc-1 on 4 GPUs (3.2x: 31.25 s),
    # refuses vc-2 (after vc-1 it would end at 62.5 > 50), and runs vc-3 on 4 GPUs from 40 to
    # 71.25 <= 90: 2 of 3.
    out = tmp_path / "out"
    code, output = run_cli(
        "--trace", f"gavel:{write_gavel(tmp_path)}", "--cluster", "1x4", "--restore-s", "0",
        "--compare", "elasticflow,edf,las,fifo", "--deadline-factor", "0.5:0.5", "--out", str(out),
    )  # fmt: skip
    assert code == 0, output
    runs = {r["policy"]: r for r in json.loads((out / "summary.json").read_text())["runs"]}
    assert runs["elasticflow"]["deadline_met_share"] == pytest.approx(2 / 3)
    assert (runs["elasticflow"]["admitted"], runs["elasticflow"]["refused"]) == (2, 1)
    assert runs["elasticflow"]["deadlines_met"] == 2  # a JSON number, not a string
    for name in ("edf", "las", "fifo"):
        assert (runs[name]["deadline_met_share"], runs[name]["admitted"]) == (0.0, 3)
    assert "elasticflow/relax: 66.7% of deadlines met (2 of 3, 2 admitted)" in output
    with (out / "jobs-elasticflow-relax.csv").open() as handle:
        rows = {row["job_id"]: row for row in csv.DictReader(handle)}
    assert rows["vc-2"]["status"] == "REFUSED" and rows["vc-2"]["first_start_s"] == ""
    assert float(rows["vc-3"]["finish_s"]) == pytest.approx(71.25)
    assert rows["vc-3"]["gpus"] == "1"  # the count it asked for, not the 4 it ran on


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--deadline-factor", "2:1"], "--deadline-factor: expected LO:HI with 0 < LO <= HI"),
        (["--deadline-factor", "fast"], "--deadline-factor: expected LO:HI"),
        (
            ["--policy", "elasticflow", "--stages", "packing"],
            "admission elasticflow does not run with packing",
        ),
        (
            ["--policy", "elasticflow", "--admission", "quota"],
            "policy elasticflow: runs only inside admission elasticflow",
        ),
    ],
)
def test_bad_elastic_options_are_one_line_errors(tmp_path, args, message):
    code, output = run_cli("--trace", f"gavel:{write_gavel(tmp_path)}", "--cluster", "1x4", *args)
    assert code == 2
    assert message in output and "Traceback" not in output


def test_elasticflow_needs_a_throughput_table(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(
        "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n0,1,0,1,vgg16,10,0\n"
    )
    code, output = run_cli("--trace", f"tiresias:{trace}", "--policy", "elasticflow")
    assert code == 2
    assert "--policy elasticflow: needs a trace with a throughput table (gavel)" in output


def test_a_job_keeps_its_asked_count_in_reports_after_running_elastic():
    # (the speed a resized job runs at is its curve's ratio to the count it asked for)
    cluster = Cluster.shorthand(1, 4)
    scheduler = ElasticScheduler(cluster, make_placement("consolidate"), lambda job, g: CURVE[g])
    scheduler.submit(elastic_job("a", 320, 10_000, 0), 0)
    scheduler.decide(0)
    job: Job = scheduler.jobs["a"]
    assert (job.gpus, job.speed) == (4, pytest.approx(3.2))
    scheduler.finished("a", 100)
    assert job.spec.gpus == 1 and job.attained_gpu_s == pytest.approx(400)
