"""`--preset tiresias` against the Tiresias simulator's own output, job by job.

The fixtures were made once, by `scripts/tiresias_compare.py`'s generator and the Tiresias
simulator (SymbioticLab/Tiresias 959f9b0, `simulator/run_sim.py` run unchanged under Python 2.7
with numpy 1.16.6, `--scheme=yarn`, one switch of 8 nodes x 4 GPUs):

- `fixtures/tiresias-300.csv`: `write_synthetic("jobs=300,load=1.4,seed=7", 32, path)`: 300 jobs
  offered 1.4 times the 32 GPUs, so that queues build and LAS and Gittins preempt;
- `fixtures/tiresias-300-results.csv`: each job's JCT under its `fifo`, `dlas-gpu` and
  `dlas-gpu-gittins` schedules (their `job.csv`), and its preemptions under the last two.

The preset must give every job the same JCT and the same number of preemptions: the decisions
are the same, not only the averages (docs/policies.md: what the preset reproduces)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from click.testing import CliRunner

from corral.cli.main import app
from tests.sim.test_traces import shared

FIXTURES = Path(__file__).parent / "fixtures"


def tiresias_results() -> dict[str, dict[str, str]]:
    with (FIXTURES / "tiresias-300-results.csv").open() as handle:
        return {row["job_id"]: row for row in csv.DictReader(handle)}


@pytest.mark.parametrize(
    ("policy", "placement", "schedule"),
    [("fifo", "yarn", "fifo"), ("las", "any", "dlas_gpu"), ("gittins", "any", "dlas_gpu_gittins")],
)
def test_the_preset_gives_every_job_the_tiresias_simulators_jct(
    tmp_path: Path, policy: str, placement: str, schedule: str
) -> None:
    if policy == "gittins":
        shared("tiresias", "yarn-gput1000.csv")  # its Gittins history: skipped where absent
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "--trace",
            f"tiresias:{FIXTURES / 'tiresias-300.csv'}",
            "--cluster",
            "8x4",
            "--policy",
            policy,
            "--preset",
            "tiresias",
            "--out",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    with (tmp_path / f"jobs-{policy}-{placement}.csv").open() as handle:
        ours = {row["job_id"]: row for row in csv.DictReader(handle)}
    theirs = tiresias_results()
    assert set(ours) == set(theirs) and len(ours) == 300
    jct = {job: float(row["jct_s"]) for job, row in ours.items()}
    assert jct == {job: float(row[f"{schedule}_jct"]) for job, row in theirs.items()}
    if policy != "fifo":
        preempted = {job: int(row["preemptions"]) for job, row in ours.items()}
        expected = {job: int(row[f"{schedule}_preempt"]) for job, row in theirs.items()}
        assert preempted == expected
        assert sum(expected.values()) > 100  # the trace does exercise preemption
