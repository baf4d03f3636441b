"""Tokens (secret shown once, hash stored), the admin token file, and the permission rules."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.server.auth import (
    Principal,
    can_act_on_job,
    can_read_job,
    can_set_level,
    can_submit_to,
    create_token,
    ensure_admin_token,
    token_hash,
    verify,
    visible_to,
)
from corral.server.store import Store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store(Store.sqlite_url(tmp_path))
    yield opened
    opened.close()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_token_verifies_as_its_principal(store: Store) -> None:
    alice = create_token(store, "alice", vc="vision", name="laptop")
    root = create_token(store, "root", admin=True)
    assert alice != root and len(alice) >= 43  # 32 random bytes, base64url
    assert verify(store, alice) == Principal(user="alice", vc="vision", admin=False)
    assert verify(store, root) == Principal(user="root", vc=None, admin=True)
    assert verify(store, alice) == verify(store, alice)  # the cached answer is the same


def test_bad_tokens_do_not_verify(store: Store) -> None:
    good = create_token(store, "alice")
    for bad in ("", None, good[:-1], good + "x", good.upper(), token_hash(good), "Bearer " + good):
        assert verify(store, bad) is None


def test_only_the_hash_is_stored(tmp_path: Path, store: Store) -> None:
    secret = create_token(store, "alice")
    (row,) = store.list_tokens()
    assert row.sha256 == hashlib.sha256(secret.encode()).hexdigest()
    on_disk = b"".join(path.read_bytes() for path in tmp_path.glob("corral.db*"))
    assert row.sha256.encode() in on_disk
    assert secret.encode() not in on_disk


def test_a_token_of_one_store_is_unknown_to_another(tmp_path: Path, store: Store) -> None:
    secret = create_token(store, "alice")
    assert verify(store, secret) is not None  # now cached for `store`
    (tmp_path / "other").mkdir()
    other = Store(Store.sqlite_url(tmp_path / "other"))
    assert verify(other, secret) is None
    other.close()


def test_a_token_created_by_another_process_is_found(tmp_path: Path, store: Store) -> None:
    assert verify(store, "not yet") is None
    second = Store(Store.sqlite_url(tmp_path))  # as `corral token create` in another process
    later = create_token(second, "bob")
    second.close()
    assert verify(store, later) == Principal("bob", None, False)


def test_an_empty_user_is_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="user: must not be empty"):
        create_token(store, "  ")


def test_the_admin_token_file_is_0600_and_works(tmp_path: Path, store: Store) -> None:
    data_dir = tmp_path / "data"
    path = ensure_admin_token(store, data_dir)
    assert path == data_dir / "admin.token"
    assert mode(path) == 0o600
    secret = path.read_text().strip()
    assert path.read_text() == secret + "\n"
    assert verify(store, secret) == Principal("admin", None, True)
    assert [p.name for p in data_dir.iterdir()] == ["admin.token"]  # no temporary file left


def test_a_second_start_leaves_the_file_alone(tmp_path: Path, store: Store) -> None:
    path = ensure_admin_token(store, tmp_path)
    before = path.stat()
    content = path.read_bytes()
    assert ensure_admin_token(store, tmp_path) == path
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns, mode(path)) == (
        before.st_ino,
        before.st_mtime_ns,
        0o600,
    )
    assert path.read_bytes() == content
    assert len(store.list_tokens()) == 1


def test_a_missing_file_gets_a_new_admin_token(tmp_path: Path, store: Store) -> None:
    first = ensure_admin_token(store, tmp_path).read_text().strip()
    (tmp_path / "admin.token").unlink()
    second = ensure_admin_token(store, tmp_path).read_text().strip()
    assert second != first
    assert mode(tmp_path / "admin.token") == 0o600
    assert verify(store, first) is not None and verify(store, second) is not None
    assert [t.admin for t in store.list_tokens()] == [True, True]


def test_a_file_the_database_does_not_know_is_replaced(tmp_path: Path, store: Store) -> None:
    stale = tmp_path / "admin.token"
    stale.write_text("a token of another database\n")
    stale.chmod(0o644)
    ensure_admin_token(store, tmp_path)
    fresh = stale.read_text().strip()
    assert fresh != "a token of another database"
    assert verify(store, fresh) == Principal("admin", None, True)
    assert mode(stale) == 0o600
    # A user's (non-admin) token in the file is not an admin token either.
    user_token = create_token(store, "alice")
    stale.write_text(user_token + "\n")
    ensure_admin_token(store, tmp_path)
    assert stale.read_text().strip() != user_token


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o277])
def test_the_mode_is_exactly_0600_whatever_the_umask(
    tmp_path: Path, store: Store, umask: int
) -> None:
    previous = os.umask(umask)
    try:
        path = ensure_admin_token(store, tmp_path)
    finally:
        os.umask(previous)
    assert mode(path) == 0o600


ALICE = Principal("alice", "vision", False)
LONER = Principal("bob", None, False)
ADMIN = Principal("root", None, True)


@pytest.mark.parametrize(
    ("principal", "job_user", "job_vc", "read", "act"),
    [
        (ALICE, "alice", "vision", True, True),  # her own job
        (ALICE, "alice", "nlp", True, True),  # her own job, in another VC
        (ALICE, "carol", "vision", True, False),  # her VC's job: read, not cancel
        (ALICE, "carol", "nlp", False, False),  # someone else's, elsewhere
        (LONER, "bob", "default", True, True),
        (LONER, "carol", "default", False, False),  # no VC: no VC's jobs to read
        (ADMIN, "carol", "nlp", True, True),
    ],
)
def test_read_and_act_rules(
    principal: Principal, job_user: str, job_vc: str, read: bool, act: bool
) -> None:
    assert can_read_job(principal, job_user, job_vc) is read
    assert can_act_on_job(principal, job_user) is act


@pytest.mark.parametrize(
    ("principal", "vc", "allowed"),
    [
        (ALICE, "vision", True),
        (ALICE, "nlp", False),
        (ALICE, "default", False),
        (LONER, "nlp", True),
        (LONER, "default", True),
        (ADMIN, "nlp", True),
    ],
)
def test_submit_rules(principal: Principal, vc: str, allowed: bool) -> None:
    assert can_submit_to(principal, vc) is allowed


def test_visible_to_matches_the_store_filter() -> None:
    assert visible_to(ALICE) == ("alice", "vision")
    assert visible_to(LONER) == ("bob", None)
    assert visible_to(ADMIN) is None


@pytest.mark.parametrize(
    ("principal", "level", "allowed"),
    [(ALICE, 0, True), (ALICE, -5, True), (ALICE, 1, False), (ADMIN, 1_000_000, True)],
)
def test_only_admins_raise_a_level(principal: Principal, level: int, allowed: bool) -> None:
    assert can_set_level(principal, level) is allowed
