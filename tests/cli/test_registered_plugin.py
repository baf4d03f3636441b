"""A plugin registered by this test module alone, one class and one registry entry, is usable from
`corral simulate` (with flags generated from its options) and from the live manager."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from corral.cli.main import app
from corral.core.cluster import Cluster
from corral.core.framework import config_from_mapping
from corral.core.job import Job
from corral.core.options import option
from corral.core.plugin import Services
from corral.core.policy import POLICIES
from corral.core.policy.base import Key, Policy
from corral.server.manager import Manager, ManagerSettings
from corral.server.spec import parse_job_spec
from corral.server.store import Store
from tests.server.helpers import python_job
from tests.server.inert import HeldExecutor


@dataclass(frozen=True, slots=True)
class LifoOptions:
    newest_first: bool = option(True, help="serve the job that arrived last first")


class Lifo(Policy):
    name = "lifo"
    summary = "last come, first served"
    Options = LifoOptions

    def __init__(self, newest_first: bool = True) -> None:
        self.newest_first = newest_first

    @classmethod
    def from_options(cls, options: Any, services: Services) -> Policy:
        return cls(options.newest_first)

    def key(self, job: Job, now: float) -> Key:
        order = -job.seq if self.newest_first else job.seq
        return (order,)


@pytest.fixture
def lifo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(POLICIES, "lifo", Lifo)


def finishes(out: Path) -> dict[str, float]:
    with (out / "jobs-lifo-consolidate.csv").open() as handle:
        return {row["job_id"]: float(row["finish_s"]) for row in csv.DictReader(handle)}


@pytest.mark.usefixtures("lifo")
def test_simulate_runs_a_policy_registered_by_a_test_with_its_generated_flag(tmp_path: Path):
    # One GPU; jobs a (t=0), b (t=10), c (t=20), 100 s each. a runs 0-100; then lifo takes c
    # (the newest) 100-200 and b 200-300. With --no-lifo-newest-first: b 100-200, c 200-300.
    trace = tmp_path / "jobs.csv"
    trace.write_text(
        "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
        "a,1,0,10,resnet50,100,0\nb,1,10,10,resnet50,100,10\nc,1,20,10,resnet50,100,10\n"
    )
    common = ["simulate", "--trace", f"tiresias:{trace}", "--cluster", "1x1", "--policy", "lifo"]
    common += ["--placement", "consolidate", "--restore-s", "0"]
    result = CliRunner().invoke(app, [*common, "--out", str(tmp_path / "new")])
    assert result.exit_code == 0, result.output
    assert finishes(tmp_path / "new") == {"a": 100.0, "c": 200.0, "b": 300.0}
    result = CliRunner().invoke(
        app, [*common, "--no-lifo-newest-first", "--out", str(tmp_path / "old")]
    )
    assert result.exit_code == 0, result.output
    assert finishes(tmp_path / "old") == {"a": 100.0, "b": 200.0, "c": 300.0}
    shown = CliRunner().invoke(app, ["config", "show", "--policy", "lifo"])
    assert "lifo:\n    newest_first: true" in shown.output
    listed = CliRunner().invoke(app, ["config", "plugins"])
    assert listed.exit_code == 0
    assert any(
        line.split()[:2] == ["policy", "lifo"] and "newest_first" in line
        for line in listed.output.splitlines()
    )


@pytest.mark.usefixtures("lifo")
def test_the_manager_runs_a_policy_registered_by_a_test(tmp_path: Path):
    executor = HeldExecutor()
    manager = Manager(
        Store(Store.sqlite_url(tmp_path)),
        executor,
        Cluster.shorthand(1, 1),
        tmp_path,
        settings=ManagerSettings(scheduler=config_from_mapping({"policy": "lifo"})),
    )
    try:
        assert isinstance(manager.scheduler.policy, Lifo)
        for name in ("a", "b", "c"):
            manager.submit(parse_job_spec(python_job(name, "pass", gpus=1)), "u")
        manager.step()
        assert [launch.job_id for launch in executor.running.values()] == ["3"]  # c, newest
        executor.end("3", 1, "exit code 0", code=0)
        manager.step()
        manager.step()
        assert [launch.job_id for launch in executor.running.values()] == ["2"]
    finally:
        manager.stop()
