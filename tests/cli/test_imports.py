"""corral.cli has no import cycle (main names the modules that hold commands, never the reverse),
and the client commands import nothing heavy."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import corral.cli

CLI_DIR = Path(corral.cli.__file__).parent
#: Every module of corral.cli but main (which registers the others' commands) and __main__ (which
#: runs main).
MODULES = sorted(
    path.stem for path in CLI_DIR.glob("*.py") if path.stem not in ("main", "__main__")
)


def imported_modules(path: Path) -> set[str]:
    """The modules a file imports anywhere (inside functions too): `from a.b import c` names
    both a.b and a.b.c, since c may be a module."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_modules_are_found() -> None:
    assert {"common", "client", "up", "fgd"} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_no_module_imports_main(module: str) -> None:
    assert "corral.cli.main" not in imported_modules(CLI_DIR / f"{module}.py")


@pytest.mark.parametrize("module", MODULES)
def test_each_module_imports_alone_without_main(module: str) -> None:
    """Imported first, in a fresh interpreter, a module loads without corral.cli.main."""
    check = (
        "import importlib, sys\n"
        f"importlib.import_module('corral.cli.{module}')\n"
        "loaded = sorted(name for name in sys.modules if name.startswith('corral.cli.'))\n"
        "assert 'corral.cli.main' not in loaded, loaded\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


def test_main_imports_no_command_module_when_loaded() -> None:
    """main names the commands' modules in its table; at import it loads none of them (its
    functions import corral.cli.tools when a typer command runs)."""
    tree = ast.parse((CLI_DIR / "main.py").read_text())
    top = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
    names = {alias.name for node in top for alias in node.names} | {
        node.module for node in top if isinstance(node, ast.ImportFrom) and node.module
    }
    assert not any(name.startswith("corral") for name in names), names
    assert "__import__" not in (CLI_DIR / "main.py").read_text()


def test_every_command_in_the_table_resolves() -> None:
    """Each COMMANDS entry is a click command (or one of corral.cli.tools' typer commands),
    and `corral --help` lists them all in the table's order."""
    import click
    import typer.main

    from corral.cli.main import COMMANDS, TOOLS, app
    from corral.cli.tools import app as tools

    typer_names = set(typer.main.get_command(tools).list_commands(None))  # type: ignore[arg-type]
    for name, (where, short_help) in COMMANDS.items():
        assert short_help.endswith(".") and len(short_help) <= 60, name
        if where == TOOLS:
            assert name in typer_names, name
        else:
            assert isinstance(app.get_command(None, name), click.Command), name  # type: ignore[arg-type]
    assert typer_names <= set(COMMANDS)  # none of the typer commands is left unreachable
    listed = CliRunner().invoke(app, ["--help"]).output
    order = [line.split()[0] for line in listed.split("Commands:")[1].splitlines() if line]
    assert order == list(COMMANDS)


#: What the client commands never import: the core, the server, numpy, typer, rich, httpx,
#: pydantic; and the standard library's HTTP client, whose answers' headers are parsed by the
#: `email` package and which loads `ssl` for a plain-http URL too (about 30 ms of a call that
#: takes some 100: corral.wire is its replacement), nor the "idna" codec a str host name costs.
HEAVY = (
    "numpy",
    "corral.core",
    "corral.server",
    "corral.sim",
    "typer",
    "rich",
    "httpx",
    "pydantic",
    "http",
    "email",
    "ssl",
    "encodings.idna",
)


def loaded_after(args: list[str], env: dict[str, str] | None = None) -> tuple[set[str], str]:
    """The modules loaded by `corral ARGS` run in a fresh interpreter (and its output)."""
    code = (
        "import sys, atexit\n"
        "atexit.register(lambda: sys.stderr.write('MODULES ' + ' '.join(sys.modules) + '\\n'))\n"
        "from corral.cli.main import run\n"
        f"sys.argv = ['corral', *{args!r}]\n"
        "run()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    line = next(line for line in done.stderr.splitlines() if line.startswith("MODULES "))
    return set(line.split()[1:]), done.stdout + done.stderr


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY or m.startswith(HEAVY))


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["submit", "--help"],
        ["ls"],
        ["queue", "-o", "json"],
        ["describe", "7"],
        ["vc", "ls", "-o", "yaml"],
        ["submit", "--gpus", "1", "--", "python", "train.py"],
    ],
)
def test_the_client_path_imports_nothing_heavy(args: list[str]) -> None:
    """A client command (here refused: nothing listens on port 1) loads neither the scheduling
    core, the server, numpy, typer, rich, httpx, pydantic nor http.client, email or ssl."""
    modules, output = loaded_after(args, {"CORRAL_URL": "http://127.0.0.1:1"})
    assert "corral.cli.client" in modules or args == ["--help"], output
    assert heavy(modules) == [], output


def test_a_request_imports_no_http_client(tmp_path: Path) -> None:
    """A command that is answered (a listening socket that answers every request with a
    job list) loads corral.wire and the socket module, not http.client, email or ssl; ssl is
    loaded only to wrap a connection made to an https URL (here refused at once: port 1)."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        modules, output = loaded_after(["ls"], {"CORRAL_URL": f"http://127.0.0.1:{port}"})
    finally:
        thread.join(timeout=60)
        listener.close()
    assert "no jobs" in output, output
    assert {"corral.wire", "socket"} <= modules, output
    assert heavy(modules) == [], output
    modules, output = loaded_after(["ls"], {"CORRAL_URL": "https://127.0.0.1:1"})
    assert "cannot reach corral at https://127.0.0.1:1" in output, output
    assert heavy(modules) == [], output  # refused before TLS: ssl is loaded only to wrap


def test_a_typer_command_still_runs_through_main() -> None:
    modules, output = loaded_after(["config", "--help"])
    assert "Usage: corral config" in output
    assert "typer" in modules


def blas_threads_after(args: list[str], env: dict[str, str]) -> tuple[str, int, str]:
    """OPENBLAS_NUM_THREADS as `corral ARGS` left it, and the threads numpy then runs (numpy
    imported at exit, if the command had not), in a fresh interpreter."""
    code = (
        "import os, sys, atexit\n"
        "def report():\n"
        "    import numpy\n"
        "    threads = len(os.listdir('/proc/self/task'))\n"
        "    sys.stderr.write(f\"BLAS {os.environ.get('OPENBLAS_NUM_THREADS', '-')} {threads}\\n\")\n"
        "atexit.register(report)\n"
        "from corral.cli.main import run\n"
        f"sys.argv = ['corral', *{args!r}]\n"
        "run()\n"
    )
    base = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=base | env
    )
    line = next(line for line in done.stderr.splitlines() if line.startswith("BLAS "))
    _, value, threads = line.split()
    return value, int(threads), done.stdout + done.stderr


@pytest.mark.skipif(
    not Path("/proc/self/task").is_dir() or (os.cpu_count() or 1) < 2, reason="needs Linux, 2 CPUs"
)
def test_the_simulator_runs_blas_on_one_thread() -> None:
    """`corral simulate` (and the simulator's other commands) set OPENBLAS_NUM_THREADS=1 before
    numpy loads: its BLAS starts no thread (OpenBLAS's spin while idle, some 100 ms of CPU of a
    run's start). A client command sets nothing; a value the user gave is kept."""
    value, threads, output = blas_threads_after(["simulate", "--help"], {})
    assert "Usage: corral simulate" in output
    assert (value, threads) == ("1", 1), output
    value, threads, output = blas_threads_after(
        ["simulate", "--help"], {"OPENBLAS_NUM_THREADS": "2"}
    )
    assert (value, threads) == ("2", 2), output
    value, threads, output = blas_threads_after(["--help"], {})
    assert value == "-" and threads > 1, output  # (numpy's default: a thread per CPU)


#: What `corral simulate` on a cluster of one GPU type (the --cluster shorthand) imports before
#: its first event: none of these. numpy comes with what uses it (heterogeneous placement,
#: failures' random draws, deadlines, the summary's percentiles after the run), pydantic with a
#: cluster config file (corral.core.config's models) and typer with `--help` or a line typer
#: must read (corral.cli.simargs); some 350 ms of CPU of a start that takes under 300 without.
#: rich comes with the summary's table after the run: piped, the first line is written without it
#: and no progress bar is drawn (corral.cli.common.LazyConsole).
SIM_START_NEVER = ("numpy", "pydantic", "pydantic_core", "typer", "scipy", "yaml", "rich")
#: The plugins a run of `las` with `relax` and no admission does not run: their registries import
#: a plugin when it is read (corral.core.registry), their options apart.
UNUSED_PLUGINS = (
    "corral.core.policy.fifo",
    "corral.core.policy.gittins",
    "corral.core.policy.optimus",
    "corral.core.policy.timeslice",
    "corral.core.policy.edf",
    "corral.core.policy.shortest",
    "corral.core.placement.hetero",
    "corral.core.placement.sharing",
    "corral.core.placement.yarn",
    "corral.core.placement.cacheaware",
    "corral.core.admission.quota",
    "corral.core.admission.queues",
    "corral.core.admission.hived",
    "corral.core.admission.fairshare",
    "corral.core.admission.elasticflow",
    "corral.core.packing",
    "corral.core.migration",
)
#: What else such a run imports where it is used, not at its start: presets (with --preset),
#: private clusters (--private-baseline), the help's plugin lists, pickle (--workers), the
#: data caches (--cache-gb-per-node) and the fragmentation probe (jobs that share GPUs).
USED_ONLY_WHERE_NEEDED = (
    "corral.core.presets",
    "corral.core.vcluster",
    "corral.cli.registries",
    "pickle",
    "corral.core.cache",
    "corral.sim.fragmentation",
)


def loaded_at_first_event(args: list[str]) -> tuple[set[str], str]:
    """The modules loaded when `corral simulate ARGS` (a fresh interpreter) begins its first
    simulation, which it then leaves (nothing run, nothing written)."""
    code = (
        "import os, sys\n"
        "import corral.sim.engine as engine\n"
        "def run(self, *args, **kwargs):\n"
        "    sys.stderr.write('MODULES ' + ' '.join(sys.modules) + '\\n')\n"
        "    sys.stderr.flush()\n"
        "    os._exit(0)\n"
        "engine.Simulation.run = run\n"
        "from corral.cli.main import run\n"
        f"sys.argv = ['corral', 'simulate', *{args!r}]\n"
        "run()\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    lines = [line for line in done.stderr.splitlines() if line.startswith("MODULES ")]
    assert lines, done.stdout + done.stderr
    return set(lines[0].split()[1:]), done.stdout + done.stderr


def test_a_simulation_starts_without_numpy_pydantic_or_typer(tmp_path: Path) -> None:
    trace = Path(__file__).parents[1] / "sim" / "fixtures" / "tiresias-300.csv"
    args = ["--trace", f"tiresias:{trace}", "--cluster", "8x8", "--policy", "las"]
    modules, output = loaded_at_first_event([*args, "--out", str(tmp_path)])
    assert "300 jobs on 8 nodes" in output  # (it read the trace and built the cluster)
    assert "corral.sim.runner" in modules, output
    loaded = sorted(m for m in modules if m.split(".")[0] in SIM_START_NEVER)
    assert loaded == [], loaded
    assert {"corral.core.policy.las", "corral.core.placement.named"} <= modules
    assert sorted(set(UNUSED_PLUGINS) & modules) == []
    assert sorted(set(USED_ONLY_WHERE_NEEDED) & modules) == []
