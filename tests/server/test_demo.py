"""The README's main command: `corral up --gpus 4 --demo` runs its two-team story to the end."""

from __future__ import annotations

import os
from pathlib import Path

from click.testing import CliRunner

from corral.cli.main import app
from corral.server.demo import _train_script
from tests.server.helpers import kill_jobs_of


def test_the_training_script_is_found_beside_the_package_or_in_the_clone(tmp_path: Path) -> None:
    """An editable install finds examples/train.py beside its package; a non-editable one (the
    package in site-packages) under the directory the README runs the demo from."""
    clone, site = tmp_path / "clone", tmp_path / "venv" / "site-packages"
    (clone / "examples").mkdir(parents=True)
    (clone / "examples" / "train.py").write_text("")
    editable = clone / "corral" / "server" / "demo.py"
    installed = site / "corral" / "server" / "demo.py"
    assert _train_script(editable, tmp_path) == clone / "examples" / "train.py"
    assert _train_script(installed, clone) == clone / "examples" / "train.py"
    assert _train_script(installed, tmp_path) == tmp_path / "examples" / "train.py"  # missing


def test_the_demo_preempts_resumes_and_stops_a_user_error(tmp_path: Path) -> None:
    data_dir = tmp_path / "demo"
    try:
        result = CliRunner().invoke(
            app, ["up", "--gpus", "4", "--demo", "--data-dir", str(data_dir)]
        )
    finally:
        kill_jobs_of(data_dir)
    text = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert "/#token=" in text  # the dashboard's address, signed in
    assert "vit-base: preempted by bert-large" in text  # nlp took its lent GPUs back
    assert "vit-base, attempt 2: rank 0: resumed from step" in text
    assert "typo: user error: the same failure 3 times in a row" in text
    for name in ("resnet50", "vit-base", "bert-large"):
        assert f"{name}: attempt" in text and "exited 0" in text
    assert (data_dir / "corral.db").is_file()
    # Whose account the jobs ran as is said once: here root's, since pytest's tmp_path (root's,
    # 0700) is closed to nobody; not as root, the manager's own.
    assert sum(line.split()[:1] == ["jobs"] for line in result.output.splitlines()) == 1
    # In the words of a plain `corral up` (corral.server.identity), with the demo's reason.
    if os.geteuid() == 0:
        assert (
            "jobs single-user mode: corral runs as root for the demo: its account nobody cannot "
            "run its jobs here (" in text
        )
        assert "), so every job runs as root and can read and change anything" in text
    else:
        assert "jobs single-user mode: corral runs as" in text
