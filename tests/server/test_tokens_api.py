"""Token management through the API, the client and `corral token`: create (with an expiry and a
Unix account), list (never a secret), revoke one token or a user's every token, refused at once;
names PostgreSQL could not store are refused with one line, never a 500."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner, Result

from corral.cli.main import app
from corral.client import Client, ClientError
from corral.server.auth import RECHECK_S, revoke_user, token_id
from corral.server.boot import RunningServer, ServerOptions, build_manager
from corral.server.store import Store
from tests.server.helpers import admin_token, api, fast_settings, start_server

LISTED = {
    "id",
    "user",
    "vc",
    "admin",
    "unix_user",
    "name",
    "created_at",
    "expires_at",
    "revoked_at",
    "state",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(tmp_path_factory.mktemp("corral-tokens"), gpus=1)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def admin(server: RunningServer) -> Iterator[Client]:
    with Client(server.url, admin_token(server.manager.data_dir)) as client:
        yield client


def status_of(url: str, token: str) -> int:
    with api(url, token) as client:
        return client.get("/api/v1/jobs").status_code


def cli(server: RunningServer, *args: str, token: str | None = None) -> Result:
    token = token or admin_token(server.manager.data_dir)
    env = {"CORRAL_URL": server.url, "CORRAL_TOKEN": token}
    return CliRunner().invoke(app, list(args), env=env)


def one_line(result: Result, code: int = 1) -> str:
    assert result.exit_code == code, (result.exit_code, result.output)
    assert result.stdout == "" and "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0].removeprefix("error: ")


def test_create_list_and_revoke(server: RunningServer, admin: Client) -> None:
    created = admin.create_token("alice", vc="default", unix_user="alice_u", expires_in=3600)
    secret = created["token"]
    assert created["id"] == token_id(secret)
    assert created["unix_user"] == "alice_u"
    assert time.time() + 3500 < created["expires_at"] < time.time() + 3700
    with Client(server.url, secret) as alice:
        assert alice.whoami()["user"] == "alice"

    listed = {token["id"]: token for token in admin.tokens()}
    mine = listed[created["id"]]
    assert set(mine) == LISTED and mine["state"] == "active" and mine["revoked_at"] is None
    assert (mine["user"], mine["vc"], mine["unix_user"]) == ("alice", "default", "alice_u")
    assert secret not in json.dumps(admin.tokens())  # never the secret...
    assert all(len(token["id"]) == 12 for token in listed.values())  # ...nor its hash

    revoked = admin.revoke_token(created["id"])
    assert revoked["state"] == "revoked" and revoked["revoked_at"] is not None
    assert status_of(server.url, secret) == 401  # at once
    assert admin.revoke_token(created["id"])["revoked_at"] == revoked["revoked_at"]  # idempotent
    with pytest.raises(ClientError) as caught:
        admin.revoke_token("0123456789ab")
    assert (caught.value.status, caught.value.message) == (404, "no token 0123456789ab")
    with pytest.raises(ClientError) as caught:
        admin.revoke_token("not an id")
    assert caught.value.status == 404 and "12 hex digits" in caught.value.message

    bobs = [admin.create_token("bob")["token"] for _ in range(2)]
    carol = admin.create_token("carol")["token"]
    assert all(status_of(server.url, token) == 200 for token in [*bobs, carol])
    gone = admin.revoke_user_tokens("bob")
    assert sorted(token["id"] for token in gone) == sorted(token_id(token) for token in bobs)
    assert [status_of(server.url, token) for token in [*bobs, carol]] == [401, 401, 200]
    assert admin.revoke_user_tokens("bob") == []


def test_an_expired_token_is_refused(server: RunningServer, admin: Client) -> None:
    secret = admin.create_token("brief", expires_in=0.5)["token"]
    assert status_of(server.url, secret) == 200
    time.sleep(0.6)
    assert status_of(server.url, secret) == 401
    (listed,) = [token for token in admin.tokens() if token["id"] == token_id(secret)]
    assert listed["state"] == "expired"


def test_a_revocation_by_another_process_is_seen_within_a_second(
    server: RunningServer, admin: Client
) -> None:
    secret = admin.create_token("dora")["token"]
    assert status_of(server.url, secret) == 200  # verified, now cached
    other = Store(server.manager.store.url)  # another process's view of the same database
    try:
        revoke_user(other, "dora")
    finally:
        other.close()
    deadline = time.monotonic() + RECHECK_S + 0.5
    while status_of(server.url, secret) != 401:
        assert time.monotonic() < deadline, "a revoked token was accepted for too long"
        time.sleep(0.05)


def test_only_admins_manage_tokens(server: RunningServer, admin: Client) -> None:
    user = admin.create_token("erin")["token"]
    with api(server.url, user) as erin:
        for method, path, body in (
            ("GET", "/api/v1/tokens", None),
            ("POST", "/api/v1/tokens", {"user": "x"}),
            ("DELETE", f"/api/v1/tokens/{token_id(user)}", None),
            ("POST", "/api/v1/tokens/revoke", {"user": "erin"}),
        ):
            response = erin.request(method, path, json=body)
            assert response.status_code == 403, (method, path, response.text)
            assert response.json()["detail"].startswith("only an admin may ")
    assert status_of(server.url, user) == 200


REFUSED = [
    ({"user": "al\u0000ice"}, "user: must not contain control or invisible characters (NUL, ...)"),
    ({"user": "a" * 10_000}, "user: at most 128 characters (got 10000)"),
    ({"user": "a", "vc": "default\u0000"}, "vc: must not contain control"),
    ({"user": "a", "vc": "v" * 200}, "vc: at most 128 characters (got 200)"),
    ({"user": "a", "vc": "nope"}, "vc: unknown VC 'nope'; this cluster has default"),
    ({"user": "a", "unix_user": "Root"}, "unix_user: 'Root' is not a portable Unix user name"),
    ({"user": "a", "unix_user": "a\u0000"}, "unix_user: 'a\\x00' is not a portable"),
    ({"user": "a", "unix_user": 5}, "unix_user: must be a string"),
    ({"user": "a", "expires_in_seconds": 0}, "expires_in_seconds: must be a number of seconds"),
    ({"user": "a", "expires_in_seconds": "1h"}, "expires_in_seconds: must be a number"),
    ({"user": "a", "expires_in_seconds": True}, "expires_in_seconds: must be a number"),
    ({"user": "a", "expires_in_seconds": 1e300}, "expires_in_seconds: must be a number"),
    ({"user": "a", "expires": 60}, "'expires': unknown field; the fields are user, vc, admin"),
    ({"user": "a", "x\u0000" * 100: 1}, "'x\\x00x\\x00"),
    ({"user": " "}, "user: must be a non-empty string"),
    ({"user": "a", "admin": "yes"}, "admin: must be true or false"),
]


def check_refusals(url: str, token: str) -> None:
    with api(url, token) as client:
        before = client.get("/api/v1/tokens").json()
        for body, message in REFUSED:
            response = client.post("/api/v1/tokens", json=body)
            assert response.status_code == 422, (body, response.text)
            detail = response.json()["detail"]
            assert isinstance(detail, str) and detail.startswith(message), (body, detail)
            assert "\n" not in detail and len(detail) < 300
        for body in ({"user": "a\u0000"}, {"user": 5}, {}, {"user": "a", "id": "x"}):
            response = client.post("/api/v1/tokens/revoke", json=body)
            assert response.status_code == 422, (body, response.text)
        assert client.get("/api/v1/tokens").json() == before  # nothing stored


def test_names_that_cannot_be_stored_are_one_line_422s(server: RunningServer) -> None:
    check_refusals(server.url, admin_token(server.manager.data_dir))


def test_postgresql_gets_no_nul_either(postgres_url: str, tmp_path: Path) -> None:
    options = ServerOptions(
        data_dir=tmp_path, gpus=1, db_url=postgres_url, settings=fast_settings(), single_user=True
    )
    running = RunningServer(build_manager(options)).start()
    try:
        check_refusals(running.url, admin_token(tmp_path))
    finally:
        running.stop()


def test_the_admin_token_can_be_revoked_and_the_next_start_makes_a_new_one(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    running = start_server(data_dir, gpus=1)
    old = admin_token(data_dir)
    try:
        with Client(running.url, old) as admin:
            spare = admin.create_token("ops", admin=True)["token"]
            assert admin.revoke_token(token_id(old))["state"] == "revoked"
            with pytest.raises(ClientError) as caught:
                admin.whoami()
            assert caught.value.status == 401
        assert status_of(running.url, spare) == 200  # the other admin token still works
    finally:
        running.stop()
    again = start_server(data_dir, gpus=1)
    try:
        new = admin_token(data_dir)
        assert new != old
        assert (status_of(again.url, new), status_of(again.url, old)) == (200, 401)
    finally:
        again.stop()


# -- corral token ---------------------------------------------------------------------------------


def test_the_token_commands(server: RunningServer, admin: Client) -> None:
    made = cli(server, "token", "create", "frank", "--expires", "7d", "--unix-user", "frank_x")
    assert made.exit_code == 0, made.output
    secret = made.stdout.strip()
    assert status_of(server.url, secret) == 200
    as_json = json.loads(cli(server, "token", "create", "frank", "-o", "json").stdout)
    assert as_json["expires_at"] is None and as_json["id"] == token_id(as_json["token"])

    listed = cli(server, "token", "ls")
    assert listed.exit_code == 0, listed.output
    header, *rows = listed.stdout.splitlines()
    assert header.split() == [
        "ID",
        "USER",
        "VC",
        "ADMIN",
        "UNIX",
        "USER",
        "CREATED",
        "EXPIRES",
        "REVOKED",
    ]
    (row,) = [line for line in rows if line.startswith(token_id(secret))]
    assert "frank_x" in row and "frank" in row
    assert secret not in listed.stdout and as_json["token"] not in listed.stdout
    (entry,) = [
        token
        for token in json.loads(cli(server, "token", "ls", "-o", "json").stdout)
        if token["id"] == token_id(secret)
    ]
    assert 7 * 86400 - 60 < entry["expires_at"] - entry["created_at"] <= 7 * 86400

    one = cli(server, "token", "revoke", token_id(secret))
    assert one.exit_code == 0, one.output
    assert one.stdout == f"revoked token {token_id(secret)} of frank\n"
    assert status_of(server.url, secret) == 401
    assert status_of(server.url, as_json["token"]) == 200
    every = cli(server, "token", "revoke", "frank")
    assert every.stdout == f"revoked token {as_json['id']} of frank\n"
    assert status_of(server.url, as_json["token"]) == 401
    assert cli(server, "token", "revoke", "frank").stdout == "no token of frank left to revoke\n"
    assert cli(server, "token", "revoke", "--user", "nobody").exit_code == 0

    assert one_line(cli(server, "token", "revoke", "nobody")) == (
        "no token has the id nobody and no user nobody has tokens (see corral token ls)"
    )
    assert one_line(cli(server, "token", "revoke", "--id", "0123456789ab")) == (
        "no token 0123456789ab"
    )
    assert one_line(cli(server, "token", "create", "g", "--expires", "5"), code=2) == (
        "--expires: expected a duration such as 30m, 12h, 7d or 1w, got '5'"
    )
    assert one_line(cli(server, "token", "create", "g", "--unix-user", "G")).startswith(
        "unix_user: 'G' is not a portable Unix user name"
    )
    user = admin.create_token("gina")["token"]
    assert one_line(cli(server, "token", "ls", token=user)) == "only an admin may list tokens"
    assert one_line(cli(server, "token", "revoke", "gina", token=user)) == (
        "only an admin may list tokens"
    )


def test_an_ambiguous_name_must_be_told_apart(server: RunningServer, admin: Client) -> None:
    victim = admin.create_token("henry")["token"]
    lookalike = admin.create_token(token_id(victim))["token"]  # a user named like an id
    refused = one_line(cli(server, "token", "revoke", token_id(victim)))
    assert refused.endswith("is both a token id and a user: say which with --id or --user")
    assert cli(server, "token", "revoke", "--id", token_id(victim)).exit_code == 0
    assert (status_of(server.url, victim), status_of(server.url, lookalike)) == (401, 200)
    assert cli(server, "token", "revoke", "--user", token_id(victim)).exit_code == 0
    assert status_of(server.url, lookalike) == 401


def test_an_httpx_client_sees_the_api(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url) as anonymous:
        assert anonymous.get("/api/v1/tokens").status_code == 401
