"""A site's health-check command run by the live manager: real job processes (the local
executor), the real clock, HTTP on loopback, `corral node` as an admin's shell runs it, and the
command a real script whose verdict the test flips through a file.

Two logical nodes of one GPU each, n0 and n1, whose jobs all run on this machine (as in
tests/server/test_nodes_live.py: `corral up` declares one node per machine), fifo and
consolidate (the first job lands on n0), the health check `python check.py DIR` every 0.3 s
(`corral up --health-check ... --health-every-s 0.3`, whose flags are checked below). The script
exits 1 with the first line of DIR/sick-$CORRAL_NODE when that file exists, else 0 (and notes
each run in DIR/ran-$CORRAL_NODE, so the test can wait for a pass).

Worked out by hand:
  a (max_retries 0) runs on n0, b on n1.
  n0 turns unhealthy ("XID 79: GPU has fallen off the bus"): a's attempt ends at once as the
  infrastructure's failure: `lost`, failures 0 (with max_retries 0 a failure of its own would
  end it), requeued; b ends and a restarts on n1, the only healthy node.
  c arrives: n1 runs a, n0 is unhealthy: c waits (its reason names n0), 0 attempts.
  n0's check passes again: n0 is up, c starts on n0.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.core.cluster import Cluster, NodeDef
from corral.exec.local import LocalExecutor
from corral.server.boot import RunningServer, ServerOptions, _build_with
from corral.server.health import HealthSettings
from tests.server.helpers import (
    admin_token,
    api,
    attempt_nodes,
    fast_settings,
    job,
    kill_jobs_of,
    nodes,
    python_job,
    submit,
    wait_for,
    wait_until,
)
from tests.server.test_nodes_live import run_built

CHECK = """\
import os, pathlib, sys
flags = pathlib.Path(sys.argv[1])
node = os.environ["CORRAL_NODE"]
with open(flags / f"ran-{node}", "a") as ran:
    ran.write("x")
sick = flags / f"sick-{node}"
if sick.exists():
    text = sick.read_text()
    if text:
        print(text)
        print("a second line, never the reason")
    sys.exit(1)
"""

CONFIG = """\
cell_types:
  NODE: {child: gpu, count: 1, node: true}
physical_cells:
  - {type: NODE, names: [n0, n1]}
"""


@pytest.fixture
def flags(tmp_path: Path) -> Path:
    folder = tmp_path / "flags"
    folder.mkdir()
    return folder


@pytest.fixture
def server(tmp_path: Path, flags: Path) -> Iterator[RunningServer]:
    script = tmp_path / "check.py"
    script.write_text(CHECK)
    command = f"{sys.executable} {script} {flags}"
    health = HealthSettings.parse(command, every_s=0.3, timeout_s=20.0)
    data_dir = tmp_path / "corral"
    data_dir.mkdir()
    settings = fast_settings(policy="fifo", placement="consolidate", health=health)
    options = ServerOptions(data_dir=data_dir, settings=settings, single_user=True)
    cluster = Cluster.from_nodes([NodeDef("n0", 1, "gpu"), NodeDef("n1", 1, "gpu")])
    running = run_built(_build_with(options, LocalExecutor(), cluster, None))
    try:
        yield running
    finally:
        try:
            running.stop()
        finally:
            kill_jobs_of(data_dir)


def until_file(name: str, path: Path, **fields: Any) -> dict[str, Any]:
    code = f"import os, time\nwhile not os.path.exists({str(path)!r}): time.sleep(0.05)"
    return python_job(name, code, **fields)


def flip(path: Path, text: str) -> None:
    """Make the check fail with `text`, at once (a check never reads it half-written)."""
    partial = path.with_name(path.name + ".part")
    partial.write_text(text)
    partial.rename(path)


def checked(flags: Path, node: str) -> int:
    ran = flags / f"ran-{node}"
    return len(ran.read_text()) if ran.exists() else 0


def node_cli(server: RunningServer, *args: str) -> subprocess.CompletedProcess[str]:
    token = admin_token(server.manager.data_dir)
    env = {**os.environ, "CORRAL_URL": server.url, "CORRAL_TOKEN": token}
    return subprocess.run(
        [sys.executable, "-m", "corral.cli", "node", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_unhealthy_node_requeues_its_job_elsewhere_and_comes_back_when_its_check_passes(
    server: RunningServer, flags: Path, tmp_path: Path
) -> None:
    client = api(server.url, admin_token(server.manager.data_dir))
    wait_until(lambda: checked(flags, "n0") and checked(flags, "n1"), "the first checks")
    assert {name: view["state"] for name, view in nodes(client).items()} == {
        "n0": "up",
        "n1": "up",
    }
    go_a, go_b, go_c = (tmp_path / f"go-{name}" for name in "abc")
    a = submit(client, **until_file("a", go_a, max_retries=0))
    wait_for(client, a, ["RUNNING"])
    b = submit(client, **until_file("b", go_b))
    wait_for(client, b, ["RUNNING"])
    assert (attempt_nodes(client, a), attempt_nodes(client, b)) == (["n0"], ["n1"])

    flip(flags / "sick-n0", "XID 79: GPU has\x07 fallen off the bus\n")
    wait_until(lambda: nodes(client)["n0"]["state"] == "unhealthy", "n0 unhealthy")
    view = nodes(client)["n0"]
    # The first line, its control character made a space; the second line is not the reason.
    assert view["reason"] == "XID 79: GPU has fallen off the bus", view
    found = wait_for(client, a, ["PENDING"])
    assert (found["failures"], found["status"]) == (0, "PENDING"), found
    wait_until(
        lambda: job(client, a)["attempt_history"][0]["state"] == "ended", "a's first attempt ended"
    )
    first = job(client, a)["attempt_history"][0]
    assert first["outcome"] == "lost", first
    assert first["reason"] == "node n0 unhealthy: XID 79: GPU has fallen off the bus", first
    view = nodes(client)["n0"]  # a's processes are gone: its idle GPU is held, not free
    assert (view["gpus_free"], view["gpus_held"], view["jobs"]) == (0, 1, []), view

    go_b.touch()  # n1 frees: a restarts there, the only healthy node
    wait_for(client, b)
    found = wait_for(client, a, ["RUNNING"])
    assert attempt_nodes(client, a) == ["n0", "n1"]
    assert (found["failures"], found["attempts"]) == (0, 2), found

    c = submit(client, **until_file("c", go_c))
    ran = checked(flags, "n0")
    wait_until(lambda: checked(flags, "n0") >= ran + 2, "two more checks of n0")
    found = job(client, c)
    assert (found["status"], found["attempts"]) == ("PENDING", 0), found
    assert "node n0 is unhealthy (XID 79" in found["reason"], found["reason"]
    listed = node_cli(server, "ls")
    assert listed.returncode == 0, listed.stderr
    row = next(line.split() for line in listed.stdout.splitlines() if line.startswith("n0"))
    assert row[1] == "unhealthy" and "XID" in listed.stdout, listed.stdout
    metrics = client.get("/metrics")
    assert 'corral_node_state{node="n0",state="unhealthy"} 1.0' in metrics.text
    shown = {n["name"]: n for n in client.get("/api/v1/cluster").json()["nodes"]}  # dashboard
    assert (shown["n0"]["state"], shown["n1"]["state"]) == ("unhealthy", "up"), shown

    (flags / "sick-n0").unlink()  # the check passes again: n0 is back, c starts there
    found = wait_for(client, c, ["RUNNING"])
    assert attempt_nodes(client, c) == ["n0"]
    assert nodes(client)["n0"]["state"] == "up"
    go_a.touch()
    go_c.touch()
    assert wait_for(client, a)["status"] == "SUCCEEDED"
    assert wait_for(client, c)["status"] == "SUCCEEDED"
    states = [(row.node, row.state, row.reason) for row in server.manager.store.node_changes()]
    assert [s for s in states if s[1] in ("unhealthy", "healthy")] == [
        ("n0", "unhealthy", "XID 79: GPU has fallen off the bus"),
        ("n0", "healthy", "check passed"),
    ]


def test_an_admin_resume_brings_an_unhealthy_node_back_until_its_check_fails_again(
    server: RunningServer, flags: Path
) -> None:
    client = api(server.url, admin_token(server.manager.data_dir))
    flip(flags / "sick-n1", "")  # no output: the exit code is the reason
    wait_until(lambda: nodes(client)["n1"]["state"] == "unhealthy", "n1 unhealthy")
    assert nodes(client)["n1"]["reason"] == "health check exited 1"
    # Resumed by an admin while its check still fails: up at once, unhealthy at the next check.
    resumed = node_cli(server, "resume", "n1")
    assert resumed.returncode == 0 and resumed.stdout == "node n1 up\n", resumed.stderr
    wait_until(lambda: nodes(client)["n1"]["state"] == "unhealthy", "n1 unhealthy again")
    (flags / "sick-n1").unlink()  # its check passes: back
    wait_until(lambda: nodes(client)["n1"]["state"] == "up", "n1 healthy")
    states = [row.state for row in server.manager.store.node_changes() if row.node == "n1"]
    assert states == ["joined", "unhealthy", "resumed", "unhealthy", "healthy"], states
    refused = node_cli(server, "resume", "n1")
    assert refused.returncode == 1 and "node n1 is not drained (nor unhealthy)" in refused.stderr


def test_up_refuses_bad_health_check_flags_in_one_line(tmp_path: Path) -> None:
    def up(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "corral.cli", "up", "--gpus", "1", *args]
        command += ["--data-dir", str(tmp_path / "d"), "--port", "1"]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    for args, message in (
        (("--health-check", "check 'unclosed"), "--health-check: health check command:"),
        (("--health-check", "true", "--health-every-s", "0"), "every_s: must be a positive"),
        (("--health-every-s", "5"), "--health-every-s, --health-timeout-s: need --health-check"),
    ):
        done = up(*args)
        assert done.returncode != 0 and message in done.stderr, (args, done.stderr)
        assert done.stderr.strip().count("\n") == 0, done.stderr
    config = tmp_path / "cluster.yaml"
    config.write_text(CONFIG + 'health_check: {command: "true", every_s: -1}\n')
    done = up("--config", str(config))
    assert done.returncode != 0 and "health_check.every_s" in done.stderr, done.stderr
