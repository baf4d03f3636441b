"""The manager needs neither scipy nor matplotlib (they come with corral[sim]): with both made
unimportable, `corral up` starts and runs a job, its modules import, and the simulator's commands
say in one line what to install."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.blocking import blocking_env
from tests.server.helpers import Corral, kill_jobs_of, python_job, submit, wait_for

ROOT = Path(__file__).resolve().parents[2]
SIM = ("scipy", "matplotlib")


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=180, cwd=ROOT, env=env
    )


def test_the_blocking_works(tmp_path: Path) -> None:
    done = run(blocking_env(tmp_path, *SIM), "-c", "import scipy")
    assert done.returncode == 1 and "No module named 'scipy' (blocked" in done.stderr


def test_the_manager_s_modules_import_without_them(tmp_path: Path) -> None:
    check = (
        "import sys\n"
        "import corral.server.boot, corral.server.manager, corral.server.api, corral.cli.main\n"
        "import corral.core.placement\n"
        "print(sorted(m for m in sys.modules if m.partition('.')[0] in ('scipy', 'matplotlib')))\n"
    )
    done = run(blocking_env(tmp_path, *SIM), "-c", check)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[]\n"


def test_corral_up_help_without_them(tmp_path: Path) -> None:
    done = run(blocking_env(tmp_path, *SIM), "-m", "corral.cli", "up", "--help")
    assert done.returncode == 0, done.stderr
    assert "--data-dir" in done.stdout


def test_corral_up_runs_a_job_without_them(tmp_path: Path) -> None:
    data_dir = tmp_path / "state"
    server = Corral(data_dir, "--gpus", "2", env=blocking_env(tmp_path / "site", *SIM))
    try:
        client = server.start()
        try:
            job_id = submit(client, **python_job("hello", "print('hello')"))
            assert wait_for(client, job_id)["status"] == "SUCCEEDED"
        finally:
            client.close()
    finally:
        server.stop()
        kill_jobs_of(data_dir)
    assert "Traceback" not in server.log().read_text()


@pytest.mark.parametrize(
    "args",
    [
        ["simulate", "--trace", "synthetic:jobs=5,load=0.5,gpus=4", "--cluster", "1x8"],
        ["plot-vcs", "nowhere"],
        ["fgd", "--nodes", "n.csv", "--tasks", "t.csv", "--plot"],
    ],
    ids=["simulate", "plot-vcs", "fgd-plot"],
)
@pytest.mark.parametrize("blocked", [("scipy",), ("matplotlib",), SIM])
def test_the_simulator_says_what_to_install(
    tmp_path: Path, args: list[str], blocked: tuple[str, ...]
) -> None:
    """corral.cli.main finds the extra missing before it imports the command (one line, exit 2,
    naming the missing packages in the extra's order)."""
    done = run(blocking_env(tmp_path, *blocked), "-m", "corral.cli", *args)
    message = (
        f"error: corral {args[0]} needs the sim extra ({', '.join(blocked)} missing): "
        "pip install 'corral[sim]' (from a checkout: pip install -e '.[sim]')"
    )
    assert (done.returncode, done.stdout, done.stderr.strip()) == (2, "", message)


def test_the_hetero_placement_says_it_needs_scipy(tmp_path: Path) -> None:
    """hetero's min-cost matching is scipy's: without it `corral up` refuses in one line at
    start (not at its first round), and names what to install."""
    done = run(
        blocking_env(tmp_path, "scipy"),
        *("-m", "corral.cli", "up", "--gpus", "2", "--placement", "hetero"),
        *("--data-dir", str(tmp_path / "state"), "--port", "1"),
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: placement hetero: needs scipy, which comes with the sim extra "
        "(pip install -e '.[sim]')"
    ]
