"""`corral up` refuses bad settings with one line and exit code 2, before starting anything."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from corral.cli.main import app
from corral.exec.gpus import NoGpusError, discover_gpus

TWO_NODES = """\
cell_types:
  NODE: {child: gpu, count: 2, node: true}
physical_cells:
  - {type: NODE, count: 2}
"""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus", "0"], "--gpus: must be a positive integer"),
        (
            ["--gpus", "1", "--policy", "lottery"],
            "--policy: unknown policy 'lottery'; choose one of",
        ),
        (
            ["--gpus", "1", "--las-thresholds-gpu-s", "a,b"],
            "--las-thresholds-gpu-s: must be a finite",
        ),
        (["--gpus", "1", "--timeslice-quantum-s", "0"], "--timeslice-quantum-s: must be > 0"),
        (
            ["--gpus", "1", "--placement", "fgd", "--admission", "quota"],
            "admission quota does not run with placement fgd: it counts whole GPUs",
        ),
        (["--gpus", "1", "--gpu-memory", "lots"], "--gpu-memory: expected a size such as 1G"),
        (["--gpus", "1", "--gpu-memory", "0"], "--gpu-memory: must be at least 1M, got '0'"),
        (
            ["--gpus", "2", "--config", "/nonexistent.yaml"],
            "/nonexistent.yaml: cannot read the file",
        ),
        (["--gpus", "1", "--db", "nonsense://"], "nonsense://: cannot use this database"),
        (
            ["--gpus", "1", "--db", "postgresql+psycopg://nobody@127.0.0.1:1/x"],
            "cannot open the database",
        ),
    ],
)
def test_bad_settings_are_refused_in_one_line(
    tmp_path: Path, args: list[str], message: str
) -> None:
    result = CliRunner().invoke(app, ["up", "--data-dir", str(tmp_path / "d"), *args])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_a_config_of_several_nodes_is_refused_for_the_local_executor(tmp_path: Path) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text(TWO_NODES)
    result = CliRunner().invoke(
        app, ["up", "--data-dir", str(tmp_path / "d"), "--gpus", "4", "--config", str(config)]
    )
    assert result.exit_code == 2
    assert f"{config}: describes 2 nodes; the local executor runs jobs on this one machine" in (
        " ".join(result.output.split())
    )


def test_without_gpus_it_says_how_to_declare_them(tmp_path: Path) -> None:
    # Without an NVIDIA driver NVML is missing, and the message names the way out.
    try:
        discover_gpus(None)
    except NoGpusError:
        pass
    else:
        pytest.skip("this machine has GPUs: `corral up` would start")
    result = CliRunner().invoke(app, ["up", "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 2
    assert "pass --gpus N" in " ".join(result.output.split())


def test_a_port_in_use_is_refused(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(
            app, ["up", "--data-dir", str(tmp_path / "d"), "--gpus", "1", "--port", str(port)]
        )
    assert result.exit_code == 2
    assert f"--port {port}: cannot listen on 127.0.0.1:{port}" in " ".join(result.output.split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--executor", "slurm"], "--executor: unknown 'slurm'; choose one of: local, ray, inert"),
        (["--executor", "ray"], "--executor ray: needs --ray-address HOST:PORT"),
        (["--executor", "ray", "--ray-address", "head"], "--ray-address head: expected HOST:PORT"),
        (
            ["--executor", "ray", "--ray-address", "127.0.0.1:1"],
            "--ray-address 127.0.0.1:1: no Ray head answers there (Connection refused)",
        ),
        (
            ["--executor", "ray", "--ray-address", "127.0.0.1:1", "--gpus", "2"],
            "--executor ray: the GPUs are the Ray nodes' (no --gpus, no --demo)",
        ),
        (
            ["--executor", "ray", "--ray-address", "127.0.0.1:1", "--stages", "packing"],
            "--stages packing: runs with the local executor only",
        ),
    ],
)
def test_bad_ray_settings_are_refused_in_one_line(
    tmp_path: Path, args: list[str], message: str
) -> None:
    result = CliRunner().invoke(app, ["up", "--data-dir", str(tmp_path / "d"), *args])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
