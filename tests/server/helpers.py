"""Starting a real manager (SQLite file, local executor, HTTP on 127.0.0.1) for the tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import httpx

from corral.core.framework import config_from_mapping
from corral.exec.local import kill_attempt
from corral.server.boot import RunningServer, ServerOptions, build_manager
from corral.server.manager import Manager, ManagerSettings

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "train.py"
FINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
#: Seconds a test waits for a job's progress (a status, a log line) by default: enough for a
#: loaded 2-core machine; every wait polls its condition and ends as soon as it holds.
WAIT_S = 120.0

#: One machine of 2 GPUs; VCs `a` and `b` are guaranteed one GPU each.
TWO_VCS = """\
cell_types:
  ONE: {child: gpu, count: 1}
  NODE: {child: ONE, count: 2, node: true}
physical_cells:
  - {type: NODE, count: 1}
virtual_clusters:
  a: {ONE: 1}
  b: {ONE: 1}
"""


#: The scheduler options the tests set by a short name: (section or None, option).
SCHEDULER_OPTIONS = {
    "policy": (None, "policy"),
    "admission": (None, "admission"),
    "placement": (None, "placement"),
    "relax_after_s": ("relax", "after_s"),
    "las_thresholds_gpu_s": ("las", "thresholds_gpu_s"),
    "quantum_s": ("timeslice", "quantum_s"),
    "retry_backoff_s": ("retry", "backoff_s"),
    "fast_fail_s": ("retry", "fast_fail_s"),
    "fast_fail_repeats": ("retry", "fast_fail_repeats"),
    "optimus_refit_min_s": ("optimus", "refit_min_s"),
    "optimus_prior_s": ("optimus", "prior_s"),
    "stages": (None, "stages"),
    "preempt_exempt_s": (None, "preempt_exempt_s"),
    "backfill": (None, "backfill"),
    "packing_threshold": ("packing", "threshold"),
    "packing_unmeasured": ("packing", "unmeasured"),
}


def manager_settings(**options: Any) -> ManagerSettings:
    """ManagerSettings from the manager's own fields and the scheduler options above."""
    scheduler: dict[str, Any] = {}
    own: dict[str, Any] = {}
    for key, value in options.items():
        if key not in SCHEDULER_OPTIONS:
            own[key] = value
            continue
        section, option = SCHEDULER_OPTIONS[key]
        if section is None:
            scheduler[option] = value
        else:
            scheduler.setdefault(section, {})[option] = value
    return ManagerSettings(scheduler=config_from_mapping(scheduler), **own)


def fast_settings(**changes: Any) -> ManagerSettings:
    defaults = dict(tick_s=0.05, retry_backoff_s=0.5, fast_fail_s=20.0, relax_after_s=0.0)
    return manager_settings(**(defaults | changes))


def start_server(
    data_dir: Path, *, gpus: int = 2, config: str | None = None, **settings: Any
) -> RunningServer:
    config_path = None
    if config is not None:
        config_path = data_dir.parent / f"{data_dir.name}-cluster.yaml"
        config_path.write_text(config)
    # Single-user: the tests run as root, and their jobs run as the test's user (tests of the
    # multi-user mode start `corral up` themselves: tests/server/test_security.py).
    options = ServerOptions(
        data_dir=data_dir,
        gpus=gpus,
        config=config_path,
        settings=fast_settings(**settings),
        single_user=True,
    )
    return run_server(build_manager(options))


def run_server(manager: Manager) -> RunningServer:
    """The manager and its API server started; a start that fails stops what it began (the
    manager's threads, its executor, its lock on the data directory) before it raises."""
    running = RunningServer(manager)
    try:
        return running.start()
    except BaseException:
        running.server.should_exit = True
        if running.thread.is_alive():
            running.thread.join(timeout=30)
        manager.stop()
        raise


def admin_token(data_dir: Path) -> str:
    return (data_dir / "admin.token").read_text().strip()


def api(url: str, token: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=url, headers=headers, timeout=30)


def submit(client: httpx.Client, **spec: Any) -> str:
    response = client.post("/api/v1/jobs", json=spec)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def job(client: httpx.Client, job_id: str) -> dict[str, Any]:
    response = client.get(f"/api/v1/jobs/{job_id}")
    assert response.status_code == 200, response.text
    return dict(response.json())


def wait_for(
    client: httpx.Client, job_id: str, statuses: Iterable[str] = FINAL, timeout: float = WAIT_S
) -> dict[str, Any]:
    wanted = tuple(statuses)
    deadline = time.monotonic() + timeout
    while True:
        found = job(client, job_id)
        if found["status"] in wanted:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} still {found['status']}: {found}")
        time.sleep(0.05)


def wait_until(check: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
    """Poll `check` until it returns something true, and return that; fails after `timeout`."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)
    return value


def python_job(name: str, code: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "gpus": 1, "command": [sys.executable, "-c", code], **fields}


def train_job(name: str, steps: int, step_s: float = 0.05, **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "gpus": 1,
        "command": [sys.executable, str(TRAIN)],
        "env": {"TRAIN_STEPS": str(steps), "STEP_SECONDS": str(step_s)},
        "grace_seconds": 5,
        **fields,
    }


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def nodes(client: httpx.Client) -> dict[str, dict[str, Any]]:
    """The cluster's nodes by name, as the API lists them."""
    answer = client.get("/api/v1/nodes")
    assert answer.status_code == 200, answer.text
    return {node["name"]: node for node in answer.json()}


def attempt_nodes(client: httpx.Client, job_id: str) -> list[str]:
    """The node of each attempt of the job, in order."""
    return [a["gpus"][0].split("/")[0] for a in job(client, job_id)["attempt_history"]]


def settled(server: RunningServer) -> None:
    """Wait for the step in progress (it holds the lock from the ends it collects to the starts
    it launches): what a step that saw an end decides is done once this returns."""
    with server.manager.lock:
        pass


def considered(client: httpx.Client, job_id: str) -> dict[str, Any]:
    """The job once a scheduling round has seen it: waiting with the round's reason, or started
    (the caller asserts which)."""

    def seen() -> dict[str, Any] | None:
        found = job(client, job_id)
        if found["attempts"]:
            return found
        reason = str(found["reason"])
        return (
            found if reason.startswith("PENDING") and "not yet considered" not in reason else None
        )

    return dict(wait_until(seen, f"job {job_id} considered by a round"))


def kill_jobs_of(data_dir: Path) -> int:
    """Kill whatever processes a test's jobs left behind (after a failed assertion)."""
    return sum(kill_attempt(attempt) for attempt in data_dir.glob("jobs/*/attempt-*"))


class Corral:
    """`corral up` as a separate process, so that it can be killed with SIGKILL."""

    def __init__(
        self,
        data_dir: Path,
        *up_args: str,
        env: dict[str, str] | None = None,
        preexec_fn: Callable[[], None] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.env = env
        self.preexec_fn = preexec_fn  # run in the child before `corral up` (e.g. setrlimit)
        self.up_args = list(up_args or ("--gpus", "2"))
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> httpx.Client:
        self.starts += 1
        log = (self.data_dir.parent / f"server-{self.starts}.log").open("wb")
        command = [sys.executable, "-m", "corral.cli", "up", *self.up_args]
        if "--multi-user" in command:  # this test's own: root runs jobs as their users' accounts
            command.remove("--multi-user")
        else:
            command.append("--single-user")
        command += ["--data-dir", str(self.data_dir), "--port", str(self.port)]
        with log:
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                preexec_fn=self.preexec_fn,
            )
        try:
            return self._wait_up()
        except BaseException:
            self.stop()  # a start that failed leaves no server behind
            raise

    def _wait_up(self) -> httpx.Client:
        assert self.process is not None
        # A cold `corral up` (imports, the store, a connection to Ray) on a loaded machine.
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log().read_text()
            try:
                client = api(self.url, admin_token(self.data_dir))
            except OSError:  # no admin token yet
                pass
            else:
                try:
                    if client.get("/api/v1/whoami").status_code == 200:
                        return client
                except httpx.TransportError:
                    pass
                client.close()
            time.sleep(0.1)
        raise AssertionError(f"corral up did not start: {self.log().read_text()[-2000:]}")

    def log(self) -> Path:
        return self.data_dir.parent / f"server-{self.starts}.log"

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.kill()
