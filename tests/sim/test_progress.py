"""The simulator's loss-curve model of job progress, and optimus driven by it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from corral.cli.main import app
from corral.core import Cluster, JobSpec, Scheduler
from corral.core.job import Job
from corral.core.placement import make_placement
from corral.core.policy.optimus import Optimus, no_progress
from corral.sim.engine import Simulation
from corral.sim.progress import LossCurveModel, estimation_errors


def job_at(spec: JobSpec, work_done_s: float) -> Job:
    return Job(spec=spec, work_done_s=work_done_s)


LONG = JobSpec(id="long", submit_time=0, gpus=1, duration_s=1000.0, total_steps=5000.0)


def test_hidden_curve_converges_at_the_true_length():
    model = LossCurveModel(seed=3, noise=0.0)
    hidden = model.hidden(LONG)
    assert hidden is not None
    curve = hidden.curve
    assert curve.converged_step(0.05) == pytest.approx(5000)
    # At the last step the excess over the asymptote is 5 % of the excess at step 0 (1 / b1).
    assert curve.loss(5000) - curve.b2 == pytest.approx(0.05 / curve.b1)
    # 5 steps per ideal second; a sample every 60 s of work = every 300 steps. Done: 5,000 steps,
    # samples at 300, 600, ..., 4,800 (16 of them), exactly on the curve without noise.
    progress = model(job_at(LONG, 1000.0), 0.0)
    assert progress.steps_done == pytest.approx(5000)
    assert len(progress.samples) == 16
    assert [s for s, _ in progress.samples][:2] == [300, 600]
    assert progress.samples[-1] == (4800, pytest.approx(curve.loss(4800)))


def test_samples_stop_at_the_work_done_and_steps_default_to_seconds():
    model = LossCurveModel(seed=0, noise=0.0)
    # 130 s of work = 650 steps: samples at 300 and 600 only.
    progress = model(job_at(LONG, 130.0), 0.0)
    assert progress.steps_done == pytest.approx(650)
    assert [s for s, _ in progress.samples] == [300, 600]
    # Without total_steps a job does one step per ideal second, logged every 60 steps.
    plain = JobSpec(id="plain", submit_time=0, gpus=1, duration_s=500.0)
    assert [s for s, _ in model(job_at(plain, 200.0), 0.0).samples] == [60, 120, 180]
    # A job with no length reports nothing; one that has not run has no samples.
    unknown = JobSpec(id="unknown", submit_time=0, gpus=1)
    assert model(job_at(unknown, 200.0), 0.0).samples == ()
    assert len(model(job_at(LONG, 0.0), 0.0).samples) == 0


def test_seeded_determinism_in_any_order():
    other = JobSpec(id="other", submit_time=0, gpus=1, duration_s=800.0)
    first, second = LossCurveModel(seed=7), LossCurveModel(seed=7)
    a1 = list(first(job_at(LONG, 900.0), 0.0).samples)
    o1 = list(first(job_at(other, 700.0), 0.0).samples)
    o2 = list(second(job_at(other, 700.0), 0.0).samples)  # asked in the other order
    a2 = list(second(job_at(LONG, 900.0), 0.0).samples)
    assert (a1, o1) == (a2, o2)
    # A sample does not depend on how far the job got: 400 s = 2,000 steps = the first 6 samples.
    assert list(second(job_at(LONG, 400.0), 0.0).samples) == a1[:6]
    assert list(LossCurveModel(seed=8)(job_at(LONG, 900.0), 0.0).samples) != a1


def test_noise_is_multiplicative_with_the_given_spread():
    spec = JobSpec(id="noisy", submit_time=0, gpus=1, duration_s=200_000.0)
    model = LossCurveModel(seed=1, noise=0.02)
    hidden = model.hidden(spec)
    assert hidden is not None
    samples = model(job_at(spec, 120_000.0), 0.0).samples
    assert len(samples) == 2000
    log_ratio = np.array([math.log(loss / hidden.curve.loss(step)) for step, loss in samples])
    # 2,000 draws of N(0, 0.02): the mean is within 3 standard errors (0.02 / sqrt(2000) = 4.5e-4).
    assert abs(log_ratio.mean()) < 3 * 0.02 / math.sqrt(2000)
    assert log_ratio.std() == pytest.approx(0.02, rel=0.1)


def test_estimation_errors_exact_curves_and_prior_fallback():
    model = LossCurveModel(seed=0, noise=0.0)
    short = JobSpec(id="short", submit_time=0, gpus=1, duration_s=100.0)
    long = JobSpec(id="long", submit_time=0, gpus=1, duration_s=10_000.0)
    result = estimation_errors([short, long], model, Optimus(model), fractions=(0.25, 0.75))
    # The short job has done 25 s (no sample) or 75 s (one sample): prior. The long one has 41
    # and 125 exact samples: the fit is exact.
    for fraction in (0.25, 0.75):
        errors, prior = result[fraction]
        assert prior == 1
        assert errors == [pytest.approx(0.0, abs=1e-4)]


def test_optimus_learns_to_let_a_short_job_pass_a_long_one():
    # One GPU. "long" (10,000 s of work) starts at 0; "short" (400 s) arrives at 1,000.
    # With progress: long logs every 60 s; its refits at 300, 600 and 900 s predict 10,000 s, so at
    # 1,000 it has 9,000 left, more than short's prior of 3,600: short preempts it, ends at 1,400,
    # and long ends at 1,400 + 9,000 = 10,400 (no restore cost here).
    # Without progress, long's prior leaves it 3,600 - 1,000 = 2,600 s at 1,000: short waits. Long
    # is re-keyed at 300, 600, 900, 1,350, 2,025, 3,037.5, 4,556.25 (each max(300, 0.5 x t) after
    # the last); at 4,556.25 it has outlived the 3,600 s prior and expects to run as long again,
    # 4,556.25 s more than short's 3,600: short preempts it then and ends at 4,956.25.
    jobs = [
        JobSpec(id="long", submit_time=0, gpus=1, duration_s=10_000.0),
        JobSpec(id="short", submit_time=1000, gpus=1, duration_s=400.0),
    ]
    ends = {}
    for name, observe in (("fit", LossCurveModel(seed=0, noise=0.0)), ("prior", no_progress)):
        scheduler = Scheduler(
            Cluster.shorthand(1, 1), Optimus(observe), make_placement("consolidate")
        )
        result = Simulation(jobs, scheduler).run()
        ends[name] = {job.id: job.finished_at for job in result.jobs}
    assert ends["fit"] == {"long": pytest.approx(10_400), "short": pytest.approx(1_400)}
    assert ends["prior"] == {"long": pytest.approx(10_400), "short": pytest.approx(4_956.25)}


def test_simulate_command_runs_optimus_and_refuses_a_negative_noise(tmp_path):
    # Job 0 (4 GPUs, 1,000 s) runs when job 1 (4 GPUs, 50 s) arrives at 10. Logging every 60 s of
    # work, job 0 has no point yet: its prior leaves it 3,600 - 10 = 3,590 s, less than job 1's
    # 3,600, so job 1 waits, as under fifo.
    trace = tmp_path / "jobs.csv"
    trace.write_text(
        "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
        "0,4,0,100,resnet50,1000,0\n"
        "1,4,10,10,resnet50,50,10\n"
    )
    out = tmp_path / "out"
    args = ["simulate", "--trace", f"tiresias:{trace}", "--cluster", "1x4", "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--compare", "optimus,srtf"])
    assert result.exit_code == 0, result.output
    runs = {r["policy"]: r for r in json.loads((out / "summary.json").read_text())["runs"]}
    # optimus: job 0 ends at 1,000, job 1 at 1,050 -> JCTs 1,000 and 1,040, mean 1,020.
    # srtf knows job 1 needs 50 s: it preempts job 0 at 10 (ends 60), job 0 resumes with a 30 s
    # restore and ends at 60 + 30 + 990 = 1,080 -> JCTs 1,080 and 50, mean 565.
    assert runs["optimus"]["avg_jct_s"] == pytest.approx(1020)
    assert runs["srtf"]["avg_jct_s"] == pytest.approx(565)
    bad = CliRunner().invoke(app, [*args, "--policy", "optimus", "--optimus-noise", "-1"])
    assert bad.exit_code == 2
    assert "--optimus-noise: must not be negative" in bad.output
