"""/metrics asks for a token: the metrics token file's (what Prometheus's `authorization:
credentials_file:` sends) or an admin's, through a real `corral up`; the file's checks at start;
and a real Prometheus scraping a real manager with the shipped scrape config.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
from pathlib import Path

import httpx
import pytest
import yaml
from click.testing import CliRunner

from corral.cli.main import app
from tests.server.helpers import REPO, Corral
from tests.server.prometheus import Prometheus, free_port

DEPLOY = REPO / "deploy" / "prometheus"
TOKEN = "3f" * 32  # what `openssl rand -hex 32` prints


def secret(path: Path, text: str = TOKEN, mode: int = 0o600) -> Path:
    path.write_text(text + "\n")
    path.chmod(mode)
    return path


def scrape(url: str, token: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return httpx.get(f"{url}/metrics", headers=headers, timeout=30)


def test_metrics_need_the_metrics_token_or_an_admins(tmp_path: Path) -> None:
    data_dir = tmp_path / "corral"
    up = Corral(data_dir, "--gpus", "1")
    try:
        admin = up.start()
        path = data_dir / "metrics.token"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600  # written at the first start
        token = path.read_text().strip()
        assert len(token) >= 32
        user = admin.post("/api/v1/tokens", json={"user": "alice"}).json()["token"]

        for given in (None, "not-the-token", token[:-1]):
            refused = scrape(up.url, given)
            assert refused.status_code == 401, (given, refused.text)
            assert refused.headers["www-authenticate"] == "Bearer"
            assert refused.json()["detail"].startswith("a token is needed for /metrics")
            assert "corral_jobs" not in refused.text
        assert httpx.get(f"{up.url}/metrics", headers={"Authorization": token}).status_code == 401
        forbidden = scrape(up.url, user)
        assert forbidden.status_code == 403
        assert forbidden.json() == {
            "detail": "only the metrics token or an admin's token may read /metrics"
        }
        for allowed in (token, admin.headers["authorization"].removeprefix("Bearer ")):
            served = scrape(up.url, allowed)
            assert served.status_code == 200
            assert "corral_gpus 1.0" in served.text
        # A restart keeps the file and its token (Prometheus holds a copy).
        up.kill()
        up.start()
        assert path.read_text().strip() == token and scrape(up.url, token).status_code == 200
    finally:
        up.stop()


def test_a_token_file_of_ones_own_and_metrics_in_public(tmp_path: Path) -> None:
    given = secret(tmp_path / "scrape.token")
    up = Corral(tmp_path / "a", "--gpus", "1", "--metrics-token-file", str(given))
    try:
        up.start()
        assert scrape(up.url, TOKEN).status_code == 200
        assert scrape(up.url, None).status_code == 401
        assert not (up.data_dir / "metrics.token").exists()  # the file given is the one
        assert f"(Authorization: Bearer $(cat {given})" in up.log().read_text()
    finally:
        up.stop()
    public = Corral(tmp_path / "b", "--gpus", "1", "--metrics-public")
    try:
        public.start()
        assert scrape(public.url, None).status_code == 200
        assert "(no token (--metrics-public))" in public.log().read_text()
    finally:
        public.stop()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: secret(p, mode=0o644), "group or others may open it (mode 0644): chmod 600"),
        (lambda p: secret(p, mode=0o620), "group or others may open it (mode 0620)"),
        (lambda p: secret(p, "short"), "has 5 characters; give at least 32"),
        (lambda p: secret(p, "two words " + TOKEN), "must hold one token, a line without spaces"),
        (lambda p: p, "cannot open"),  # missing
        (lambda p: (p.mkdir(mode=0o700), p)[1], "not a regular file"),
    ],
)
def test_a_bad_token_file_is_refused_at_start_in_one_line(
    tmp_path: Path, make: object, message: str
) -> None:
    path = make(tmp_path / "scrape.token")  # type: ignore[operator]
    args = ["up", "--gpus", "1", "--data-dir", str(tmp_path / "d"), "--port", str(free_port())]
    result = CliRunner().invoke(app, [*args, "--metrics-token-file", str(path)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --metrics-token-file {path}: "), lines
    assert message in lines[0] and "Traceback" not in result.output


def test_a_link_or_anothers_file_is_refused(tmp_path: Path) -> None:
    real = secret(tmp_path / "real.token")
    link = tmp_path / "link.token"
    link.symlink_to(real)
    args = ["up", "--gpus", "1", "--data-dir", str(tmp_path / "d"), "--port", str(free_port())]
    result = CliRunner().invoke(app, [*args, "--metrics-token-file", str(link)])
    assert result.exit_code == 2, result.output
    assert f"--metrics-token-file {link}: cannot open it" in result.output, result.output
    both = CliRunner().invoke(app, [*args, "--metrics-token-file", str(real), "--metrics-public"])
    assert both.exit_code == 2
    assert "--metrics-public and --metrics-token-file: give one of them" in both.output
    if os.geteuid() == 0:  # a file of another user's: they could change the token
        os.chown(real, 65534, 65534)
        result = CliRunner().invoke(app, [*args, "--metrics-token-file", str(real)])
        owner = pwd.getpwuid(65534).pw_name
        assert result.exit_code == 2 and f"owned by {owner}, not by root" in result.output


def test_prometheus_scrapes_with_the_shipped_config_and_the_token(tmp_path: Path) -> None:
    """The scrape config of deploy/ as shipped (but its target and interval), with the manager's
    metrics token copied beside it: Prometheus's target is up. A second job with another token
    is refused (401), which Prometheus reports as the target's error."""
    data_dir = tmp_path / "corral"
    up = Corral(data_dir, "--gpus", "1")
    prometheus: Prometheus | None = None
    try:
        up.start()
        config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
        config["global"]["scrape_interval"] = "1s"
        (job,) = config["scrape_configs"]
        job["static_configs"] = [{"targets": [f"127.0.0.1:{up.port}"]}]
        wrong = {**job, "job_name": "corral-wrong-token"}
        wrong["authorization"] = {**job["authorization"], "credentials_file": "wrong.token"}
        config["scrape_configs"] = [job, wrong]
        home = tmp_path / "prometheus"
        home.mkdir()
        shutil.copy(DEPLOY / "alerts.yaml", home / "alerts.yaml")
        shutil.copy(data_dir / "metrics.token", home / job["authorization"]["credentials_file"])
        secret(home / "wrong.token", "0" * 64)
        prometheus = Prometheus(home, config).start()

        def health() -> dict[str, tuple[str, str]] | None:
            assert prometheus is not None
            found = prometheus.client.get("/api/v1/targets").json()["data"]["activeTargets"]
            states = {t["labels"]["job"]: (t["health"], t["lastError"]) for t in found}
            known = len(states) == 2 and all(s != "unknown" for s, _ in states.values())
            return states if known and "up" in {s for s, _ in states.values()} else None

        states = prometheus.wait(health, "both targets scraped, one up")
        assert states.get("corral") == ("up", ""), states
        state, error = states["corral-wrong-token"]
        assert state == "down" and "401" in error, states
    finally:
        if prometheus is not None:
            prometheus.stop()
        up.stop()
