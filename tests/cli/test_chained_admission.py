"""An admission registered by this test module alone (one class and one registry entry, only the
hooks it has an opinion on) chains with a registered one: `corral simulate` and the live manager
both run `admission: [quota, max-running-per-user]`, and a job starts only if both let it."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from corral.cli.main import app
from corral.core.admission import ADMISSIONS
from corral.core.admission.base import Admission
from corral.core.cluster import Cluster
from corral.core.framework import build_scheduler, check_config, config_from_mapping
from corral.core.job import Job
from corral.core.options import option
from corral.core.plugin import PluginError, Services
from corral.server.manager import Manager, ManagerSettings
from corral.server.spec import parse_job_spec
from corral.server.store import Store
from tests.server.helpers import python_job
from tests.server.inert import HeldExecutor


@dataclass(frozen=True, slots=True)
class MaxRunningOptions:
    limit: int = option(1, help="jobs one user may run at once", low=1)


class MaxRunningPerUser(Admission):
    name = "max-running-per-user"
    summary = "at most `limit` jobs of one user run at once"
    Options = MaxRunningOptions

    def __init__(self, limit: int = 1) -> None:
        self.limit = limit
        self.running: dict[str, int] = {}

    @classmethod
    def from_options(cls, options: Any, services: Services) -> MaxRunningPerUser:
        return cls(options.limit)

    def check(self, job: Job) -> str | None:
        count = self.running.get(job.spec.user, 0)
        if count < self.limit:
            return None
        return f"user {job.spec.user} runs {count} jobs, the most one user may run"

    def on_start(self, job: Job, now: float) -> None:
        self.running[job.spec.user] = self.running.get(job.spec.user, 0) + 1

    def on_stop(self, job: Job, now: float) -> None:
        self.running[job.spec.user] -= 1


@pytest.fixture
def per_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ADMISSIONS, "max-running-per-user", MaxRunningPerUser)


# Two nodes of two GPUs; VCs a and b are guaranteed one node each, and lend nothing.
VCS = {
    "cell_types": {"NODE": {"child": "V100", "count": 2, "node": True}},
    "physical_cells": [{"type": "NODE", "count": 2}],
    "virtual_clusters": {"a": {"NODE": 1}, "b": {"NODE": 1}},
}
HEADER = (
    "job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue\n"
)
#: (job, user, VC), all of one GPU for 100 s, all submitted at 0, in this order.
JOBS = [
    ("a1", "u1", "a"),
    ("a2", "u1", "a"),
    ("a3", "u2", "a"),
    ("a4", "u3", "a"),
    ("b1", "u1", "b"),
]


def finishes(tmp_path: Path, *args: str) -> dict[str, float]:
    tmp_path.mkdir()
    config = tmp_path / "vcs.yaml"
    config.write_text(yaml.safe_dump(VCS))
    trace = tmp_path / "jobs.csv"
    rows = [f"{name},{user},{vc},1,1,1,COMPLETED,0,,,100,q" for name, user, vc in JOBS]
    trace.write_text(HEADER + "\n".join(rows) + "\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "--trace",
            f"helios:{trace}",
            "--config",
            str(config),
            "--policy",
            "fifo",
            "--placement",
            "consolidate",
            "--restore-s",
            "0",
            "--no-quota-oversubscribe",
            "--out",
            str(out),
            *args,
        ],
    )
    assert result.exit_code == 0, result.output
    with (out / "jobs-fifo-consolidate.csv").open() as handle:
        return {row["job_id"]: float(row["finish_s"]) for row in csv.DictReader(handle)}


@pytest.mark.usefixtures("per_user")
def test_simulate_chains_a_registered_admission_after_quota(tmp_path: Path) -> None:
    # Quota alone: a1 and a2 fill a's two GPUs at 0 (a3, a4 wait for them: 100-200); b1 runs at
    # once on b's idle node.
    assert finishes(tmp_path / "quota", "--admission", "quota") == {
        "a1": 100.0,
        "a2": 100.0,
        "b1": 100.0,
        "a3": 200.0,
        "a4": 200.0,
    }
    # Chained with one running job per user, fifo's order at 0: a1 starts (u1 runs 1); a2 is
    # u1's second, refused; a3 (u2) starts, filling a's quota; a4 (u3) is refused by the quota;
    # b1, within b's quota, is u1's second, refused. At 100 a1 and a3 end: a2 (u1's only one
    # now) and a4 (a's quota free) start; b1 is again u1's second, until a2 ends at 200.
    chained = ["--admission", "quota,max-running-per-user"]
    assert finishes(tmp_path / "limit1", *chained) == {
        "a1": 100.0,
        "a3": 100.0,
        "a2": 200.0,
        "a4": 200.0,
        "b1": 300.0,
    }
    # The limit's flag is generated from its options: with 2, u1's a1 and a2 fill a's quota at
    # 0, and b1, u1's third, waits for them (100-200), as a3 and a4 do.
    assert finishes(tmp_path / "limit2", *chained, "--max-running-per-user-limit", "2") == {
        "a1": 100.0,
        "a2": 100.0,
        "a3": 200.0,
        "a4": 200.0,
        "b1": 200.0,
    }
    shown = CliRunner().invoke(app, ["config", "show", *chained])
    assert "max-running-per-user:\n    limit: 1" in shown.output, shown.output
    assert "  admission:\n  - quota\n  - max-running-per-user\n" in shown.output, shown.output


@pytest.mark.usefixtures("per_user")
def test_the_manager_runs_a_chained_admission_registered_by_a_test(tmp_path: Path) -> None:
    executor = HeldExecutor()
    scheduler = config_from_mapping(
        {
            "policy": "fifo",
            "placement": "consolidate",
            "admission": ["quota", "max-running-per-user"],
            "quota": {"oversubscribe": False},
        }
    )
    manager = Manager(
        Store(Store.sqlite_url(tmp_path)),
        executor,
        Cluster.shorthand(2, 2),
        tmp_path,
        vc_quota={"a": 2, "b": 2},
        settings=ManagerSettings(scheduler=scheduler),
    )

    def running() -> set[str]:
        return {launch.job_id for launch in executor.running.values()}

    def end(job_id: str) -> None:
        (attempt,) = [a for j, a in executor.running if j == job_id]
        executor.end(job_id, attempt, "exit code 0", code=0)
        manager.step()  # collects the end
        manager.step()  # the round it makes room for

    try:
        ids = {}
        for name, user, vc in JOBS:
            spec = parse_job_spec(python_job(name, "pass", gpus=1, vc=vc))
            ids[name] = manager.submit(spec, user).id
        manager.step()
        # As in the simulation above: a1 and a3 run; a2 and b1 are u1's second, a4 is a's third.
        assert running() == {ids["a1"], ids["a3"]}
        why = manager.scheduler.explain(ids["a2"], manager.clock())
        assert "admission max-running-per-user: user u1 runs 1 jobs" in why, why
        why = manager.scheduler.explain(ids["a4"], manager.clock())
        assert "admission quota: VC a is at its quota: 2 of 2 GPUs in use" in why, why
        end(ids["a1"])
        assert running() == {ids["a2"], ids["a3"]}  # b1 is u1's second again
        end(ids["a3"])
        assert running() == {ids["a2"], ids["a4"]}
        end(ids["a2"])
        assert running() == {ids["a4"], ids["b1"]}
        assert manager.effective_config()["admission"] == ["quota", "max-running-per-user"]
    finally:
        manager.stop()


@pytest.mark.usefixtures("per_user")
def test_a_chain_is_checked_when_the_config_is_read() -> None:
    services = Services(Cluster.shorthand(2, 2), vc_cells={"a": {}, "b": {}}, vc_quota={"a": 2})
    # Only an admission that adds verdicts may follow another; none may follow elasticflow.
    for chain, message in (
        (["max-running-per-user", "quota"], "admission: quota must come first"),
        (["hived", "fairshare"], "admission: fairshare must come first"),
        (["quota", "quota"], "admission: quota, quota: an admission is named twice"),
        (["quota", "ghost"], "admission: unknown admission 'ghost'"),
    ):
        with pytest.raises((PluginError, ValueError), match=message):
            check_config(config_from_mapping({"policy": "fifo", "admission": chain}), services)
    elastic = config_from_mapping(
        {"policy": "elasticflow", "admission": ["elasticflow", "max-running-per-user"]}
    )
    with pytest.raises(PluginError, match="admission: elasticflow runs alone"):
        check_config(elastic, services)
    # An admission that does not count GPUs runs with packing (quota, which does, is refused in
    # one line naming the option, before anything is built).
    packing = {"policy": "fifo", "stages": ["packing"]}
    check_config(config_from_mapping(packing | {"admission": ["none", "max-running-per-user"]}))
    with pytest.raises(PluginError, match="admission quota does not run with packing"):
        check_config(config_from_mapping(packing | {"admission": ["quota"]}), services)
    # No verdict of its own: a custom admission changes nothing it has no opinion on, so the
    # scheduler keeps its quiet-round skip and failed-search memory with it.
    built = build_scheduler(
        config_from_mapping({"policy": "las", "admission": ["none", "max-running-per-user"]}),
        Services(Cluster.shorthand(2, 2)),
    )
    assert built.admission.name == "max-running-per-user"  # type: ignore[attr-defined]
    assert built._may_repeat and built.preemption.remembers  # type: ignore[attr-defined]
    assert MaxRunningPerUser.opinions == {"check", "on_start", "on_stop"}
