"""`corral simulate --opportunistic-share` under the admissions that act on it."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from corral.core.framework import config_from_mapping
from corral.core.job import JobSpec, Priority
from corral.sim.runner import (
    DEFAULT_VCS,
    RunSettings,
    SimulationError,
    assign_tenants,
    run_simulations,
)


def settings(admission: str, share: float, trace: str = "") -> RunSettings:
    return RunSettings(
        trace=trace,
        nodes=2,
        gpus_per_node=4,
        policies=["fifo"],
        scheduler=config_from_mapping({"admission": admission, "placement": "consolidate"}),
        opportunistic_share=share,
    )


@pytest.mark.parametrize("admission", ["quota", "fairshare"])
def test_quota_and_fairshare_accept_an_opportunistic_share(admission: str):
    jobs = [JobSpec(id=f"j{i}", submit_time=0.0, gpus=1, duration_s=1.0) for i in range(200)]
    marked = assign_tenants(jobs, settings(admission, 0.5), DEFAULT_VCS)
    opportunistic = sum(spec.priority is Priority.OPPORTUNISTIC for spec in marked)
    assert 70 < opportunistic < 130  # a seeded half of 200


def test_admission_none_refuses_an_opportunistic_share():
    with pytest.raises(SimulationError, match="need admission hived, quota or fairshare"):
        assign_tenants([], settings("none", 0.5), DEFAULT_VCS)


def test_opportunistic_jobs_wait_for_idle_gpus_under_quota(tmp_path: Path):
    # Twelve 4-GPU jobs of 1,000 s arrive at 0 on 8 GPUs, about half of them opportunistic
    # (seeded). Each round places the guaranteed jobs first, so they run as if the opportunistic
    # ones did not exist, and those wait; none is preempted (no guaranteed job arrives while an
    # opportunistic one runs).
    rows = "\n".join(f"j{i},4,0,1000" for i in range(12))
    trace = tmp_path / "jobs.csv"
    trace.write_text("job_id,num_gpu,submit_time,duration\n" + rows + "\n")
    run = settings("quota", 0.5, f"tiresias:{trace}")
    (summary,) = run_simulations(run, out=tmp_path / "out", plot=False, console=Console(quiet=True))
    per_vc = summary["per_vc"]
    assert set(per_vc) == {"default", "opportunistic"}
    guaranteed, opportunistic = per_vc["default"], per_vc["opportunistic"]
    assert guaranteed["jobs"] + opportunistic["jobs"] == 12
    # k guaranteed jobs run two at a time: the i-th (from 0) starts at 1000 x (i // 2). The
    # opportunistic ones start no earlier than the last of them (beside it when k is odd).
    k = guaranteed["jobs"]
    assert guaranteed["avg_queue_s"] == pytest.approx(sum(1000.0 * (i // 2) for i in range(k)) / k)
    assert opportunistic["avg_queue_s"] > guaranteed["avg_queue_s"]
    assert summary["preemptions"] == 0
