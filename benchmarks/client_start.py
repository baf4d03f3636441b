"""How long the client commands take to start and answer, against a bare interpreter's start.

Starts a real `corral up` (127.0.0.1, a temporary data directory, the local executor with 2
declared GPUs, this interpreter: it needs corral[server]), takes both GPUs with one sleeping job so
that the jobs it submits wait (no job process competes with the timed commands for the CPU), then
times, as a shell runs them (stdout to /dev/null), `python -c pass`, `corral ls`, `corral submit
--help`, `corral submit job.yaml` (a real submission), `corral describe JOB` and `corral logs
JOB`, each --runs times, and prints each one's median and its ratio to the bare interpreter's
median (the target: 2x or less; on an idle machine 100 ms or less), and the same of the CPU the
process used (user + system), which a busy machine inflates less than the time.

Several setups may be timed against the same manager, their runs interleaved (one run of each
setup in turn), so that their figures come from the same minutes: `--setup LABEL=PYTHON` times
`corral` as installed beside PYTHON (its console script), `--setup LABEL=PYTHON:PATH` with
PYTHONPATH=PATH (another checkout's sources with the same interpreter; refused where PYTHON has
corral installed in editable mode, which PYTHONPATH does not override). Two checkouts compare
best as two client-only installs (scripts/fresh_client_install.sh makes one). The bare start of each
setup is its own PYTHON's (with its PYTHONPATH), as the site packages differ from one virtualenv
to the next. Without --setup: this interpreter's `corral`.

Run: python benchmarks/client_start.py [--runs 21] [--setup new=.venv/bin/python ...]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

START_S = 180.0


@dataclass
class Setup:
    label: str
    python: str
    pythonpath: str | None = None
    times: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)  # the child's user + system

    @property
    def corral(self) -> list[str]:
        """The console script pip installed beside the interpreter (as a user runs `corral`)."""
        script = Path(self.python).parent / "corral"
        if script.is_file():
            return [self.python, str(script)]
        return [self.python, "-m", "corral.cli"]

    def env(self, base: dict[str, str]) -> dict[str, str]:
        env = dict(base)
        env.pop("PYTHONPATH", None)
        # Sources on PYTHONPATH (or an editable install) are compiled on every run without
        # their .pyc files: a user's install has them.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        if self.pythonpath:
            env["PYTHONPATH"] = self.pythonpath
        return env


def parse_setup(text: str) -> Setup:
    label, sep, rest = text.partition("=")
    if not sep or not label or not rest:
        raise argparse.ArgumentTypeError(f"--setup {text!r}: expected LABEL=PYTHON[:PYTHONPATH]")
    python, _, path = rest.partition(":")
    python = os.path.abspath(python) if os.sep in python else python
    return Setup(label, python, os.path.abspath(path) if path else None)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def call(url: str, token: str, method: str, path: str, body: object = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{url}/api/v1{path}",
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read() or b"null")


@contextmanager
def corral_up(data_dir: Path, gpus: int) -> Iterator[tuple[str, str]]:
    """`corral up` from this interpreter; yields (URL, admin token) once it answers."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (data_dir.parent / "up.log").open("ab")
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "corral.cli", "up", "--data-dir", str(data_dir)]
        + ["--port", str(port), "--gpus", str(gpus), "--single-user"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        deadline = time.monotonic() + START_S
        token_file = data_dir / "admin.token"
        while True:
            if process.poll() is not None:
                tail = Path(log.name).read_text().strip().splitlines()[-5:]
                raise SystemExit(f"corral up exited with {process.returncode}: " + "\n".join(tail))
            if token_file.is_file():
                token = token_file.read_text().strip()
                try:
                    call(url, token, "GET", "/whoami")
                    break
                except (OSError, urllib.error.URLError):
                    pass
            if time.monotonic() > deadline:
                raise SystemExit(f"corral up did not answer within {START_S:g} s")
            time.sleep(0.1)
        yield url, token
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def timed_once(argv: list[str], env: dict[str, str], cwd: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child): the CPU is less sensitive to the load, which
    delays a process more than it makes it work more."""
    start = time.perf_counter()
    child = subprocess.Popen(
        argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    assert child.stderr is not None
    errors = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    elapsed = time.perf_counter() - start
    child.stderr.close()
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {child.returncode}: {errors.decode()}")
    return elapsed, usage.ru_utime + usage.ru_stime


def check_source(setup: Setup) -> None:
    """A setup with a PYTHONPATH must load corral from there: an editable install of corral
    beside PYTHON takes precedence over PYTHONPATH, and the figures would be that install's."""
    if not setup.pythonpath:
        return
    where = subprocess.run(
        [setup.python, "-c", "import corral; print(corral.__file__)"],
        env=setup.env(dict(os.environ)),
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.strip()
    if not where.startswith(setup.pythonpath):
        raise SystemExit(
            f"--setup {setup.label}: {setup.python} loads corral from {where or '(nowhere)'}, "
            f"not from {setup.pythonpath} (an editable install wins over PYTHONPATH: use an "
            "interpreter without corral installed, or install each checkout in a venv of its own)"
        )


def load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21, help="runs of each command")
    parser.add_argument(
        "--setup",
        type=parse_setup,
        action="append",
        default=[],
        metavar="LABEL=PYTHON[:PYTHONPATH]",
        help="a `corral` to time (repeatable; their runs interleaved)",
    )
    args = parser.parse_args()
    setups: list[Setup] = args.setup or [Setup("corral", sys.executable)]
    for setup in setups:
        check_source(setup)
    with tempfile.TemporaryDirectory(prefix="corral-client-start-") as tmp:
        data_dir = Path(tmp) / "data"
        job = Path(tmp) / "job.yaml"
        job.write_text("name: quick\ngpus: 1\ncommand: 'true'\n")
        with corral_up(data_dir, 2) as (url, token):
            blocker = call(
                url, token, "POST", "/jobs", {"name": "blocker", "gpus": 2, "command": "sleep 3600"}
            )
            blocker_id = str(blocker["id"])  # type: ignore[index]
            while call(url, token, "GET", f"/jobs/{blocker_id}")["status"] != "RUNNING":  # type: ignore[index]
                time.sleep(0.1)
            commands = {
                "python -c pass": None,
                "corral ls": ["ls"],
                "corral submit --help": ["submit", "--help"],
                "corral submit job.yaml": ["submit", str(job)],
                "corral describe JOB": ["describe", blocker_id],
                "corral logs JOB": ["logs", blocker_id],
            }
            base = os.environ | {"CORRAL_URL": url, "CORRAL_TOKEN": token}
            load_before = load()
            started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
            for _ in range(args.runs):
                for label, argv in commands.items():
                    for setup in setups:
                        full = [setup.python, "-c", "pass"] if argv is None else setup.corral + argv
                        elapsed, cpu = timed_once(full, setup.env(base), tmp)
                        setup.times.setdefault(label, []).append(elapsed)
                        setup.cpu.setdefault(label, []).append(cpu)
            load_after = load()
            for waiting in call(url, token, "GET", "/jobs?limit=10000"):  # type: ignore[union-attr]
                if waiting["status"] in ("PENDING", "RUNNING"):
                    call(url, token, "POST", f"/jobs/{waiting['id']}/cancel")
    print(
        f"client_start: {args.runs} runs each, interleaved; {os.cpu_count()} CPUs; started "
        f"{started}; load average {load_before} before, {load_after} after"
    )
    width = max(len(label) for label in commands)
    for setup in setups:
        where = setup.python + (f" PYTHONPATH={setup.pythonpath}" if setup.pythonpath else "")
        print(f"  {setup.label}: {where}")
        bare = statistics.median(setup.times["python -c pass"])
        bare_cpu = statistics.median(setup.cpu["python -c pass"])
        print(f"    {'command':<{width}}  median     min  ratio    CPU  ratio")
        for label in commands:
            ms = [t * 1000 for t in setup.times[label]]
            median = statistics.median(ms)
            cpu = statistics.median(setup.cpu[label])
            print(
                f"    {label:<{width}}  {median:5.0f} ms {min(ms):4.0f} ms "
                f"{median / (bare * 1000):5.2f}x {cpu * 1000:4.0f} ms {cpu / bare_cpu:5.2f}x"
            )


if __name__ == "__main__":
    main()
