"""Packages by role: `pip install corral` is the client (the client commands, the SDK and
corral.progress with its callbacks), with no server, database or numeric package; the manager is
`corral[server]`, the simulator `corral[sim]`, the Ray executor `corral[ray]`.

Two sides are checked. What the client imports: each client command runs in a fresh interpreter
(the installed `corral` script, as a user runs it) under a guard, a sys.meta_path finder first in
line that refuses, as if they were not installed, the manager's and the simulator's packages and
corral's own server-side parts when corral's code (or the command line) asks for them, and records
each such attempt; a real `corral submit`, `ls`, `describe` and `logs -f` run that way against a
live manager. What the base install brings: the wheel's metadata, built from pyproject.toml, and
the closure of its requirements must hold every distribution the client commands loaded, and
none of the manager's. scripts/fresh_client_install.sh does the same from a fresh virtualenv.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.building import source_copy
from tests.cli.blocking import blocking_env
from tests.server.helpers import Corral, api, kill_jobs_of, wait_for

ROOT = Path(__file__).resolve().parents[1]
#: The manager's, the database's and the numeric packages (import names): never the client's.
FORBIDDEN = (
    "fastapi",
    "starlette",
    "sqlalchemy",
    "alembic",
    "uvicorn",
    "numpy",
    "scipy",
    "matplotlib",
    "sortedcontainers",
    "prometheus_client",
    "psycopg",
    "ray",
    "typer",
    "rich",
)
#: corral's own parts that belong to the manager or the simulator (and import the above).
FORBIDDEN_CORRAL = ("corral.core", "corral.server", "corral.sim", "corral.exec")
#: The distributions of the manager's extra that the base install must not bring.
SERVER_DISTRIBUTIONS = (
    "fastapi",
    "starlette",
    "sqlalchemy",
    "alembic",
    "uvicorn",
    "numpy",
    "sortedcontainers",
    "prometheus-client",
    "nvidia-ml-py",
    "typer",
    "rich",
    "scipy",
    "matplotlib",
    "psycopg",
    "ray",
    "torch",
)

GUARD = '''
import atexit, json, os, sys

_FORBIDDEN = frozenset(FORBIDDEN)
_FORBIDDEN_CORRAL = tuple(FORBIDDEN_CORRAL)
_attempts = []


def _importer():
    """The module whose code asked for the import (the import system's own frames skipped)."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not (name.startswith(("importlib", "_frozen_importlib")) or name == "__guard__"):
            return name
        frame = frame.f_back
    return "?"


class _ClientGuard:
    """Refuses the manager's packages to corral's code and the command line, as if they were
    not installed, and records each attempt (a refused import that corral's code caught too)."""

    def find_spec(self, name, path=None, target=None):
        forbidden_corral = name.startswith(_FORBIDDEN_CORRAL)
        if not forbidden_corral and "." in name:
            return None  # a submodule: its package was let through (or refused) already
        if forbidden_corral or name in _FORBIDDEN:
            importer = _importer()
            if forbidden_corral or importer == "__main__" or importer.startswith("corral"):
                _attempts.append([name, importer])
                raise ModuleNotFoundError(f"No module named {name!r} (client guard)", name=name)
        return None


_at_start = {name.partition(".")[0] for name in sys.modules}  # the interpreter's, the .pth's


def _write():
    loaded = sorted({name.partition(".")[0] for name in sys.modules} - _at_start)
    with open(os.environ["CORRAL_GUARD_OUT"], "a") as out:
        out.write(json.dumps({"attempts": _attempts, "loaded": loaded}) + "\\n")


sys.meta_path.insert(0, _ClientGuard())
atexit.register(_write)
'''


def guard_env(directory: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """A child Python's environment with the guard installed by a sitecustomize.py."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(
        f"__name__ = '__guard__'\nFORBIDDEN = {list(FORBIDDEN)!r}\n"
        f"FORBIDDEN_CORRAL = {list(FORBIDDEN_CORRAL)!r}\n{GUARD}"
    )
    env = dict(base if base is not None else os.environ)
    paths = [str(directory), str(ROOT), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)
    env["CORRAL_GUARD_OUT"] = str(directory / "guard.jsonl")
    return env


def guard_report(env: dict[str, str]) -> dict[str, list]:
    """What the guard saw in every child since the last call: attempts and loaded packages."""
    out = Path(env["CORRAL_GUARD_OUT"])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    out.unlink()
    assert records, "the guard wrote nothing: it was not installed"
    return {
        "attempts": [attempt for record in records for attempt in record["attempts"]],
        "loaded": sorted({name for record in records for name in record["loaded"]}),
    }


def corral_command() -> list[str]:
    """The installed `corral` script beside this interpreter (as a user runs it), else -m."""
    script = Path(sys.executable).parent / "corral"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "corral.cli"]


def run(
    args: list[str], env: dict[str, str], cwd: Path, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)


# -- the guard itself ---------------------------------------------------------------------------


def test_the_guard_refuses_and_records_what_corral_s_code_imports(tmp_path: Path) -> None:
    """The check must fail when the client path imports the manager: code running as a corral
    module imports numpy, and the command line imports corral.server.schemas; both are refused
    and recorded. numpy imported by a third-party package (a framework's module, as Lightning's
    own) is not corral's doing and passes."""
    env = guard_env(tmp_path / "guard")
    code = (
        "import types, sys\n"
        "corral_code = types.ModuleType('corral.cli.fake')\n"
        "try:\n"
        "    exec('import numpy', corral_code.__dict__)\n"
        "except ModuleNotFoundError as error:\n"
        "    print('refused:', error.name)\n"
        "try:\n"
        "    import corral.server.schemas\n"
        "except ModuleNotFoundError as error:\n"
        "    print('refused:', error.name)\n"
        "framework = types.ModuleType('lightning.fake')\n"
        "exec('import numpy', framework.__dict__)\n"
        "print('framework imported', sys.modules['numpy'].__name__)\n"
    )
    done = run([sys.executable, "-c", code], env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "refused: numpy",
        "refused: corral.server",
        "framework imported numpy",
    ]
    report = guard_report(env)
    assert report["attempts"] == [["numpy", "corral.cli.fake"], ["corral.server", "__main__"]]


# -- what the client commands import --------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["ls", "--help"],
        ["submit", "--help"],
        ["logs", "--help"],
        ["describe", "--help"],
        ["queue", "--help"],
        ["cancel", "--help"],
        ["hold", "--help"],
        ["usage", "--help"],
        ["node", "ls", "--help"],
        ["reservation", "ls", "--help"],
        ["completion", "bash"],
    ],
    ids=lambda args: " ".join(args),
)
def test_the_client_commands_start_without_the_manager(tmp_path: Path, args: list[str]) -> None:
    env = guard_env(tmp_path / "guard")
    done = run([*corral_command(), *args], env, tmp_path)
    assert done.returncode == 0, done.stderr
    report = guard_report(env)
    assert report["attempts"] == [], report
    assert not set(report["loaded"]) & set(FORBIDDEN)


def test_corral_progress_and_its_callbacks_import_without_the_manager(tmp_path: Path) -> None:
    """corral.progress reports a step, the SDK imports (with its models); the callbacks'
    modules import their framework only (which may import numpy itself: the framework's doing,
    not corral's), checked where the framework is installed."""
    modules = ["corral.progress", "corral.client"]
    for framework, module in (
        ("lightning", "corral.progress.lightning"),
        ("pytorch_lightning", "corral.progress.lightning"),
        ("transformers", "corral.progress.huggingface"),
    ):
        if importlib.util.find_spec(framework) is not None and module not in modules:
            modules.append(module)
    env = guard_env(tmp_path / "guard")
    env["CORRAL_PROGRESS_FILE"] = str(tmp_path / "progress.jsonl")
    code = f"import {', '.join(modules)}\ncorral.progress.report(step=3, total_steps=10)\n"
    done = run([sys.executable, "-c", code], env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert guard_report(env)["attempts"] == []


@pytest.fixture(scope="module")
def manager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A live `corral up` from this (full) environment: its URL and admin token."""
    base = tmp_path_factory.mktemp("manager")
    data_dir = base / "state"
    server = Corral(data_dir, "--gpus", "2")
    try:
        client = server.start()
        client.close()
        yield server.url, (data_dir / "admin.token").read_text().strip()
    finally:
        server.stop()
        kill_jobs_of(data_dir)


def test_submit_ls_describe_and_logs_follow_against_a_live_manager(
    tmp_path: Path, manager: tuple[str, str]
) -> None:
    """The client commands do their work, not only start: a job submitted from a spec file runs,
    `logs -f` follows it to its end, and nothing of the manager was imported on the way."""
    url, token = manager
    env = guard_env(tmp_path / "guard", os.environ | {"CORRAL_URL": url, "CORRAL_TOKEN": token})
    spec = tmp_path / "job.yaml"
    code = (
        "import time\nfor i in range(3):\n    print('line', i, flush=True)\n    time.sleep(0.5)\n"
    )
    spec.write_text(
        f"name: packaging\ngpus: 1\ncommand: [{json.dumps(sys.executable)}, -c, {json.dumps(code)}]\n"
    )
    corral = corral_command()
    submitted = run([*corral, "submit", str(spec)], env, tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split()[-1]
    assert re.fullmatch(r"[0-9a-z-]+", job_id), submitted.stdout
    followed = run([*corral, "logs", "-f", job_id], env, tmp_path, timeout=180)
    assert followed.returncode == 0, followed.stderr
    assert followed.stdout.splitlines() == ["line 0", "line 1", "line 2"]
    listed = run([*corral, "ls", "-o", "json"], env, tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert [job["id"] for job in json.loads(listed.stdout)] == [job_id]
    described = run([*corral, "describe", job_id], env, tmp_path)
    assert described.returncode == 0, described.stderr
    assert "SUCCEEDED" in described.stdout
    report = guard_report(env)
    assert report["attempts"] == [], report
    assert not set(report["loaded"]) & set(FORBIDDEN)
    with api(url, token) as client:
        assert wait_for(client, job_id)["status"] == "SUCCEEDED"


# -- what the base install brings ------------------------------------------------------------------


def built_requirements(tmp_path: Path) -> list[Requirement]:
    """Requires-Dist of the wheel pyproject.toml builds (setuptools' own metadata step)."""
    code = (
        "import sys, setuptools.build_meta as backend\n"
        "print(backend.prepare_metadata_for_build_wheel(sys.argv[1]))\n"
    )
    out = tmp_path / "metadata"
    out.mkdir()
    work = source_copy(tmp_path / "src")  # building writes corral.egg-info beside the sources
    done = subprocess.run(
        [sys.executable, "-c", code, str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=work,
    )
    assert done.returncode == 0, done.stderr
    metadata = (out / done.stdout.strip().splitlines()[-1] / "METADATA").read_text()
    return [
        Requirement(line.partition(":")[2].strip())
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:")
    ]


def extra_of(requirement: Requirement) -> str | None:
    if requirement.marker is None:
        return None
    found = re.search(r'extra == "([^"]+)"', str(requirement.marker))
    return found.group(1) if found else None


def closure(names: list[str]) -> set[str]:
    """The installed distributions `names` bring, their requirements followed (no extras)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        for line in importlib.metadata.requires(name) or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return seen


def test_the_base_install_brings_no_server_package_and_the_extras_do(tmp_path: Path) -> None:
    requirements = built_requirements(tmp_path)
    by_extra: dict[str | None, set[str]] = {}
    for requirement in requirements:
        by_extra.setdefault(extra_of(requirement), set()).add(canonicalize_name(requirement.name))
    base = by_extra[None]
    assert base == {"click", "pyyaml", "httpx", "pydantic"}
    brought = closure(sorted(base))
    assert not brought & set(SERVER_DISTRIBUTIONS), sorted(brought & set(SERVER_DISTRIBUTIONS))
    assert {"fastapi", "uvicorn", "sqlalchemy", "alembic", "numpy"} <= by_extra["server"]
    assert {"numpy", "scipy", "matplotlib", "sortedcontainers"} <= by_extra["sim"]
    assert {"corral", "ray"} <= by_extra["ray"]  # corral[server]: the executor runs in it
    ray_self = next(r for r in requirements if extra_of(r) == "ray" and r.name == "corral")
    assert ray_self.extras == {"server"}
    test_self = next(r for r in requirements if extra_of(r) == "test" and r.name == "corral")
    assert test_self.extras == {"server", "sim", "postgres", "ray"}


def test_the_client_loads_only_what_the_base_install_brings(
    tmp_path: Path, manager: tuple[str, str]
) -> None:
    """Every distribution a client command loaded (its top-level modules mapped to what
    installed them) comes with the base install's requirements: nothing it imports would be
    missing from `pip install corral`."""
    url, token = manager
    env = guard_env(tmp_path / "guard", os.environ | {"CORRAL_URL": url, "CORRAL_TOKEN": token})
    for args in (["ls"], ["queue"], ["vc", "ls"], ["submit", "--help"]):
        done = run([*corral_command(), *args], env, tmp_path)
        assert done.returncode == 0, done.stderr
    done = run([sys.executable, "-c", "import corral.progress, corral.client"], env, tmp_path)
    assert done.returncode == 0, done.stderr
    loaded = guard_report(env)["loaded"]
    owners = importlib.metadata.packages_distributions()
    third_party = sorted(
        {
            canonicalize_name(owner)
            for name in loaded
            if name not in sys.stdlib_module_names
            for owner in owners.get(name, [])
        }
        - {"corral"}
    )
    base = [str(r.name) for r in built_requirements(tmp_path) if extra_of(r) is None]
    assert set(third_party) <= closure(base), third_party


# -- the manager's and the simulator's commands on a client install ---------------------------


@pytest.mark.parametrize(
    ("args", "blocked", "expected"),
    [
        (["up", "--gpus", "2"], ("fastapi",), "corral up needs the server extra (fastapi missing)"),
        (
            ["export-trace", "--help"],
            ("sqlalchemy", "alembic"),
            "corral export-trace needs the server extra (sqlalchemy, alembic missing)",
        ),
        (
            ["config", "--help"],
            ("numpy",),
            "corral config needs the server extra (numpy missing)",
        ),
        (
            ["up", "--help"],
            ("numpy", "sortedcontainers", "typer", "rich", "uvicorn"),
            "corral up needs the server extra (numpy, sortedcontainers, typer, rich, uvicorn "
            "missing)",
        ),
        (
            ["up", "--gpus", "4", "--demo"],
            ("numpy", "sortedcontainers", "typer", "rich", "fastapi", "uvicorn", "sqlalchemy")
            + ("alembic", "prometheus_client", "scipy", "matplotlib"),
            "corral up needs the server extra",  # the client install: every package missing
        ),
    ],
    ids=["up", "export-trace", "config", "up-partial", "up-client-only"],
)
def test_a_command_without_its_extra_says_what_to_install(
    tmp_path: Path, args: list[str], blocked: tuple[str, ...], expected: str
) -> None:
    """As if the packages were not installed (tests/cli/blocking.py): one line, exit 2, the
    extra named, before anything of the command is imported (no traceback)."""
    done = run([sys.executable, "-m", "corral.cli", *args], blocking_env(tmp_path, *blocked), ROOT)
    hint = "pip install 'corral[server]' (from a checkout: pip install -e '.[server]')"
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"error: {expected}: {hint}\n")


def test_config_runs_with_either_extra(tmp_path: Path) -> None:
    """`corral config` reads the scheduling core only: the simulator's install (no FastAPI)
    runs it."""
    done = run(
        [sys.executable, "-m", "corral.cli", "config", "--help"],
        blocking_env(tmp_path, "fastapi", "uvicorn", "sqlalchemy", "alembic"),
        ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "Usage: corral config" in done.stdout
