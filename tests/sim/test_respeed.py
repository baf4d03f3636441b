"""The simulator re-times a job's end when its speed changes mid-attempt (Decision.respeeds)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from click.testing import CliRunner

from corral.cli.main import app
from corral.core import Cluster, JobSpec, JobStatus, Scheduler
from corral.core.colocation import PairTable
from corral.core.packing import Packing
from corral.core.placement import make_placement
from corral.core.policy import make_policy
from corral.sim.colocation import load_pair_table
from corral.sim.engine import FailureModel, Simulation
from corral.sim.perfmodel import PerfModelError

# Sharing one v100: A runs at 0.7 of its speed alone, B at 0.6.
TABLE = PairTable({("v100", 1, "B", "A"): (0.6, 0.7), ("v100", 1, "A", "B"): (0.7, 0.6)})


def run(specs, failures=None, seed=0):
    cluster = Cluster.shorthand(1, 1)
    scheduler = Scheduler(
        cluster, make_policy("fifo"), make_placement("consolidate"), stages=[Packing(TABLE)]
    )
    sim = Simulation(
        specs,
        scheduler,
        failures=failures,
        seed=seed,
    )
    result = sim.run()
    return result, {job.id: job for job in result.jobs}, scheduler


def test_the_end_of_a_job_moves_when_it_starts_and_stops_sharing():
    # h (A, 300 s of work) runs alone from 0; its end is first set for t=300. g (B, 84 s) packs
    # with it at 100: g needs 84 / 0.6 = 140 s and ends at 240. h did 100 s alone, then 0.7 x 140
    # = 98 s: 198 at t=240, when it gets its speed alone back and does the last 102 s by t=342.
    # Its ends at 300 (set at start) and at 100 + 200 / 0.7 = 385.7 (set at packing) are stale.
    _, jobs, scheduler = run(
        [
            JobSpec(id="h", submit_time=0, gpus=1, model="A", duration_s=300),
            JobSpec(id="g", submit_time=100, gpus=1, model="B", duration_s=84),
        ]
    )
    assert jobs["g"].finished_at == pytest.approx(240)
    assert jobs["h"].finished_at == pytest.approx(342)
    assert jobs["h"].work_done_s == pytest.approx(300)
    assert scheduler.stage("packing").packed_gpu_s == pytest.approx(140)
    assert scheduler.cluster.free_gpus == 1


def test_a_failure_drawn_at_start_still_happens_after_a_speed_change():
    # Every attempt fails (cap 1.0, no retries) at a uniform fraction of what it would have run.
    # default_rng(0) draws 0.637 (fails: below 1.0), then 0.2698: h fails at 300 x 0.2698 = 80.9.
    # g packs with h at t=1: h's finish would move to 1 + 299 / 0.7 = 428, but the failure comes
    # first and stays where it was drawn (re-timing it as a finish would let h succeed).
    _, jobs, _ = run(
        [
            JobSpec(id="h", submit_time=0, gpus=1, model="A", duration_s=300),
            JobSpec(id="g", submit_time=1, gpus=1, model="B", duration_s=10_000),
        ],
        failures=FailureModel(rate=1.0, max_retries=0, cap=1.0),
    )
    draws = np.random.default_rng(0).random(2)
    assert jobs["h"].status is JobStatus.FAILED
    assert jobs["h"].finished_at == pytest.approx(300 * draws[1])


# -- through `corral simulate` ---------------------------------------------------------------------


def gavel_fixture(tmp_path):
    """The scenario above as a Gavel trace: A at 10 steps/s alone (7 shared), B at 20 (12)."""
    table = {
        "v100": {
            "('A', 1)": {"null": 10.0, "('B', 1)": [7.0, 12.0]},
            "('B', 1)": {"null": 20.0, "('A', 1)": [12.0, 7.0]},
        }
    }
    (tmp_path / "simulation_throughputs.json").write_text(json.dumps(table))
    traces = tmp_path / "seed0"
    traces.mkdir()
    rows = ["A\tcmd\t--steps\tFalse\t3000\t0\t1", "B\tcmd\t--steps\tFalse\t1680\t100\t1"]
    (traces / "vc.trace").write_text("\n".join(rows) + "\n")
    return traces


def simulate(*args):
    return CliRunner().invoke(app, ["simulate", *args])


def test_simulate_packs_with_the_gavel_table_and_reports_it(tmp_path):
    out = tmp_path / "out"
    result = simulate(
        "--trace", f"gavel:{gavel_fixture(tmp_path)}", "--cluster", "1x1", "--policy", "fifo",
        "--stages", "packing,migration", "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "1 pairs packed, 0.0 packed GPU-hours, 0 migrations" in result.output
    (run,) = json.loads((out / "summary.json").read_text())["runs"]
    assert run["makespan_s"] == pytest.approx(342)  # as worked out above
    assert run["packed_gpu_hours"] == pytest.approx(140 / 3600)
    assert run["packed_pairs"] == 1 and run["migrations"] == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--stages", "packing"], "stage packing: needs a trace with a throughput table (gavel)"),
        (["--stages", "packing", "--packing-threshold", "0"], "--packing-threshold: must be > 0"),
        (
            ["--policy", "timeslice", "--timeslice-quantum-s", "-1"],
            "--timeslice-quantum-s: must be > 0",
        ),
        (
            ["--stages", "packing", "--admission", "quota"],
            "admission quota does not run with packing",
        ),
    ],
)
def test_bad_gandiva_options_are_one_line_errors(tmp_path, args, message):
    trace = tmp_path / "jobs.csv"
    trace.write_text(
        "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
        "0,1,0,10,resnet50,100,0\n"
    )
    result = simulate("--trace", f"tiresias:{trace}", "--cluster", "1x1", *args)
    assert result.exit_code == 2
    assert message in result.output and len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[1, 2]", "expected a JSON object of GPU types"),
        ('{"v100": {"A": {"null": 1}}}', "v100: bad key 'A'"),
        ('{"v100": {"(\'A\', 1)": {"x": 1}}}', '"null" throughput'),
        (
            '{"v100": {"(\'A\', 1)": {"null": 1, "(\'B\', 1)": [1]}}}',
            "v100: ('A', 1): ('B', 1): expected a pair of throughputs",
        ),
        ("{not json", "cannot read throughput table"),
    ],
)
def test_a_malformed_co_location_table_is_a_one_line_error(tmp_path, content, message):
    path = tmp_path / "table.json"
    path.write_text(content)
    with pytest.raises(PerfModelError, match=re.escape(message)) as error:
        load_pair_table(path)
    assert str(path) in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(PerfModelError, match="not found"):
        load_pair_table(tmp_path / "missing.json")
