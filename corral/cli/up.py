"""`corral up`: the embedded manager (API, control loop, an executor) in the foreground."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from corral.cli.common import UserError, console, fail, warn
from corral.cli.output import plural
from corral.cli.registries import policy_help

if TYPE_CHECKING:
    from corral.server.health import HealthSettings
    from corral.server.state import CacheSettings

# root's manager is a system service whose jobs run as other accounts: its state goes where they
# can reach their own directories (root's home is closed to them).
DEFAULT_DATA_DIR = Path(
    os.environ.get("CORRAL_HOME", "/var/lib/corral" if os.geteuid() == 0 else "~/.corral")
).expanduser()
#: `--db-password-file`, of every command that takes `--db` (corral.server.dbsecret).
DbPasswordFile = Annotated[
    Path | None,
    typer.Option(
        help="--db's password, on the first line of this file (yours, mode 0600); "
        "default: libpq's (PGPASSFILE, ~/.pgpass)"
    ),
]


def up(
    gpus: Annotated[
        int | None,
        typer.Option(help="declare this many GPUs (a machine without GPUs); default: NVML's"),
    ] = None,
    gpu_type: Annotated[str, typer.Option(help="the type of declared GPUs")] = "gpu",
    gpu_memory: Annotated[
        str | None,
        typer.Option(
            help="the memory of this machine's GPUs (e.g. 16G, 80GiB), for shares of a GPU "
            "(a spec's gpu_memory, MPS's memory limit); default: NVML's, unknown for declared "
            "GPUs"
        ),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(help="the API and dashboard port [default: 8470; demo: a free one]"),
    ] = None,
    host: Annotated[str, typer.Option(help="the address to listen on")] = "127.0.0.1",
    data_dir: Annotated[
        Path | None,
        typer.Option(
            help="state, logs, checkpoints and admin.token live here "
            "[default: $CORRAL_HOME, or /var/lib/corral as root, ~/.corral otherwise; "
            "demo: a new runs/demo-TIME]"
        ),
    ] = None,
    config: Annotated[
        Path | None, typer.Option(help="cluster and VC config (the simulator's YAML)")
    ] = None,
    db: Annotated[
        str | None,
        typer.Option(
            help="a database URL without its password (postgresql+psycopg://USER@HOST/DB); "
            "default SQLite in DATA_DIR"
        ),
    ] = None,
    db_password_file: DbPasswordFile = None,
    scheduler_config: Annotated[
        Path | None,
        typer.Option(
            help="the scheduler's settings (YAML: a `scheduler:` section, as `corral config "
            "show` prints it); flags override it"
        ),
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option(help=policy_help()),
    ] = None,
    checkpoint_root: Annotated[
        Path | None,
        typer.Option(
            help="jobs' checkpoint dirs go under this path, the same on every node (shared "
            "storage) [default: DATA_DIR/jobs/JOB/checkpoint]"
        ),
    ] = None,
    cache_gb_per_node: Annotated[
        float | None,
        typer.Option(
            help="SiloD: a data-set cache of this many GB per node, scheduled with the GPUs, "
            "for jobs whose spec names a `dataset` (docs/silod.md#live)",
            rich_help_panel="Data caches",
        ),
    ] = None,
    storage_gbps: Annotated[
        float | None,
        typer.Option(
            help="with a cache: remote-storage Gbit/s per node, shared by its GPUs [default: 1]",
            rich_help_panel="Data caches",
        ),
    ] = None,
    cache_policy: Annotated[
        str | None,
        typer.Option(
            help="with a cache: lru (cache-oblivious) or silod (gain per GB) [default: lru]",
            rich_help_panel="Data caches",
        ),
    ] = None,
    cache_dir: Annotated[
        Path | None,
        typer.Option(
            help="with a cache: each node's cache directories go under this path, on the "
            "node's own disk (NODE/DATASET) [default: DATA_DIR/cache]",
            rich_help_panel="Data caches",
        ),
    ] = None,
    single_user: Annotated[
        bool,
        typer.Option(
            help="as root too, run every job as the manager's own user (by default root runs "
            "each user's jobs under that user's Unix account)"
        ),
    ] = False,
    log_cap: Annotated[
        str,
        typer.Option(help="each worker's stdout and stderr keep at most this much (e.g. 1G, 200M)"),
    ] = "1G",
    max_body_bytes: Annotated[
        int,
        typer.Option(min=1024, help="the API refuses (413) a request body longer than this"),
    ] = 1 << 20,
    max_connections: Annotated[
        int,
        typer.Option(
            help="the API's connections open at once, in all (at most half the open-file limit)",
            rich_help_panel="Connections",
        ),
    ] = 4096,
    max_connections_per_peer: Annotated[
        int,
        typer.Option(
            help="the API's connections open at once from one peer: a Unix account on this "
            "machine, else an address (more are answered 503)",
            rich_help_panel="Connections",
        ),
    ] = 256,
    header_timeout_s: Annotated[
        float,
        typer.Option(
            help="a request's line and headers must arrive within this many seconds",
            rich_help_panel="Connections",
        ),
    ] = 10.0,
    body_timeout_s: Annotated[
        float,
        typer.Option(
            help="a request's body must arrive within this many seconds of its headers",
            rich_help_panel="Connections",
        ),
    ] = 30.0,
    idle_timeout_s: Annotated[
        float,
        typer.Option(
            help="a kept-alive connection with no request for this many seconds is closed",
            rich_help_panel="Connections",
        ),
    ] = 5.0,
    max_requests_per_connection: Annotated[
        int,
        typer.Option(
            help="a connection is closed after this many requests",
            rich_help_panel="Connections",
        ),
    ] = 1000,
    job_pids_max: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="the most tasks (processes and threads) an attempt may have at once, its "
            "cgroup's pids.max (on Ray: each worker's); 0: no limit [default: 8192, or a "
            "quarter of this machine's pid_max where that is less]",
            show_default=False,
        ),
    ] = None,
    metrics_token_file: Annotated[
        Path | None,
        typer.Option(
            help="/metrics asks for the token in this file (owner-only mode), as Prometheus's "
            "`authorization: credentials_file:` sends it; admins' tokens work too "
            "[default: DATA_DIR/metrics.token, written at the first start]"
        ),
    ] = None,
    metrics_public: Annotated[
        bool,
        typer.Option(
            help="serve /metrics without a token (its per-job gauges name users' jobs): only "
            "where nothing untrusted reaches the port"
        ),
    ] = False,
    max_steps_per_s: Annotated[
        float,
        typer.Option(
            help="a job attempt measured faster than this many steps/s (by the manager's clock) "
            "has its progress reports rejected: none of its measurements count"
        ),
    ] = 100_000.0,
    round_every_s: Annotated[
        float,
        typer.Option(
            help="run a scheduling round at least this often, also when idle (/readyz and "
            "corral_last_round_timestamp_seconds see a live control loop)"
        ),
    ] = 5.0,
    ready_round_s: Annotated[
        float,
        typer.Option(help="/readyz answers 503 once no scheduling round ran for this long"),
    ] = 30.0,
    health_check: Annotated[
        str | None,
        typer.Option(
            help="a site's health-check command, run for each node every --health-every-s "
            "with CORRAL_NODE set (split like a shell line, run without a shell or the "
            "manager's environment): exit 0 is healthy, else the node is taken out with the "
            "first line of its output as the reason [default: the --config's health_check]",
            rich_help_panel="Health checks",
        ),
    ] = None,
    health_every_s: Annotated[
        float | None,
        typer.Option(
            help="run the health checks this often [default: 30]",
            rich_help_panel="Health checks",
        ),
    ] = None,
    health_timeout_s: Annotated[
        float | None,
        typer.Option(
            help="a health check that has not exited after this long is killed and the node "
            "is unhealthy [default: 10]",
            rich_help_panel="Health checks",
        ),
    ] = None,
    nvml_health: Annotated[
        bool | None,
        typer.Option(
            "--nvml-health/--no-nvml-health",
            help="take the node out when NVML reports an XID error, uncorrectable ECC errors, "
            "retired pages pending or a lost GPU (this machine's GPUs) [default: the "
            "--config's, else off]",
            rich_help_panel="Health checks",
        ),
    ] = None,
    demo: Annotated[
        bool,
        typer.Option(
            help="run the demo workload (two VCs, a preemption and resume) to the end, then exit"
        ),
    ] = False,
    *,
    scheduler: dict[str, Any],
    executor: str,
    executor_options: dict[str, Any],
) -> None:
    """Start the embedded cluster manager on this machine."""
    from corral.cli.schedflags import effective_config
    from corral.core.framework import idle_backfill
    from corral.exec.contain import default_pids_max
    from corral.server.boot import (
        BootError,
        ServerOptions,
        build_manager,
        check_executor,
        lead,
        shares_database,
    )
    from corral.server.connections import ConnectionLimits
    from corral.server.manager import ManagerSettings

    db_password = _database_password(db, db_password_file)
    try:
        given = scheduler | ({"policy": policy} if policy is not None else {})
        scheduler_settings = effective_config(scheduler_config, given)
    except UserError as error:
        fail(str(error))
    admission = scheduler_settings.core.admission[0]
    if admission == "hived" and config is None and not demo:  # the demo writes its own config
        fail("--admission hived: needs --config FILE whose virtual_clusters give the VCs' cells")
    if gpus is not None and gpus <= 0:
        fail("--gpus: must be a positive integer")
    if not 0 < max_steps_per_s < float("inf"):
        fail(f"--max-steps-per-s: must be a positive number of steps/s, got {max_steps_per_s:g}")
    if not 0 < round_every_s < ready_round_s < float("inf"):
        fail(
            f"--round-every-s {round_every_s:g}, --ready-round-s {ready_round_s:g}: need "
            "0 < round-every-s < ready-round-s"
        )
    if port is None:
        port = 0 if demo else 8470
    if data_dir is None:
        data_dir = Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S") if demo else DEFAULT_DATA_DIR
    if not 0 < port < 65536 and not (demo and port == 0):
        fail("--port: must be between 1 and 65535")
    try:
        log_cap_bytes = parse_size("--log-cap", log_cap)
        gpu_memory_mib = (
            None if gpu_memory is None else parse_size("--gpu-memory", gpu_memory) >> 20
        )
    except UserError as error:
        fail(str(error))
    if metrics_public and metrics_token_file is not None:
        fail("--metrics-public and --metrics-token-file: give one of them")
    if gpu_memory_mib is not None and gpu_memory_mib < 1:
        fail(f"--gpu-memory: must be at least 1M, got {gpu_memory!r}")
    try:
        cache = cache_settings(cache_gb_per_node, storage_gbps, cache_policy, cache_dir)
    except UserError as error:
        fail(str(error))
    connections = ConnectionLimits(
        max_connections=max_connections,
        max_per_peer=max_connections_per_peer,
        header_timeout_s=header_timeout_s,
        body_timeout_s=body_timeout_s,
        idle_timeout_s=idle_timeout_s,
        max_requests=max_requests_per_connection,
    )
    if (problem := connections.problem()) is not None:
        fail(problem)
    try:
        health = health_settings(
            config, health_check, health_every_s, health_timeout_s, nvml_health
        )
    except UserError as error:
        fail(str(error))
    idle = idle_backfill(scheduler_settings.core.backfill, [scheduler_settings.core.policy])
    if idle is not None:
        warn(idle)
    settings = ManagerSettings(
        health=health,
        scheduler=scheduler_settings,
        checkpoint_root=checkpoint_root.expanduser().resolve() if checkpoint_root else None,
        cache=cache,
        log_cap_bytes=log_cap_bytes,
        max_body_bytes=max_body_bytes,
        connections=connections,
        job_pids_max=default_pids_max() if job_pids_max is None else job_pids_max or None,
        max_steps_per_s=max_steps_per_s,
        round_every_s=round_every_s,
        ready_round_s=ready_round_s,
    )
    options = ServerOptions(
        data_dir=data_dir.expanduser(),
        gpus=gpus,
        gpu_type=gpu_type,
        config=config,
        db_url=db,
        db_password=db_password,
        host=host,
        port=port,
        settings=settings,
        executor=executor,
        executor_options=executor_options,
        single_user=single_user,
        gpu_memory_mib=gpu_memory_mib,
        metrics_token_file=metrics_token_file.expanduser() if metrics_token_file else None,
        metrics_public=metrics_public,
        demo=demo,
    )
    try:
        check_executor(options)  # the executor's own options and refusals, before anything starts
    except BootError as error:
        fail(str(error))
    if not demo:
        check_port_free(host, port)
    if demo:
        from corral.server.demo import run_demo

        try:
            run_demo(options, console)
        except BootError as error:
            fail(str(error))
        return
    leading = None
    if shares_database(options):  # one manager leads, the others stand by (docs/ha.md)
        # What serving needs is imported before standing by, not in the takeover's seconds.
        import corral.server.api  # noqa: F401

        try:
            leading = lead(options, lambda line: console.print(line, highlight=False))
        except BootError as error:
            fail(str(error))
        except KeyboardInterrupt:  # Ctrl-C while standing by: nothing to stop
            return
        assert leading is not None
    try:
        if leading is None:
            manager = build_manager(options)
        else:
            manager = build_manager(
                options, leading.executor, lease=leading.lease, data_lock=leading.data_lock
            )
    except BootError as error:
        if leading is not None:
            leading.lease.stop()
        fail(str(error))
    serve(manager, options)


def _database_password(db: str | None, password_file: Path | None) -> str | None:
    """--db checked (no password in it: every process reads a command line) and the password of
    --db-password-file; exits with one line for either."""
    from corral.server.dbsecret import DatabaseSecretError, database_password

    try:
        return database_password(db, password_file)
    except DatabaseSecretError as error:
        fail(str(error))


def cache_settings(
    gb_per_node: float | None,
    storage_gbps: float | None,
    policy: str | None,
    directory: Path | None,
) -> CacheSettings | None:
    """The data caches `--cache-gb-per-node` asks for (None without it); UserError naming the
    flag, in the simulator's words."""
    from corral.core.cache import CACHE_POLICIES
    from corral.server.state import CacheSettings

    if gb_per_node is None:
        given = [
            flag
            for flag, value in (
                ("--storage-gbps", storage_gbps),
                ("--cache-policy", policy),
                ("--cache-dir", directory),
            )
            if value is not None
        ]
        if given:
            raise UserError(f"{given[0]}: needs --cache-gb-per-node")
        return None
    if not math.isfinite(gb_per_node) or gb_per_node < 0:
        raise UserError("--cache-gb-per-node: must not be negative")
    storage = 1.0 if storage_gbps is None else storage_gbps
    if not math.isfinite(storage) or storage <= 0:
        raise UserError("--storage-gbps: must be positive")
    policy = "lru" if policy is None else policy.lower()
    if policy not in CACHE_POLICIES:
        raise UserError(f"--cache-policy: unknown {policy!r}; choose {', '.join(CACHE_POLICIES)}")
    root = directory.expanduser().resolve() if directory is not None else None
    return CacheSettings(gb_per_node, storage, policy, root)


SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def health_settings(
    config: Path | None,
    command: str | None,
    every_s: float | None,
    timeout_s: float | None,
    nvml: bool | None,
) -> HealthSettings | None:
    """The health checks from the flags over the --config's `health_check:` (None: none)."""
    from corral.server.health import HealthSettings

    base = None
    if config is not None:
        from corral.config_file import load_cluster_config
        from corral.core.config import ConfigError

        try:
            base = load_cluster_config(config).health_check
        except ConfigError as error:
            raise UserError(str(error)) from None
    command = command if command is not None else base.command if base else None
    nvml = nvml if nvml is not None else base.nvml if base else False
    if command is None and not nvml:
        if every_s is not None or timeout_s is not None:
            raise UserError(
                "--health-every-s, --health-timeout-s: need --health-check or --nvml-health"
            )
        return None
    every = every_s if every_s is not None else base.every_s if base else 30.0
    timeout = timeout_s if timeout_s is not None else base.timeout_s if base else 10.0
    try:
        return HealthSettings.parse(command, every, timeout, nvml)
    except ValueError as error:
        raise UserError(f"--health-check: {error}") from None


def parse_size(option: str, text: str) -> int:
    """'1G', '200M', '4096' (bytes; K/M/G/T are powers of 1024; 0 means no cap)."""
    value = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = value[-1:] if value[-1:] in SIZE_UNITS else ""
    number = value[: len(value) - len(unit)]
    try:
        size = float(number) * SIZE_UNITS[unit]
    except ValueError:
        raise UserError(f"{option}: expected a size such as 1G or 200M, got {text!r}") from None
    if size < 0 or size >= 1 << 62:
        raise UserError(f"{option}: must be between 0 and 4E, got {text!r}")
    return int(size)


def identity_line(manager: object) -> str:
    """Says once, plainly, whose account the jobs run under (an executor that runs none says
    so itself: `identity_text`)."""
    from corral.server import identity
    from corral.server.manager import Manager

    assert isinstance(manager, Manager)
    own = getattr(manager.executor, "identity_text", None)
    if own is not None:
        return f"jobs       {own}"
    if manager.settings.multi_user:
        return f"jobs       {identity.multi_user_note()}"
    return f"jobs       {identity.single_user_note()}"


def limits_line(manager: object) -> str:
    """Says once what caps each attempt here, and which limits this machine cannot enforce (a
    spec that asks for one of those runs without it, and its events say so). An executor that
    cannot tell which (`unenforced_limits`) says what it does itself (`limits_text`)."""
    from corral.server.manager import Manager

    assert isinstance(manager, Manager)
    pids = manager.settings.job_pids_max
    cap = f"at most {pids} tasks" if pids else "no task limit (--job-pids-max 0)"
    unenforced = getattr(manager.executor, "unenforced_limits", None)
    if unenforced is None:
        text = getattr(manager.executor, "limits_text", None)
        said = text(cap) if text is not None else "not said by this executor"
        return f"limits     {said}"
    missing = unenforced()
    if not pids:
        missing.pop("pids", None)
    line = f"limits     each attempt: {cap}, its spec's memory and cpus"
    if missing:  # the limits that fail for one reason, named together
        names_by_reason: dict[str, list[str]] = {}
        for name in sorted(missing):
            why = missing[name].removeprefix(f"{name}: ")
            names_by_reason.setdefault(why, []).append(name)
        line += "; unavailable here: " + "; ".join(
            f"{', '.join(names)} ({why})" for why, names in names_by_reason.items()
        )
    return line


def check_port_free(host: str, port: int) -> None:
    import socket

    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            fail(f"--port {port}: cannot listen on {host}:{port} ({error.strerror or error})")


def serve(manager: object, options: object) -> None:
    import uvicorn

    from corral.server.api import create_app
    from corral.server.boot import ServerOptions, role_line
    from corral.server.connections import ConnectionGuard
    from corral.server.executors import executor_entry
    from corral.server.manager import Manager

    assert isinstance(manager, Manager) and isinstance(options, ServerOptions)
    url = f"http://{options.host}:{options.port}"
    token_file = options.data_dir / "admin.token"
    token = token_file.read_text().strip()
    quota = ", ".join(f"{vc} ({gpus} GPUs)" for vc, gpus in sorted(manager.vc_quota.items()))
    nodes = manager.cluster.nodes
    where = nodes[0].name if len(nodes) == 1 else f"{len(nodes)} nodes"
    where += executor_entry(options.executor).where(options.executor_options)
    console.print(
        f"corral up: {manager.cluster.total_gpus} GPUs on {where}, policy "
        f"{manager.settings.scheduler.core.policy}, admission {manager.admission_name()}, "
        f"VCs {quota}",
        highlight=False,
    )
    console.print(f"  API        {url}/api/v1   (OpenAPI: {url}/docs)", highlight=False)
    console.print(f"  dashboard  {url}/#token={token}", highlight=False, soft_wrap=True)
    console.print(
        f"  clients    export CORRAL_URL={url} CORRAL_TOKEN=$(cat {token_file})",
        highlight=False,
        soft_wrap=True,
    )
    if options.metrics_public:
        scrape = "no token (--metrics-public)"
    else:
        token_at = options.metrics_token_file or options.data_dir / "metrics.token"
        scrape = f"Authorization: Bearer $(cat {token_at}), or an admin's token"
    console.print(f"  metrics    {url}/metrics   ({scrape})", highlight=False, soft_wrap=True)
    console.print(f"  state      {options.data_dir}   (Ctrl-C stops; jobs keep running)")
    if manager.lease is not None:
        console.print(f"  role       {role_line(manager.lease)}", highlight=False, soft_wrap=True)
    console.print(f"  {identity_line(manager)}", highlight=False, soft_wrap=True)
    console.print(f"  {limits_line(manager)}", highlight=False, soft_wrap=True)
    if manager.settings.health is not None:
        health = manager.settings.health.describe()
        console.print(f"  health     {health}", highlight=False, soft_wrap=True)
    if manager.lease is not None:
        # uvicorn stops on SIGTERM, then raises it again with the handler found before it ran:
        # this one ends the process through `finally`, so that the lease is given up (a standby
        # takes over at once: a rolling upgrade's step, docs/ha.md).
        import signal

        def stopped(signum: int, frame: object) -> None:
            raise SystemExit(0)

        signal.signal(signal.SIGTERM, stopped)
    guard = ConnectionGuard.start(manager.settings.connections, manager.metrics.registry)
    manager.start()
    try:
        uvicorn.run(
            create_app(manager),
            host=options.host,
            port=options.port,
            log_level="warning",
            access_log=False,
            **guard.uvicorn_options(),
        )
    finally:
        manager.stop()


def export_trace(
    out: Annotated[
        Path,
        typer.Option(
            help="the trace to write: NAME.corral.jsonl (corral's own format) or NAME.csv "
            "(Helios's cluster_log)"
        ),
    ],
    data_dir: Annotated[
        Path | None,
        typer.Option(
            help="the manager's data directory, read here (default: the manager at CORRAL_URL "
            f"when set, else {DEFAULT_DATA_DIR})",
            show_default=False,
        ),
    ] = None,
    db: Annotated[
        str | None,
        typer.Option(help="a database URL, without its password, instead of DATA_DIR's SQLite"),
    ] = None,
    db_password_file: DbPasswordFile = None,
    fmt: Annotated[
        str | None,
        typer.Option(
            "--format",
            help="corral (lossless: every job's spec and work, the nodes, the measured "
            "throughputs) or helios; by default helios for a .csv --out, else corral",
        ),
    ] = None,
) -> None:
    """Write the manager's job history as a trace that `corral simulate` replays.

    It asks the manager at CORRAL_URL (with CORRAL_TOKEN, an admin's), as the other client
    commands do; with --data-dir or --db, or without CORRAL_URL, it reads the database itself.
    """
    from corral.server.export import CorralExport, beside, config_path

    chosen = fmt or ("helios" if out.suffix.lower() == ".csv" else "corral")
    if chosen not in ("corral", "helios"):
        fail(f"--format: unknown {fmt!r}; choose corral or helios")
    password = _database_password(db, db_password_file)
    if data_dir is None and db is None and os.environ.get("CORRAL_URL"):
        counts = _export_from_api(out, chosen)
    else:
        where = (data_dir or DEFAULT_DATA_DIR).expanduser()
        counts = _export_from_store(out, chosen, where, db, password)
    written, skipped = counts["written"], counts["never_ran"]
    corral = CorralExport(out, beside(out, ".throughputs.json"), beside(out, ".decisions.jsonl"))
    for key in ("written", "nodes", "never_ran", "unfinished", "no_work"):
        setattr(corral, key, counts.get(key, 0))
    config = config_path(out) if config_path(out).is_file() else None
    admission = config is not None and "admission: none" not in config.read_text()
    setting = f" --scheduler-config {config}" if config is not None else ""
    saved = f" and its scheduler config to {config}" if config is not None else ""
    if chosen == "helios":
        where = "--config CLUSTER.yaml" if admission else "--cluster 1x8"
        console.print(
            f"wrote {plural(written, 'job')} to {out} ({skipped} that never ran left out){saved}; "
            f"replay with:\n  corral simulate --trace helios:{out} {where}{setting}",
            highlight=False,
            soft_wrap=True,
        )
        return
    # The trace brings its nodes and its throughputs; a cluster file brings the VCs too.
    where = " --config CLUSTER.yaml" if admission else "" if corral.nodes else " --cluster 1x8"
    left = f"{corral.never_ran} that never ran, {corral.unfinished} unfinished"
    if corral.no_work:
        left += f", {corral.no_work} that did no work"
    console.print(
        f"wrote {plural(corral.written, 'job')} and {plural(corral.nodes, 'node')} to {out} "
        f"({left} left out), "
        f"the throughputs the manager measured to {corral.throughputs}, its decisions to "
        f"{corral.decisions}{saved}; replay with:\n"
        f"  corral simulate --trace corral:{out}{where}{setting} --decisions",
        highlight=False,
        soft_wrap=True,
    )


def _export_from_store(
    out: Path, chosen: str, data_dir: Path, db: str | None, password: str | None
) -> dict[str, Any]:
    from corral.server.export import export_config, export_corral
    from corral.server.export import export_trace as write_trace
    from corral.server.store import Store, StoreError

    if db is None and not (data_dir / "corral.db").is_file():
        fail(f"{data_dir / 'corral.db'}: no corral database here (--data-dir or --db)")
    try:
        store = Store(db or Store.sqlite_url(data_dir), password=password)
        if chosen == "helios":
            written, skipped = write_trace(store, out)
            counts: dict[str, Any] = {"written": written, "never_ran": skipped}
        else:
            done = export_corral(store, out)
            counts = {
                key: getattr(done, key)
                for key in ("written", "nodes", "never_ran", "unfinished", "no_work")
            }
        export_config(store, out)
    except (StoreError, OSError, ValueError) as error:
        fail(str(error).splitlines()[0] if str(error) else type(error).__name__)
    return counts


def _export_from_api(out: Path, chosen: str) -> dict[str, Any]:
    """The files of GET /api/v1/export, written beside `out` under the names the server gave."""
    from corral.client import Client, ClientError
    from corral.server.export import CORRAL_SUFFIX

    suffix = ".csv" if chosen == "helios" else CORRAL_SUFFIX
    stem = out.name[: -len(CORRAL_SUFFIX)] if out.name.endswith(CORRAL_SUFFIX) else out.stem
    name = stem + suffix
    if name != out.name:
        fail(f"--out: {out.name}: a {chosen} trace is written as NAME{suffix}")
    try:
        with Client() as client:
            answer = client.export(name)
    except ClientError as error:
        fail(error.message)
    files = answer.pop("files")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        for file_name, text in files.items():
            if "/" in file_name or file_name.startswith("."):
                fail(f"the server named an export file {file_name!r}: not written")
            (out.parent / file_name).write_text(text)
    except OSError as error:
        fail(f"{out.parent}: {error.strerror or error}")
    return dict(answer)


def command() -> Any:
    """The click command, with the generated scheduler flags (corral.cli.lazy builds it)."""
    from corral.cli.execflags import executor_flags
    from corral.cli.schedflags import click_command

    return click_command("up", executor_flags(up))
