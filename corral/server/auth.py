"""API tokens and who may do what.

A token is a random secret shown once, when it is created; the store keeps only its SHA-256, so a
copy of the database does not give access. A token names a user, optionally the user's VC, and
whether it is an admin's. Rules: users see their own jobs and those of their VC, act (cancel) only
on their own, and submit only to their own VC when they have one; admins may do everything.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

from corral.server.store import Store

ADMIN_TOKEN_FILE = "admin.token"
ADMIN_USER = "admin"


@dataclass(slots=True, frozen=True)
class Principal:
    """Who a request comes from."""

    user: str
    vc: str | None
    admin: bool


# Verified tokens per store. Tokens are never revoked (yet), so an entry never goes stale; misses
# are not cached, so a token created since (by another process) is found on its first use.
_verified: weakref.WeakKeyDictionary[Store, dict[str, Principal]] = weakref.WeakKeyDictionary()


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def create_token(
    store: Store, user: str, vc: str | None = None, admin: bool = False, name: str | None = None
) -> str:
    """Create a token for `user` and return its secret: the only time it is ever seen."""
    if not user.strip():
        raise ValueError("user: must not be empty")
    secret = secrets.token_urlsafe(32)
    store.insert_token(token_hash(secret), user, vc, admin, time.time(), name)
    return secret


def verify(store: Store, token: str | None) -> Principal | None:
    """The principal a token stands for, or None for a missing or unknown token."""
    if not token:
        return None
    digest = token_hash(token)
    cache = _verified.setdefault(store, {})
    principal = cache.get(digest)
    if principal is None:
        row = store.token_by_hash(digest)
        if row is None:
            return None
        principal = Principal(user=row.user, vc=row.vc, admin=row.admin)
        cache[digest] = principal
    return principal


def ensure_admin_token(store: Store, data_dir: str | Path) -> Path:
    """Make sure DIR/admin.token holds a working admin token; return its path.

    The first start creates the token and the file (mode 0600). Later starts leave a file whose
    token this store knows alone. A missing file, or one whose token this store does not know
    (a fresh database given with --db), gets a new admin token.
    """
    directory = Path(data_dir)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / ADMIN_TOKEN_FILE
    try:
        existing = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        existing = None
    if existing is not None:
        principal = verify(store, existing)
        if principal is not None and principal.admin:
            return path
    secret = create_token(store, ADMIN_USER, admin=True, name=ADMIN_TOKEN_FILE)
    _write_private(path, secret + "\n")
    return path


def _write_private(path: Path, text: str) -> None:
    """Write a file readable by its owner only, atomically (a new file renamed over the old)."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    # Created 0600 from the start: the secret is never in a file others could open. The umask
    # can only clear bits, and fchmod on the still-empty file makes the mode exactly 0600.
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            os.fchmod(file.fileno(), 0o600)
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


# -- permissions ----------------------------------------------------------------------------------


def can_read_job(principal: Principal, job_user: str, job_vc: str) -> bool:
    """Admins read every job; users their own and those of their VC."""
    if principal.admin or principal.user == job_user:
        return True
    return principal.vc is not None and principal.vc == job_vc


def can_act_on_job(principal: Principal, job_user: str) -> bool:
    """Cancelling (or any change to) a job: its owner or an admin."""
    return principal.admin or principal.user == job_user


def can_submit_to(principal: Principal, vc: str) -> bool:
    """Users with a VC submit only to it; users without one, and admins, anywhere."""
    return principal.admin or principal.vc is None or principal.vc == vc


def visible_to(principal: Principal) -> tuple[str, str | None] | None:
    """The `visible_to` filter of Store.list_jobs for this principal (None: sees everything)."""
    return None if principal.admin else (principal.user, principal.vc)
