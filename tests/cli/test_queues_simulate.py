"""`corral simulate --config` with departments (hierarchical queues), end to end: the scenario
of tests/sim/test_queues_sim.py from a Helios-format trace, and hived refusing the tree."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from corral.cli.main import app
from tests.sim.test_queues_sim import ARRIVALS, EXPECTED, TREE_YAML

HEADER = (
    "job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue\n"
)


def simulate(tmp_path: Path, *args: str) -> tuple[int, str, Path]:
    config = tmp_path / "tree.yaml"
    config.write_text(TREE_YAML)
    trace = tmp_path / "log.csv"
    rows = [f"{job},u,{vc},1,1,1,COMPLETED,{at:g},,,3600,q" for at, job, vc in ARRIVALS]
    trace.write_text(HEADER + "\n".join(rows) + "\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            *("--trace", f"helios:{trace}", "--config", str(config)),
            *("--policy", "fifo", "--placement", "consolidate", "--restore-s", "0"),
            *("--decisions", "--out", str(out), *args),
        ],
    )
    return result.exit_code, result.output, out


def test_simulate_takes_the_tree_and_preempts_in_its_order(tmp_path: Path):
    code, output, out = simulate(tmp_path)
    assert code == 0, output
    run = json.loads((out / "summary.json").read_text())["runs"][0]
    # c2 at 10 (lent across, given back for b's GPU lent within d), c1 at 30 (outside d
    # first), b1 at 40 (then within): three preemptions, as worked out in test_queues_sim.py.
    assert run["preemptions"] == sum(1 for _, kind, _ in EXPECTED if kind == "preempt") == 3


def test_simulate_refuses_hived_with_departments_in_one_line(tmp_path: Path):
    code, output, _ = simulate(tmp_path, "--admission", "hived")
    assert code != 0
    assert "admission hived does not run with departments" in output
    assert len(output.strip().splitlines()) == 1, output
