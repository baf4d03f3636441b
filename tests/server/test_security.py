"""Multi-user mode with real Unix accounts: `corral up` as root (a real process) runs alice's and
bob's jobs under accounts the test creates, and the kernel keeps them apart.

Each job here is a shell script (the venv's Python lives under root's home, which other accounts
cannot enter); what it could and could not read comes back through its log.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from corral.server import identity
from tests.accounts import useradd, userdel
from tests.server.helpers import REPO, Corral, admin_token, api, kill_jobs_of, submit, wait_for

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="needs root and useradd: multi-user mode runs jobs under accounts the test creates",
)

TWO_TEAMS = """\
cell_types:
  PAIR: {child: gpu, count: 2}
  NODE: {child: PAIR, count: 2, node: true}
physical_cells:
  - {type: NODE, count: 1}
virtual_clusters:
  vision: {PAIR: 1}
  nlp: {PAIR: 1}
"""


@dataclass
class Site:
    corral: Corral
    admin: httpx.Client
    data_dir: Path
    accounts: dict[str, str]  # corral user -> Unix account

    def client(self, user: str, vc: str) -> httpx.Client:
        response = self.admin.post(
            "/api/v1/tokens", json={"user": user, "vc": vc, "unix_user": self.accounts[user]}
        )
        assert response.status_code == 201, response.text
        return api(self.corral.url, response.json()["token"])


@pytest.fixture
def site() -> Iterator[Site]:
    suffix = uuid.uuid4().hex[:6]
    accounts = {"alice": f"crl-alice-{suffix}", "bob": f"crl-bob-{suffix}"}
    created: list[str] = []
    # The data dir must be reachable by the jobs' accounts (pytest's tmp_path is not): a dir of
    # its own under /tmp, which every account may pass through.
    base = Path(tempfile.mkdtemp(prefix="corral-security-"))
    corral: Corral | None = None
    admin: httpx.Client | None = None
    try:
        base.chmod(0o711)
        for account in accounts.values():
            useradd(account)
            created.append(account)
        config = base / "cluster.yaml"
        config.write_text(TWO_TEAMS)
        # A variable of the manager's own, which no job of another account may inherit.
        env = {**os.environ, "MANAGER_SECRET": "managers-own"}
        corral = Corral(
            base / "state", "--gpus", "4", "--config", str(config), "--multi-user", env=env
        )
        admin = corral.start()
        yield Site(corral, admin, base / "state", accounts)
    finally:
        if admin is not None:  # cancel what still runs, then make sure of it
            try:
                for row in admin.get("/api/v1/jobs").json():
                    admin.post(f"/api/v1/jobs/{row['id']}/cancel")
            except (httpx.HTTPError, ValueError, TypeError):
                pass
        if corral is not None:
            corral.stop()
            kill_jobs_of(corral.data_dir)
        for account in created:
            userdel(account)
        shutil.rmtree(base, ignore_errors=True)


def _pids_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as environ:
                if marker.encode() in environ.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _log(client: httpx.Client, job_id: str) -> str:
    response = client.get(f"/api/v1/jobs/{job_id}/logs")
    assert response.status_code == 200, response.text
    return response.text


def _wait_log(client: httpx.Client, job_id: str, text: str, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while True:
        log = _log(client, job_id)
        if text in log:
            return log
        assert time.monotonic() < deadline, f"job {job_id} never printed {text!r}: {log!r}"
        time.sleep(0.1)


def test_jobs_of_two_users_cannot_reach_each_other_or_the_manager(site: Site) -> None:
    alice = site.client("alice", "vision")
    bob = site.client("bob", "nlp")
    secret = f"bob-secret-{uuid.uuid4().hex}"
    bobs = submit(
        bob,
        name="bob-train",
        vc="nlp",
        gpus=1,
        env={"BOB_SECRET": secret},
        command='echo bob-log-line; echo saved > "$CORRAL_CHECKPOINT_DIR/state"; '
        "echo checkpointed; exec sleep 600",
    )
    _wait_log(bob, bobs, "checkpointed")
    bob_pids = _pids_with(secret)
    assert bob_pids, "bob's job runs with its secret in its environment"
    data = site.data_dir
    bob_dir = data / "jobs" / bobs
    targets = {
        "token": data / "admin.token",
        "metrics-token": data / "metrics.token",
        "db": data / "corral.db",
        "bob-log": bob_dir / "attempt-1" / "rank-0.stdout",
        "bob-launch": bob_dir / "attempt-1" / "launch.json",
        "bob-checkpoint": bob_dir / "checkpoint" / "state",
        "bob-environ": Path(f"/proc/{bob_pids[0]}/environ"),
    }
    probes = "; ".join(
        f'if cat "{path}" >/dev/null 2>&1; then echo "{name}: READ"; else echo "{name}: denied"; fi'
        for name, path in targets.items()
    )
    alices = submit(
        alice,
        name="alice-probe",
        vc="vision",
        gpus=1,
        command=f'echo "uid $(id -u) home $HOME env ${{MANAGER_SECRET:-none}} cwd $(pwd)"; {probes}; ls "{bob_dir / "checkpoint"}" >/dev/null 2>&1 '
        '&& echo "bob-ls: READ" || echo "bob-ls: denied"; '
        'echo mine > "$CORRAL_CHECKPOINT_DIR/own" && cat "$CORRAL_CHECKPOINT_DIR/own"; '
        "kill -0 " + str(bob_pids[0]) + ' 2>/dev/null && echo "bob-signal: SENT" '
        '|| echo "bob-signal: denied"; echo probed',
    )
    done = wait_for(alice, alices, timeout=120)
    log = _log(alice, alices)
    assert done["status"] == "SUCCEEDED", (done, log)
    alice_account = pwd.getpwnam(site.accounts["alice"])
    work = data / "jobs" / alices / "work"
    assert f"uid {alice_account.pw_uid} home {alice_account.pw_dir} env none cwd {work}" in log
    for name in [*targets, "bob-ls", "bob-signal"]:
        assert f"{name}: denied" in log, log
    errors = alice.get(f"/api/v1/jobs/{alices}/logs", params={"stream": "stderr"}).text
    assert "mine" in log, errors  # its own checkpoint dir is its own
    assert secret not in log and "bob-log-line" not in log
    # The files themselves: each job's files are its account's, private; the manager's are root's.
    bob_uid = pwd.getpwnam(site.accounts["bob"]).pw_uid
    for path, owner, mode in [
        (bob_dir / "checkpoint", bob_uid, 0o700),
        (bob_dir / "work", bob_uid, 0o700),
        (bob_dir / "attempt-1" / "rank-0.stdout", bob_uid, 0o600),
        (bob_dir, 0, 0o711),
        (data / "admin.token", 0, 0o600),
        (data / "metrics.token", 0, 0o600),
        (data / "corral.db", 0, 0o600),
    ]:
        info = os.stat(path)
        assert (path, info.st_uid, stat.S_IMODE(info.st_mode)) == (path, owner, mode)
    assert stat.S_IMODE(os.stat(bob_dir / "attempt-1" / "launch.json").st_mode) & 0o077 == 0


def test_users_cannot_see_or_cancel_each_others_jobs_and_revoked_tokens_stop(site: Site) -> None:
    alice = site.client("alice", "vision")
    bob = site.client("bob", "nlp")
    alices = submit(alice, name="quiet", vc="vision", gpus=1, command="exec sleep 600")
    wait_for(alice, alices, ("RUNNING",), timeout=120)
    assert bob.get(f"/api/v1/jobs/{alices}").status_code == 404
    assert bob.post(f"/api/v1/jobs/{alices}/cancel").status_code == 404
    assert bob.get(f"/api/v1/jobs/{alices}/logs").status_code == 404
    assert alices not in [row["id"] for row in bob.get("/api/v1/jobs").json()]
    assert alice.get(f"/api/v1/jobs/{alices}").json()["status"] == "RUNNING"
    # Revoked: refused at once, on every call, with no restart.
    response = site.admin.post("/api/v1/tokens/revoke", json={"user": "alice"})
    assert response.status_code == 200, response.text
    for call in (
        lambda: alice.get("/api/v1/whoami"),
        lambda: alice.get("/api/v1/jobs"),
        lambda: alice.post(f"/api/v1/jobs/{alices}/cancel"),
    ):
        assert call().status_code == 401
    assert site.admin.post(f"/api/v1/jobs/{alices}/cancel").status_code == 200
    assert wait_for(site.admin, alices, timeout=60)["status"] == "CANCELLED"


def test_a_submission_needs_an_account_that_may_run_jobs(site: Site) -> None:
    for user, account, message in [
        ("carol", None, "unix user: no Unix account 'carol'"),
        ("mallory", "root", "unix user: 'root' is root; jobs never run as root"),
    ]:
        body: dict[str, object] = {"user": user, "vc": "vision"}
        if account is not None:
            body["unix_user"] = account
        token = site.admin.post("/api/v1/tokens", json=body).json()["token"]
        client = api(site.corral.url, token)
        response = client.post(
            "/api/v1/jobs", json={"name": "x", "vc": "vision", "gpus": 1, "command": "true"}
        )
        assert response.status_code == 422, response.text
        assert message in response.json()["detail"]
        assert "\n" not in response.json()["detail"]
    # alice's account cannot enter root's home: a workdir there is refused at submission.
    alice = site.client("alice", "vision")
    response = alice.post(
        "/api/v1/jobs",
        json={"name": "x", "vc": "vision", "gpus": 1, "command": "true", "workdir": "/root"},
    )
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith("workdir: account crl-alice-")
    assert [row["id"] for row in site.admin.get("/api/v1/jobs").json()] == []


def test_a_workdir_is_checked_as_the_account_and_after_it(site: Site) -> None:
    """Whether a path exists where the job's account cannot look is never told: the walk stops
    at the first directory it may not search, whatever lies beyond; and a user without an
    account hears about the account, not about the workdir."""
    alice = site.client("alice", "vision")
    account = site.accounts["alice"]
    closed = Path(tempfile.mkdtemp(prefix="corral-closed-"))  # root's, 0700
    opened = Path(tempfile.mkdtemp(prefix="corral-open-"))
    try:
        opened.chmod(0o755)
        (closed / "exists").mkdir()
        (opened / "into-closed").symlink_to(closed / "exists")
        (opened / "file").write_text("")

        def refusal(client: httpx.Client, workdir: str) -> str:
            response = client.post(
                "/api/v1/jobs",
                json={
                    "name": "x",
                    "vc": "vision",
                    "gpus": 1,
                    "command": "true",
                    "workdir": workdir,
                },
            )
            assert response.status_code == 422, response.text
            detail = str(response.json()["detail"])
            assert "\n" not in detail
            return detail

        blocked = f"workdir: account {account} cannot enter {closed} (owner root, mode 0700)"
        for workdir in ("exists", "missing", "missing/deeper", "exists/.."):
            assert refusal(alice, f"{closed}/{workdir}") == blocked
        assert refusal(alice, f"{opened}/into-closed") == blocked  # through a link too
        assert refusal(alice, f"{opened}/missing") == (
            f"workdir: {opened}/missing does not exist on the manager's machine"
        )
        assert refusal(alice, f"{opened}/file") == (
            f"workdir: {opened}/file is not a directory (on the manager's machine)"
        )
        # The account first: carol has none, and hears that, not where her workdir is.
        token = site.admin.post("/api/v1/tokens", json={"user": "carol", "vc": "vision"})
        carol = api(site.corral.url, token.json()["token"])
        assert refusal(carol, f"{closed}/missing").startswith(
            "unix user: no Unix account 'carol' on this machine"
        )
        assert [row["id"] for row in site.admin.get("/api/v1/jobs").json()] == []
    finally:
        shutil.rmtree(closed, ignore_errors=True)
        shutil.rmtree(opened, ignore_errors=True)


def test_a_system_account_runs_jobs_only_when_an_admin_names_it(site: Site) -> None:
    """A user called `daemon` does not get uid 1 by sharing its name; an admin may still name a
    system account for a user (`--unix-user`), and a person's account maps by name."""
    person = f"crl-person-{uuid.uuid4().hex[:6]}"
    subprocess.run(["useradd", "--no-create-home", person], check=True, capture_output=True)
    try:
        job = {"name": "x", "vc": "vision", "gpus": 1, "command": "true"}
        daemon = site.admin.post("/api/v1/tokens", json={"user": "daemon", "vc": "vision"})
        response = api(site.corral.url, daemon.json()["token"]).post("/api/v1/jobs", json=job)
        assert response.status_code == 422, response.text
        uid, low = pwd.getpwnam("daemon").pw_uid, identity.user_uid_range()[0]
        assert response.json()["detail"] == (
            f"unix user: 'daemon' is a system account (uid {uid}, below UID_MIN {low} in "
            "/etc/login.defs): a user's jobs run as it only if an admin names it, with "
            "`corral token create daemon --unix-user daemon`"
        )
        named = site.admin.post(
            "/api/v1/tokens", json={"user": "daemon2", "vc": "vision", "unix_user": "daemon"}
        )
        accepted = submit(api(site.corral.url, named.json()["token"]), **job)
        assert wait_for(site.admin, accepted, timeout=120)["status"] == "SUCCEEDED"
        token = site.admin.post("/api/v1/tokens", json={"user": person, "vc": "vision"})
        mapped = submit(api(site.corral.url, token.json()["token"]), **job)
        assert wait_for(site.admin, mapped, timeout=120)["status"] == "SUCCEEDED"
    finally:
        subprocess.run(["pkill", "-KILL", "-u", person], capture_output=True)
        subprocess.run(["userdel", person], capture_output=True)


def _cli(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "corral.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_readme_flow_as_root() -> None:
    """README's "Using the manager" as root: `corral up` says it is multi-user; the admin token's
    submission is refused in one line that names both ways out; a token that names an account
    submits `examples/jobs/train.yaml`, which runs under that account to the end."""
    account = f"crl-ana-{uuid.uuid4().hex[:6]}"
    base = Path(tempfile.mkdtemp(prefix="corral-readme-"))
    corral: Corral | None = None
    try:
        base.chmod(0o711)
        useradd(account)
        # The job runs where it is submitted from: a copy of the examples the account may read.
        shutil.copytree(REPO / "examples", base / "examples")
        for path in [base / "examples", *(base / "examples").rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        corral = Corral(base / "state", "--gpus", "1", "--multi-user")
        admin = corral.start()
        started = " ".join(corral.log().read_text().split())
        assert (
            "jobs multi-user mode: corral runs as root, so each user's jobs run under that "
            "user's Unix account (a token's --unix-user, else the account named like the user)"
        ) in started
        env = {**os.environ, "CORRAL_URL": corral.url, "CORRAL_TOKEN": admin_token(corral.data_dir)}
        quick = ["--set", "env.TRAIN_STEPS=5", "--set", "env.STEP_SECONDS=0.05"]
        refused = _cli("submit", "examples/jobs/train.yaml", *quick, env=env, cwd=base)
        assert refused.returncode != 0
        lines = [line for line in refused.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, refused.stderr
        assert "unix user: no Unix account 'admin' on this machine" in lines[0]
        assert "`corral token create admin --unix-user ACCOUNT`" in lines[0]
        assert "`corral up --single-user`" in lines[0]
        created = _cli("token", "create", "ana", "--unix-user", account, env=env, cwd=base)
        assert created.returncode == 0, created.stderr
        env["CORRAL_TOKEN"] = created.stdout.strip()
        submitted = _cli("submit", "examples/jobs/train.yaml", *quick, env=env, cwd=base)
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip()
        done = wait_for(admin, job_id, timeout=120)
        assert done["status"] == "SUCCEEDED", (done, _log(admin, job_id))
        attempt = corral.data_dir / "jobs" / job_id / "attempt-1"
        assert os.stat(attempt / "rank-0.stdout").st_uid == pwd.getpwnam(account).pw_uid
    finally:
        if corral is not None:
            corral.stop()
            kill_jobs_of(corral.data_dir)
        userdel(account)
        shutil.rmtree(base, ignore_errors=True)
