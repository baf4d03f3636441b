"""API tokens and who may do what.

A token is a random secret shown once, when it is created; the store keeps only its SHA-256, so a
copy of the database does not give access. A token names a user, optionally the user's VC, the
Unix account the user's jobs run as, and whether it is an admin's. It may expire, and it can be
revoked. Rules: users see their own jobs and those of their VC, act (cancel) only on their own,
and submit only to their own VC when they have one; admins may do everything.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import re
import secrets
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from corral.server.privatefile import read_private_file
from corral.server.store import TOKEN_ID_CHARS, Store, TokenRow

ADMIN_TOKEN_FILE = "admin.token"
ADMIN_USER = "admin"
#: The token Prometheus sends for /metrics (`corral up` writes it, unless given another file).
METRICS_TOKEN_FILE = "metrics.token"
#: A secret file's token: at least this many characters (`openssl rand -hex 32` gives 64).
MIN_SECRET_CHARS = 32


@dataclass(slots=True, frozen=True)
class Principal:
    """Who a request comes from."""

    user: str
    vc: str | None
    admin: bool
    #: The Unix account the user's jobs run as; None: the account named like the user.
    unix_user: str | None = None


#: A verified token is looked up again when its check is older than this (seconds): a token
#: revoked by another process sharing the database (PostgreSQL) is refused within this time.
#: A revocation through this process, and an expiry, take effect at once.
RECHECK_S = 1.0
#: User and VC names: at most this many characters.
MAX_NAME_CHARS = 128
#: POSIX's portable user names (useradd's default rule), at most 32 characters.
UNIX_USER_PATTERN = re.compile(r"[a-z_][a-z0-9_-]*[$]?")
MAX_UNIX_USER_CHARS = 32
TOKEN_ID_PATTERN = re.compile(rf"[0-9a-f]{{{TOKEN_ID_CHARS}}}")


@dataclass(slots=True)
class _Verified:
    principal: Principal
    checked: float  # time.monotonic() of the lookup
    expires_at: float | None


@dataclass(slots=True)
class _Cache:
    entries: dict[str, _Verified] = field(default_factory=dict)
    #: Counts revocations: a lookup that began before one does not enter its result.
    generation: int = 0


# Verified tokens per store. Misses are not cached, so a token created since (by another process)
# is found on its first use.
_verified: weakref.WeakKeyDictionary[Store, _Cache] = weakref.WeakKeyDictionary()


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def token_id(secret: str) -> str:
    """The public id of the token with this secret (`TokenRow.id`)."""
    return token_hash(secret)[:TOKEN_ID_CHARS]


def check_name(name: str, value: str) -> str:
    """A user or VC name as stored: no control or invisible characters (PostgreSQL refuses NUL;
    a newline would forge lines in logs), at most MAX_NAME_CHARS. ValueError names the field."""
    if len(value) > MAX_NAME_CHARS:
        raise ValueError(f"{name}: at most {MAX_NAME_CHARS} characters (got {len(value)})")
    if not value.isprintable():
        raise ValueError(f"{name}: must not contain control or invisible characters (NUL, ...)")
    return value


def check_unix_user(value: str) -> str:
    """A portable Unix user name (whether the account exists is checked at submission)."""
    if len(value) > MAX_UNIX_USER_CHARS or not UNIX_USER_PATTERN.fullmatch(value):
        shown = repr(value) if len(value) <= MAX_UNIX_USER_CHARS else f"{len(value)} characters"
        raise ValueError(
            f"unix_user: {shown} is not a portable Unix user name (lower-case letters, digits, "
            f"_ and -, not starting with a digit or -, at most {MAX_UNIX_USER_CHARS} characters)"
        )
    return value


def token_state(row: TokenRow, now: float | None = None) -> str:
    """The state of a token: active, expired or revoked."""
    if row.revoked_at is not None:
        return "revoked"
    if row.expires_at is not None and (time.time() if now is None else now) >= row.expires_at:
        return "expired"
    return "active"


def create_token(
    store: Store,
    user: str,
    vc: str | None = None,
    admin: bool = False,
    name: str | None = None,
    *,
    expires_at: float | None = None,
    unix_user: str | None = None,
) -> str:
    """Create a token for `user` and return its secret: the only time it is ever seen.
    ValueError (naming the field) for a name that cannot be stored."""
    if not user.strip():
        raise ValueError("user: must not be empty")
    check_name("user", user)
    if vc is not None:
        check_name("vc", vc)
    if unix_user is not None:
        check_unix_user(unix_user)
    if expires_at is not None and not math.isfinite(expires_at):
        raise ValueError("expires_at: must be a finite time")
    secret = secrets.token_urlsafe(32)
    store.insert_token(
        token_hash(secret),
        user,
        vc,
        admin,
        time.time(),
        name,
        expires_at=expires_at,
        unix_user=unix_user,
    )
    return secret


def verify(store: Store, token: str | None) -> Principal | None:
    """The principal a token stands for, or None for a missing, unknown, expired or revoked
    token. A token verified less than RECHECK_S ago is not looked up again (one indexed query,
    by the hash's primary key, otherwise)."""
    if not token:
        return None
    digest = token_hash(token)
    cache = _verified.get(store)
    if cache is None:
        cache = _verified.setdefault(store, _Cache())
    entry = cache.entries.get(digest)
    if (
        entry is not None
        and time.monotonic() - entry.checked < RECHECK_S
        and (entry.expires_at is None or time.time() < entry.expires_at)
    ):
        return entry.principal
    generation = cache.generation
    checked = time.monotonic()
    row = store.token_by_hash(digest)
    if row is None or token_state(row) != "active":
        cache.entries.pop(digest, None)
        return None
    principal = Principal(user=row.user, vc=row.vc, admin=row.admin, unix_user=row.unix_user)
    if cache.generation == generation:  # no revocation here while it was looked up
        cache.entries[digest] = _Verified(principal, checked, row.expires_at)
    return principal


def _forget_verified(store: Store) -> None:
    cache = _verified.get(store)
    if cache is not None:
        cache.generation += 1
        cache.entries.clear()


def revoke_user(store: Store, user: str) -> list[TokenRow]:
    """Revoke every token of `user` (refused at once by this process, within RECHECK_S by
    others on the same database); returns those revoked now."""
    try:
        return store.revoke_tokens(time.time(), user=user)
    finally:
        _forget_verified(store)


def revoke_token(store: Store, token_id: str) -> TokenRow | None:
    """Revoke the token with this public id; returns it (revoked now, or before), or None when
    no token has that id."""
    row = store.token_by_id(token_id) if TOKEN_ID_PATTERN.fullmatch(token_id) else None
    if row is None:
        return None
    try:
        revoked = store.revoke_tokens(time.time(), sha256=row.sha256)
    finally:
        _forget_verified(store)
    return revoked[0] if revoked else row


def ensure_admin_token(store: Store, data_dir: str | Path) -> Path:
    """Make sure DIR/admin.token holds a working admin token; return its path.

    The first start creates the token and the file (mode 0600). Later starts leave a file whose
    token this store knows alone. A missing file, or one whose token this store does not know
    (a fresh database given with --db) or no longer accepts (revoked, expired), gets a new admin
    token.
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


def read_secret_file(path: Path, flag: str) -> str:
    """The token a secret file holds (one line, whitespace around it ignored, as Prometheus reads
    its `credentials_file`): a private file (corral.server.privatefile), not reached through a
    link; ValueError, one line naming `flag` and the file, otherwise."""
    token = read_private_file(path, flag, follow_links=False).strip()
    if not token.isprintable() or " " in token:
        raise ValueError(f"{flag} {path}: must hold one token, a line without spaces")
    if len(token) < MIN_SECRET_CHARS:
        raise ValueError(
            f"{flag} {path}: the token has {len(token)} characters; give at least "
            f"{MIN_SECRET_CHARS} (e.g. openssl rand -hex 32)"
        )
    return token


def metrics_token(data_dir: str | Path, given: Path | None = None) -> str:
    """The token /metrics asks for: the one in `given` (`--metrics-token-file`), else the one
    in DIR/metrics.token, written (mode 0600) when there is none. A file that is not a good
    secret file is refused (ValueError), never replaced: Prometheus holds a copy."""
    path = given if given is not None else Path(data_dir) / METRICS_TOKEN_FILE
    if given is None and not os.path.lexists(path):
        _write_private(path, secrets.token_urlsafe(32) + "\n")
    return read_secret_file(path, "--metrics-token-file")


def secret_digest(token: str) -> bytes:
    """What the manager keeps of a shared secret: its SHA-256 (compared in constant time)."""
    return hashlib.sha256(token.encode("utf-8")).digest()


def matches_secret(token: str, digest: bytes) -> bool:
    """Whether `token` is the secret of `digest`, in time that does not depend on where they
    differ (both sides are hashed first: neither its length nor a prefix leaks)."""
    return hmac.compare_digest(secret_digest(token), digest)


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


def can_set_level(principal: Principal, level: int) -> bool:
    """A level above 0 puts a job ahead of others' (and may preempt them): admins only. Others
    may lower their own jobs, as Slurm lets users raise only their own jobs' nice value."""
    return principal.admin or level <= 0


def visible_to(principal: Principal) -> tuple[str, str | None] | None:
    """The `visible_to` filter of Store.list_jobs for this principal (None: sees everything)."""
    return None if principal.admin else (principal.user, principal.vc)
