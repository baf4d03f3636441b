"""Putting a manager together: data directory, store, GPUs, cluster, executor, HTTP server."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, cast

import uvicorn

from corral.core.cluster import Cluster, ClusterError, NodeDef
from corral.core.config import ConfigError, vc_gpu_quota
from corral.exec import safefs
from corral.exec.gpus import (
    NoGpusError,
    discover_gpus,
    nvml_topology,
    smallest_memory_mib,
    uniform_group_size,
)
from corral.exec.local import LocalExecutor
from corral.exec.shim import write_json_atomic
from corral.server import auth, identity
from corral.server.api import create_app
from corral.server.connections import ConnectionGuard
from corral.server.datacache import cache_root
from corral.server.manager import Executor, Manager, ManagerSettings
from corral.server.store import Store, StoreError

log = logging.getLogger("corral.boot")

if TYPE_CHECKING:
    from corral.exec.ray import RayExecutor


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
    executor: str = "local"  # or "ray"
    ray_address: str | None = None  # HOST:PORT of the Ray cluster's head (GCS)
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


EXECUTORS = ("local", "ray")


def node_name() -> str:
    return socket.gethostname().split(".")[0] or "localhost"


def build_cluster(
    options: ServerOptions,
) -> tuple[Cluster, dict[str, int], dict[str, dict[str, int]] | None]:
    """The machine as a one-node cluster (or the config's cluster, which must be one node), the
    VCs' guaranteed GPUs and, from a config, their cells (HiveD's guarantees)."""
    if options.config is not None:
        from corral.config_file import load_cluster_config

        try:
            config = load_cluster_config(options.config)
        except ConfigError as error:
            raise BootError(str(error)) from None
        cluster = config.cluster
        if len(cluster.nodes) != 1:
            raise BootError(
                f"{options.config}: describes {len(cluster.nodes)} nodes; the local executor "
                "runs jobs on this one machine: give one node"
            )
        if options.gpus is None:
            try:
                found = len(discover_gpus(None))
            except NoGpusError:
                found = cluster.total_gpus  # a machine without GPUs runs the config as declared
        else:
            found = options.gpus
        if found < cluster.total_gpus:
            raise BootError(
                f"{options.config}: the node has {cluster.total_gpus} GPUs but this machine "
                f"has {found}"
            )
        return cluster, vc_gpu_quota(config), config.virtual_clusters
    switch_size = None
    try:
        if options.gpus is None:  # NVML: the GPUs and the PCIe switches they sit under
            topology = nvml_topology()
            gpus = topology.gpus
            switch_size = uniform_group_size(topology.switch_groups, len(gpus))
        else:
            gpus = discover_gpus(options.gpus, gpu_type=options.gpu_type)
    except NoGpusError as error:
        raise BootError(str(error)) from None
    try:
        node = NodeDef(
            name=node_name(),
            gpus=len(gpus),
            gpu_type=gpus[0].gpu_type,
            gpus_per_switch=switch_size,
        )
        cluster = Cluster.from_nodes([node])
    except ClusterError as error:
        raise BootError(str(error)) from None
    return cluster, {"default": cluster.total_gpus}, None


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


def build_manager(options: ServerOptions, executor: Executor | None = None) -> Manager:
    prepare_data_dir(options)
    lock = lock_data_dir(options.data_dir)
    try:
        manager = _build_manager(options, executor)
        if identity.multi_user_possible() and not options.single_user:
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


def ray_node_defs(executor: RayExecutor) -> list[NodeDef]:
    return [
        NodeDef(name=node.name, gpus=node.gpus, gpu_type=node.gpu_type, rack=node.rack)
        for node in executor.nodes()
    ]


def ray_namespace(data_dir: Path) -> str:
    """This manager's Ray namespace, made once per data dir: the actors it finds again after a
    restart are its own, never those of another manager of the same Ray cluster."""
    path = data_dir / "ray-namespace"
    if not path.exists():
        write_json_atomic(path, {"namespace": f"corral-{uuid.uuid4().hex[:12]}"}, durable=True)
    return str(json.loads(path.read_text())["namespace"])


def connect_ray(options: ServerOptions) -> RayExecutor:
    if not options.ray_address:
        raise BootError("--executor ray: needs --ray-address HOST:PORT (the head node's GCS)")
    try:
        from corral.exec.ray import RayExecutor, access_problem
    except ImportError:
        raise BootError(
            "--executor ray: Ray is not installed (pip install 'corral[ray]')"
        ) from None
    host, _, port = options.ray_address.rpartition(":")
    if not host or not port.isdigit():
        raise BootError(f"--ray-address {options.ray_address}: expected HOST:PORT")
    try:  # Ray itself would retry for minutes before it says so
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as error:
        raise BootError(
            f"--ray-address {options.ray_address}: no Ray head answers there "
            f"({error.strerror or error})"
        ) from None
    problem = access_problem(options.ray_address)
    if problem is not None:
        raise BootError(f"--ray-address {options.ray_address}: {problem}")
    try:
        return RayExecutor(options.ray_address, ray_namespace(options.data_dir))
    except (ConnectionError, RuntimeError, ValueError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise BootError(f"--ray-address {options.ray_address}: cannot connect ({first})") from None


def build_ray_cluster(
    options: ServerOptions, executor: RayExecutor
) -> tuple[Cluster, dict[str, int] | None, dict[str, dict[str, int]] | None, bool]:
    """The core's cluster on Ray, the VCs' guaranteed GPUs and cells, and whether the cluster
    is fixed. Without hived: the Ray nodes that declare GPUs (rebuilt as they come and go); the
    config, if any, gives the VCs. With hived: the config's cluster itself, whose physical cells
    name the Ray nodes (`corral-node-NAME`): HiveD binds VCs to cells of a fixed topology, so a
    node that is missing is held out of allocation until it joins, never rebuilt away."""
    hived = options.settings.scheduler.core.admission[0] == "hived"
    if hived and options.config is None:
        raise BootError(
            "--admission hived: needs --config FILE whose physical cells name the Ray nodes "
            "(their corral-node-NAME resources)"
        )
    nodes = ray_node_defs(executor)
    if not nodes and not hived:
        raise BootError(
            f"--ray-address {options.ray_address}: no node declares GPUs "
            "(start them with `ray start --num-gpus=N`)"
        )
    if options.config is None:
        return Cluster.from_nodes(nodes), None, None, False
    from corral.config_file import load_cluster_config

    try:
        config = load_cluster_config(options.config)
    except ConfigError as error:
        raise BootError(str(error)) from None
    if not hived:
        return Cluster.from_nodes(nodes), vc_gpu_quota(config), None, False
    named = {node.name for node in config.cluster.nodes}
    if not named & {node.name for node in nodes}:
        log.warning(
            "no Ray node is one of %s's nodes (%s) yet: nothing starts until one joins",
            options.config,
            ", ".join(sorted(named)),
        )
    return config.cluster, vc_gpu_quota(config), config.virtual_clusters, True


def _build_manager(options: ServerOptions, executor: Executor | None) -> Manager:
    if options.executor not in EXECUTORS:
        raise BootError(f"--executor: unknown {options.executor!r}; choose local or ray")
    if options.executor == "ray" and "packing" in options.settings.scheduler.core.stages:
        # Ray gives each GPU to one actor: a packed guest's workers would never be scheduled.
        raise BootError(
            "--stages packing: runs with the local executor only (Ray lets one actor hold a GPU)"
        )
    if options.executor == "ray":
        # Given one (tests), it is a RayExecutor already connected.
        ray_executor = cast("RayExecutor", executor) if executor else connect_ray(options)
        try:
            cluster, quota, cells, fixed = build_ray_cluster(options, ray_executor)
            return _build_with(options, ray_executor, cluster, quota, cells, fixed_cluster=fixed)
        except BaseException:
            ray_executor.close()
            raise
    cluster, quota, cells = build_cluster(options)
    learn_gpu_memory(options, cluster)
    return _build_with(options, executor or LocalExecutor(), cluster, quota, cells)


def learn_gpu_memory(options: ServerOptions, cluster: Cluster) -> None:
    """The memory of this machine's GPUs, for shares (`ManagerSettings.gpu_memory_mib`): the
    declared `--gpu-memory`, else NVML's (the smallest GPU's), else none known. Settings that
    already name it (a test's) are kept."""
    settings = options.settings
    size = options.gpu_memory_mib
    if size is None and not settings.gpu_memory_mib and options.gpus is None:
        try:
            size = smallest_memory_mib(discover_gpus(None))
        except NoGpusError:  # a config run on a machine without GPUs
            size = None
    if size is not None:
        settings.gpu_memory_mib = dict.fromkeys(cluster.gpu_types, size)


def _build_with(
    options: ServerOptions,
    executor: Executor,
    cluster: Cluster,
    quota: dict[str, int] | None,
    cells: dict[str, dict[str, int]] | None = None,
    *,
    fixed_cluster: bool = False,
) -> Manager:
    nodes = partial(ray_node_defs, executor) if options.executor == "ray" else None
    try:
        store = Store(
            options.db_url or Store.sqlite_url(options.data_dir), password=options.db_password
        )
    except StoreError as error:
        raise BootError(str(error)) from None
    try:
        store.claim()
        if options.db_url is None:  # for the manager alone (also when an older version made it)
            for name in ("corral.db", "corral.db-wal", "corral.db-shm", "ray-namespace"):
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
            settings=options.settings,
            nodes=nodes,
            fixed_cluster=fixed_cluster,
        )
    except (StoreError, ValueError) as error:
        store.close()
        raise BootError(str(error)) from None
    except BaseException:
        store.close()
        raise
    manager.on_stop.append(store.close)  # and with it the claim on the database
    return manager


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
