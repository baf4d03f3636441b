"""A real Prometheus (Debian's `prometheus` binary) for the tests: its own directory and port on
127.0.0.1, a scrape config given as a mapping, its HTTP API's instant queries."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

BINARY = shutil.which("prometheus")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Prometheus:
    """`prometheus` run on `config` (written to HOME/prometheus.yml; files it names relative to
    itself go beside it, in `home`) with its database under HOME/data. `stop` in a `finally`."""

    def __init__(self, home: Path, config: dict[str, Any]) -> None:
        if BINARY is None:  # a failure, not a skip: the monitoring must be tested
            pytest.fail("this test needs prometheus: apt-get install -y prometheus")
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        (home / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.client = httpx.Client(base_url=self.url, timeout=30)

    def start(self) -> Prometheus:
        assert BINARY is not None
        self.process = subprocess.Popen(
            [
                BINARY,
                f"--config.file={self.home / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.home / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(self.home / "prometheus.log").open("wb"),
        )
        self.wait(lambda: self.client.get("/-/ready").status_code == 200, "Prometheus ready")
        return self

    def log(self) -> str:
        return (self.home / "prometheus.log").read_text()[-3000:]

    def wait(self, check: Any, what: str, timeout: float = 120.0) -> Any:
        """Poll `check` (transport errors count as not yet) until it returns something true."""
        deadline = time.monotonic() + timeout
        while True:
            assert self.process is not None and self.process.poll() is None, self.log()
            try:
                value = check()
            except httpx.TransportError:
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")
            time.sleep(0.1)

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's vector (`at`: its evaluation time, Unix seconds); a failure for an
        error or a result that is not a vector."""
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        answer = self.client.get("/api/v1/query", params=params)
        body = answer.json()
        assert answer.status_code == 200 and body["status"] == "success", (expr, body)
        assert body["data"]["resultType"] == "vector", (expr, body["data"]["resultType"])
        return list(body["data"]["result"])

    def scraped_after(self, job: str, moment: float, timeout: float = 120.0) -> float:
        """The timestamp (Unix seconds, ms precision) of the first scrape of `job` to start
        after `moment`: every query evaluated there sees that scrape as the latest sample, with
        nothing to extrapolate to past it."""

        def latest() -> float | None:
            found = self.query(f'timestamp(up{{job="{job}"}})')
            if len(found) != 1:
                return None
            at = float(found[0]["value"][1])
            return at if at > moment else None

        return float(self.wait(latest, f"a scrape of {job} after {moment:.3f}", timeout))

    def stop(self) -> None:
        self.client.close()
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
