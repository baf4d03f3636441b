"""Putting a manager together: data directory, store, executor and its cluster, HTTP server.

Boot knows no executor by name: the one `ServerOptions.executor` names is looked up in
corral.server.executors, which checks its options and settings and starts it on its cluster.
"""

from __future__ import annotations

import fcntl
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import uvicorn

from corral.core.cluster import Cluster, NodeDef
from corral.core.queues import QueueTree
from corral.exec import safefs
from corral.server import auth, identity
from corral.server.api import create_app
from corral.server.connections import ConnectionGuard
from corral.server.datacache import cache_root
from corral.server.executors import (
    DEFAULT_EXECUTOR,
    Boot,
    ExecutorEntry,
    ExecutorError,
    executor_entry,
    executor_options,
)
from corral.server.leader import FencedExecutor, Lease
from corral.server.manager import Executor, Manager, ManagerSettings
from corral.server.standby import StandbyServer
from corral.server.store import Store, StoreError


class BootError(ValueError):
    """A setting `corral up` cannot start with: one line, exit 2."""


@dataclass(slots=True)
class ServerOptions:
    data_dir: Path
    gpus: int | None = None  # declared GPUs; None: ask NVML
    gpu_type: str = "gpu"
    config: Path | None = None
    db_url: str | None = None  # never with a password in it (corral.server.dbsecret)
    host: str = "127.0.0.1"
    port: int = 8470
    settings: ManagerSettings = field(default_factory=ManagerSettings)
    #: How attempts run: a name in corral.server.executors.EXECUTORS.
    executor: str = DEFAULT_EXECUTOR
    #: That executor's options: an instance of its `Options`, or a mapping of them by name
    #: (`{"address": "HOST:PORT"}` for ray; what its `--NAME-OPTION` flags gave), which
    #: `check_executor` replaces with the checked instance; None: its defaults.
    executor_options: Any = None
    #: Run every job as the manager's own user even when it runs as root.
    single_user: bool = False
    #: The memory (MiB) of this machine's GPUs (`--gpu-memory`); None: NVML's, where it tells.
    gpu_memory_mib: int | None = None
    #: The database's password (`--db-password-file`'s); None: libpq's (PGPASSFILE, ~/.pgpass).
    db_password: str | None = field(default=None, repr=False)
    #: The file whose token /metrics asks for (`--metrics-token-file`); None: DATA_DIR's
    #: metrics.token, written at the first start.
    metrics_token_file: Path | None = None
    #: /metrics without a token (`--metrics-public`).
    metrics_public: bool = False
    #: The demo workload runs (`--demo`).
    demo: bool = False


def boot_info(options: ServerOptions) -> Boot:
    """What an executor is told of the settings (the manager's settings object itself)."""
    return Boot(
        data_dir=options.data_dir,
        settings=options.settings,
        gpus=options.gpus,
        gpu_type=options.gpu_type,
        gpu_memory_mib=options.gpu_memory_mib,
        config=options.config,
        demo=options.demo,
    )


def check_executor(options: ServerOptions) -> type[ExecutorEntry]:
    """The executor `options` names, its options checked (`options.executor_options` becomes the
    checked instance) and the settings it refuses refused: BootError, one line naming the flag.
    Nothing is made or written."""
    try:
        entry = executor_entry(options.executor)
        options.executor_options = executor_options(entry, options.executor_options)
    except ExecutorError as error:
        raise BootError(str(error)) from None
    problem = entry.refusal(options.executor_options, boot_info(options))
    if problem is not None:
        raise BootError(problem)
    return entry


def lock_data_dir(data_dir: Path) -> int:
    """Hold DIR/corral.lock for the life of the manager: a second manager on the same state would
    run every job twice. The kernel drops the lock when the process dies, kill -9 included."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(data_dir / "corral.lock", flags, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise BootError(
            f"{data_dir}: another corral manager (pid {holder}) is using this data directory"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def trusted_directory(flag: str, path: Path) -> None:
    """BootError (one line: the path, what is wrong, the fix) unless `path` and every directory
    above it belong to root or the manager's account and no one else may write them (a parent
    others may write only with the sticky bit, as /tmp has): whoever could write there could
    swap what root reads, an attempt's launch.json above all (corral.exec.safefs)."""
    problem = safefs.check_trusted_dir(path)
    if problem is None:
        return
    trusted = " or ".join(
        safefs.owner_name(uid).split(" ")[0] for uid in sorted(safefs.trusted_uids())
    )
    raise BootError(
        f"{flag} {path}: {problem}; use a directory that only {trusted} may write, inside "
        f"directories that only {trusted} may write or that have the sticky bit (as /tmp has); "
        "one that another account made first may hold what it put there: remove it, or choose "
        "another"
    )


def prepare_data_dir(options: ServerOptions) -> None:
    """Make the data directory (and `--cache-dir`, `--checkpoint-root` when given) and check,
    before anything is written there, that no one but root or the manager's account can change
    what is in them (`trusted_directory`): its `jobs/` tree too, when it exists."""
    options.data_dir = options.data_dir.resolve()
    options.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # logs may hold secrets
    trusted_directory("--data-dir", options.data_dir)
    if (options.data_dir / "jobs").exists():
        trusted_directory("--data-dir", options.data_dir / "jobs")
    settings = options.settings
    if settings.cache is not None:
        root = cache_root(settings.cache, options.data_dir)
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        trusted_directory("--cache-dir", root)
    if settings.checkpoint_root is not None:
        settings.checkpoint_root = Path(settings.checkpoint_root).resolve()
        # Jobs' accounts pass through it to their own directories, never list it.
        settings.checkpoint_root.mkdir(mode=0o711, parents=True, exist_ok=True)
        trusted_directory("--checkpoint-root", settings.checkpoint_root)


def build_manager(
    options: ServerOptions,
    executor: Executor | None = None,
    *,
    lease: Lease | None = None,
    data_lock: int | None = None,
) -> Manager:
    """The manager `options` describe, over the executor they name (`executor`: one a caller made
    already, a test's). BootError, one line, for a setting it cannot start with. `lease`: this
    manager leads a database it shares with standbys (corral.server.leader; its store is the
    lease's, its writes fenced, its starts and stops too); `data_lock`: the data directory's
    lock, taken already (`lock_data_dir`)."""
    entry = check_executor(options)  # before anything is written
    prepare_data_dir(options)
    lock = lock_data_dir(options.data_dir) if data_lock is None else data_lock
    try:
        manager = _build_manager(options, entry, executor, lease)
        if entry.accounts and identity.multi_user_possible() and not options.single_user:
            try:
                prepare_multi_user(options)
            except BaseException:
                manager.stop()
                raise
    except BaseException:
        os.close(lock)
        raise
    manager.on_stop.append(lambda: os.close(lock))
    return manager


def shares_database(options: ServerOptions) -> bool:
    """Whether `options` name a database several managers may share (PostgreSQL): then one
    leads, by lease, and the others stand by (docs/ha.md)."""
    if options.db_url is None:
        return False
    try:
        return sa.make_url(options.db_url).get_backend_name() == "postgresql"
    except sa.exc.ArgumentError:
        return False


def advertised_url(options: ServerOptions) -> str:
    """The address a standby gives clients for this manager."""
    host = options.host
    if host in ("0.0.0.0", "::", ""):
        host = socket.getfqdn()
    return f"http://{host}:{options.port}"


#: A leader's session idle inside a transaction this long is ended by PostgreSQL (a leader
#: paused mid-write holds no lock a standby waits on for longer).
IDLE_TRANSACTION_S = 4.0


@dataclass(slots=True)
class Leading:
    """What `lead` hands `build_manager`: the lease, held and renewed (its writes fenced), the
    data directory's lock, and the executor a standby made while it waited (None: none)."""

    lease: Lease
    data_lock: int
    executor: Executor | None = None


def lead(
    options: ServerOptions, say: Callable[[str], None], stopping: threading.Event | None = None
) -> Leading | None:
    """Lead the database `options` name, shared with other managers: take its lease, or stand by
    (a StandbyServer answers on this manager's address, 503 and the leader's) until it can be
    taken, its executor made beforehand where it can be (`ExecutorEntry.prepare`). None when
    `stopping` was set first. BootError, one line, if the database cannot be used."""
    entry = check_executor(options)
    prepared: Executor | None = None
    prepare_data_dir(options)
    lock = lock_data_dir(options.data_dir)
    try:
        assert options.db_url is not None
        try:
            store = Store(
                options.db_url, password=options.db_password, idle_transaction_s=IDLE_TRANSACTION_S
            )
        except StoreError as error:
            raise BootError(str(error)) from None
        try:
            lease = Lease(store, advertised_url(options))
            if not lease.try_take():
                current = lease.current()
                leader = current.address if current is not None else "?"
                say(
                    f"corral up: standby: {leader} leads {store.url}; this manager takes over "
                    f"if its lease is not renewed for {lease.lease_s:g} s"
                )
                standby = StandbyServer(lease, options.host, options.port).start()
                try:
                    prepared = entry.prepare(
                        options.executor_options, boot_info(options), store.get_meta
                    )
                    if not lease.wait_to_lead(stopping):
                        if prepared is not None:
                            prepared.close()
                        store.close()
                        os.close(lock)
                        return None
                finally:
                    standby.stop()
            lease.start()
        except BaseException:
            if prepared is not None:
                prepared.close()
            store.close()
            raise
    except StoreError as error:
        os.close(lock)
        raise BootError(str(error)) from None
    except BaseException:
        os.close(lock)
        raise
    return Leading(lease, lock, prepared)


def role_line(lease: Lease) -> str:
    """What `corral up` says of its role once it leads."""
    before = lease.took_over_from
    took = f"; took over from {before.holder} ({before.address})" if before is not None else ""
    return f"leader (lease epoch {lease.epoch}, {lease.lease_s:g} s{took})"


def prepare_multi_user(options: ServerOptions) -> None:
    """Root runs each user's jobs as that user: the jobs must reach their own directories under
    the data dir (searchable, not listable: 0711), and nothing else the manager writes there may
    be readable by them (umask 077: the database, tokens, launch files with jobs' environments)."""
    # The settings object is the manager's own: it runs no job before `start`.
    blocked = identity.check_reachable(options.data_dir)
    if blocked is not None:
        raise BootError(
            f"--data-dir {options.data_dir}: jobs run under their users' accounts and could not "
            f"reach their directories there ({blocked} is closed to others); choose a data "
            "directory others may pass through, or --single-user"
        )
    os.umask(0o077)
    options.data_dir.chmod(0o711)
    cache = options.settings.cache
    root = None if cache is None else cache_root(cache, options.data_dir)
    blocked = None if root is None else identity.check_reachable(root)
    if blocked is not None:
        raise BootError(
            f"--cache-dir: jobs run under their users' accounts and could not reach their data "
            f"sets' caches there ({blocked} is closed to others); choose a directory others may "
            "pass through"
        )
    checkpoints = options.settings.checkpoint_root
    blocked = None if checkpoints is None else identity.check_reachable(checkpoints / "job")
    if blocked is not None:
        raise BootError(
            f"--checkpoint-root: jobs run under their users' accounts and could not reach their "
            f"checkpoint directories there ({blocked} is closed to others); chmod o+x it, or "
            "choose a directory others may pass through"
        )
    options.settings.multi_user = True


def _build_manager(
    options: ServerOptions,
    entry: type[ExecutorEntry],
    executor: Executor | None,
    lease: Lease | None = None,
) -> Manager:
    boot = boot_info(options)
    if lease is not None:
        boot.shared = partial(shared_meta, lease.store)
    try:
        started = entry.start(options.executor_options, boot, executor)
    except ExecutorError as error:
        raise BootError(str(error)) from None
    try:
        return _build_with(
            options,
            started.executor,
            started.cluster,
            started.vc_quota,
            started.vc_cells,
            vc_tree=started.vc_tree,
            fixed_cluster=started.fixed_cluster,
            nodes=started.nodes,
            lease=lease,
        )
    except BaseException:
        started.executor.close()
        raise


def _build_with(
    options: ServerOptions,
    executor: Executor,
    cluster: Cluster,
    quota: dict[str, int] | None,
    cells: dict[str, dict[str, int]] | None = None,
    *,
    vc_tree: QueueTree | None = None,
    fixed_cluster: bool = False,
    nodes: Callable[[], list[NodeDef]] | None = None,
    lease: Lease | None = None,
) -> Manager:
    try:
        store = (
            Store(
                options.db_url or Store.sqlite_url(options.data_dir),
                password=options.db_password,
            )
            if lease is None
            else lease.store
        )
    except StoreError as error:
        raise BootError(str(error)) from None
    try:
        if lease is None:
            store.claim()
        else:  # leadership is the lease's (docs/ha.md); the jobs' directories are shared
            executor = FencedExecutor(executor, lease)
        if options.db_url is None:  # for the manager alone (also when an older version made it)
            for name in ("corral.db", "corral.db-wal", "corral.db-shm"):
                if (options.data_dir / name).exists():
                    (options.data_dir / name).chmod(0o600)
        auth.ensure_admin_token(store, options.data_dir)
        settings = options.settings
        settings.metrics_public = options.metrics_public
        if not options.metrics_public:
            token = auth.metrics_token(options.data_dir, options.metrics_token_file)
            settings.metrics_token_sha256 = auth.secret_digest(token)
        manager = Manager(
            store,
            executor,
            cluster,
            options.data_dir,
            vc_quota=quota,
            vc_cells=cells,
            vc_tree=vc_tree,
            settings=options.settings,
            nodes=nodes,
            fixed_cluster=fixed_cluster,
        )
        if lease is not None:
            manager.lease = lease
            manager.use_jobs_root(shared_jobs_root(store, options.data_dir))
    except (StoreError, ValueError) as error:
        store.close()
        raise BootError(str(error)) from None
    except BaseException:
        store.close()
        raise
    if lease is not None:  # given up before the store closes: a standby takes over at once
        manager.on_stop.append(lease.stop)
    manager.on_stop.append(store.close)  # and with it the claim on the database
    return manager


#: The `meta` key of the jobs' directories' root that managers sharing a database share.
JOBS_ROOT_KEY = "jobs_root"


def shared_meta(store: Store, key: str, mine: str) -> str:
    """The value of `key` every manager of a shared database uses: the one recorded, else
    `mine`, recorded now (only the leader builds a manager: no two record at once)."""
    recorded = store.get_meta(key)
    if recorded is None:
        store.set_meta(key, mine)
        return mine
    return recorded


def shared_jobs_root(store: Store, data_dir: Path) -> Path:
    """Where the jobs' directories are for every manager of a shared database: the first
    leader's DATA_DIR/jobs, recorded in the store, so that a standby that takes over finds the
    attempts' shims and checkpoints where they are (it must see that directory: the same
    machine, or storage both machines mount). BootError if it cannot be used."""
    recorded = store.get_meta(JOBS_ROOT_KEY)
    if recorded is None:
        root = data_dir / "jobs"
        store.set_meta(JOBS_ROOT_KEY, str(root))
        return root
    root = Path(recorded)
    if root.exists():
        trusted_directory("--data-dir", root)
    return root


class RunningServer:
    """The API server in a background thread (tests, the demo); `corral up` runs it in front."""

    def __init__(self, manager: Manager, host: str = "127.0.0.1", port: int = 0) -> None:
        self.manager = manager
        if port == 0:
            with socket.socket() as probe:
                probe.bind((host, 0))
                port = probe.getsockname()[1]
        self.url = f"http://{host}:{port}"
        self.guard = ConnectionGuard.start(manager.settings.connections, manager.metrics.registry)
        config = uvicorn.Config(
            create_app(manager),
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            **self.guard.uvicorn_options(),
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="corral-api", daemon=True)

    def start(self) -> RunningServer:
        self.manager.start()
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise BootError(f"the API server did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.guard.close()
        self.manager.stop()
