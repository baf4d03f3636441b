"""A backfill rule under a policy that never blocks can never act: `corral simulate` and
`corral up` say so in one line naming the flag, once the policy is final, and go on."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from corral.cli.main import app
from corral.core.framework import idle_backfill

WARNING = (
    "warning: --backfill easy: no effect under policy las, which never blocks (backfill "
    "passes the head of a blocking policy: fifo)"
)


def test_idle_backfill_names_the_policies_that_never_block():
    assert idle_backfill("easy", ["fifo"]) is None  # fifo blocks: backfill acts
    assert idle_backfill("none", ["las"]) is None  # nothing asked
    assert idle_backfill("greedy", ["fifo", "las", "srtf"]) == (
        "--backfill greedy: no effect under policies las, srtf, which never blocks (backfill "
        "passes the head of a blocking policy: fifo)"
    )


def simulate(tmp_path: Path, *flags: str) -> str:
    trace = tmp_path / "jobs.csv"
    trace.write_text(
        "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
        "0,4,0,100,resnet50,100,0\n1,1,10,10,alexnet,20,10\n"
    )
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            *("--trace", f"tiresias:{trace}", "--cluster", "1x4"),
            *("--out", str(tmp_path / "out"), *flags),
        ],
    )
    assert result.exit_code == 0, result.output
    return " ".join(result.stderr.split())


def test_simulate_warns_for_the_policies_backfill_cannot_act_under(tmp_path: Path):
    assert simulate(tmp_path, "--compare", "fifo,las", "--backfill", "easy") == WARNING
    assert simulate(tmp_path, "--policy", "fifo", "--backfill", "easy") == ""
    assert simulate(tmp_path, "--policy", "las") == ""  # backfill none: nothing to say


@pytest.mark.parametrize(("policy", "said"), [("las", WARNING), ("fifo", "")])
def test_up_warns_before_it_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str, said: str
) -> None:
    pytest.importorskip("fastapi")
    from corral.server.manager import Manager

    def serve(manager: Manager, options: object) -> None:
        manager.stop()

    monkeypatch.setattr("corral.cli.up.serve", serve)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = CliRunner().invoke(
        app,
        [
            "up",
            *("--gpus", "1", "--single-user", "--data-dir", str(tmp_path / "d")),
            *("--port", str(port), "--policy", policy, "--backfill", "easy"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert " ".join(result.stderr.split()) == said
