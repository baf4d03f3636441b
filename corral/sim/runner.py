"""`corral simulate`: load a trace, build the cluster, run each policy, write and print results."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from corral.core.cacheerror import CACHE_POLICIES, CacheError
from corral.core.cluster import MILLI, Cluster, ClusterError
from corral.core.colocation import PairTable
from corral.core.configerror import ConfigError
from corral.core.fragmentation import Workload, WorkloadError
from corral.core.framework import (
    STAGES,
    SchedulerConfig,
    build_scheduler,
    check_config,
    config_from_mapping,
    merge,
)
from corral.core.gputypes import TypeLog
from corral.core.job import Elastic, Job, JobSpec, Priority
from corral.core.nodes import NodeChange
from corral.core.options import OptionError
from corral.core.plugin import PluginError, Services, SpeedModel
from corral.core.policy import POLICIES
from corral.core.profiles import Profiles
from corral.core.protocol import SchedulerCore
from corral.core.queues import QueueTree
from corral.core.reservations import Reservation, ReservationError
from corral.core.text import count_noun
from corral.sim.engine import DEFAULT_PRECHECK_REPORT_S, FailureModel, Simulation
from corral.sim.failures import NodeFailures, PhillyFailures
from corral.sim.metrics import measured_jobs, per_vc
from corral.sim.perfmodel import (
    GAVEL_REFERENCE_TYPE,
    PerfModel,
    PerfModelError,
    load_slowdowns,
    load_throughputs,
)
from corral.sim.progress import LossCurveModel
from corral.sim.report import (
    decisions_name,
    jobs_csv_name,
    progress_bar,
    summary_table,
    vc_table,
    write_outputs,
)
from corral.sim.result import SimResult, TimelineTotals
from corral.sim.traces import Trace, TraceError, load_trace, stream_trace
from corral.sim.workers import RunProgress, ShownProgress, run_in_workers, worker_count

if TYPE_CHECKING:
    from rich.console import Console

    from corral.core.cache import DataCache
    from corral.sim.replaydiff import ReplayCheck


class SimulationError(ValueError):
    """A bad trace, config or option: reported as one line."""


#: What a bad trace, cluster, config or option raises: reported as one line (SimulationError).
REFUSALS = (
    TraceError,
    ClusterError,
    ConfigError,
    PerfModelError,
    CacheError,
    OptionError,
    PluginError,
    WorkloadError,
)


@dataclass(slots=True)
class RunSettings:
    trace: str
    nodes: int = 16
    gpus_per_node: int = 8
    racks: int = 1
    gpu_type: str = "v100"
    gpus_per_switch: int | None = None
    config: Path | None = None
    policies: list[str] = field(default_factory=lambda: ["las"])
    #: Everything the scheduler is built from but the policy (one run per policy).
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    #: Per policy, keys changed on top of `scheduler` (a preset's, corral.core.presets).
    policy_changes: dict[str, dict[str, object]] = field(default_factory=dict)
    #: Jobs spread over nodes run slower by their model's spread slowdown (off: durations fixed).
    spread_slowdown: bool = True
    gittins_history: Path | None = None
    optimus_noise: float = 0.02
    failure_rate: float = 0.0
    #: "rate" (failure_rate per attempt) or "philly" (Philly's failure classes, sim.failures)
    failure_model: str = "rate"
    node_failures: NodeFailures | None = None
    max_retries: int = 3
    arrival_scale: float = 1.0
    #: Every job checkpoints every this many seconds of work (None: only when preempted).
    checkpoint_every_s: float | None = None
    #: Each job's time limit (`JobSpec.time_limit_s`) is this many times its run time, where its
    #: trace gives it none (None: only the trace's limits; jobs without one are unbounded).
    time_limit_factor: float | None = None
    #: An attempt's first progress report, after its start and restore (passes a pre-run).
    precheck_report_s: float = DEFAULT_PRECHECK_REPORT_S
    window: tuple[int, int] | None = None
    skip_oversized: bool = False
    slowdowns: Path | None = None
    #: Measured throughputs (Gavel's format, as `corral export-trace` writes the live manager's):
    #: the jobs' speeds come from them, as live (`Profiles.speed_model`); default: the trace's.
    throughputs: Path | None = None
    #: Write every run's decisions (decisions-POLICY-PLACEMENT.jsonl), as export-trace does.
    decisions: bool = False
    #: Read the trace as the run goes and write each job out as it ends (`_simulate_streamed`).
    stream: bool = False
    seed: int = 0
    private_baseline: bool = False
    opportunistic_share: float = 0.0
    cache_gb_per_node: float | None = None  # None: no data model (every job at compute speed)
    storage_gbps: float = 1.0
    cache_policy: str = "lru"
    datasets: str = "shared"
    # deadline = submit + U(lo, hi) x duration (ElasticFlow's evaluation); None: (0.5, 1.5) when
    # a deadline policy runs, else no deadlines
    deadline_factor: tuple[float, float] | None = None
    #: Run the policies side by side in this many processes (0: one per CPU; 1: one by one
    #: here). Changes no result, only the wall time (corral.sim.workers).
    workers: int = 1


DEADLINE_POLICIES = ("edf", "elasticflow")
DEFAULT_DEADLINE_FACTOR = (0.5, 1.5)
DEFAULT_VCS: dict[str, dict[str, int]] = {"default": {}}


def build_cluster(
    settings: RunSettings, trace: Trace | None = None
) -> tuple[Cluster, dict[str, dict[str, int]], dict[str, int]]:
    """The cluster, its VCs' cells and their GPU quotas (one VC `default` for the shorthand and
    for a trace that brings its nodes, such as openb's; `--config` replaces a corral trace's)."""
    cluster, vcs, quota, _ = build_cluster_queues(settings, trace)
    return cluster, vcs, quota


def build_cluster_queues(
    settings: RunSettings, trace: Trace | None = None
) -> tuple[Cluster, dict[str, dict[str, int]], dict[str, int], QueueTree | None]:
    """`build_cluster`, and the VCs' departments, weights and limits (None: flat VCs)."""
    replaced = trace is not None and trace.config_replaces_nodes and settings.config is not None
    if trace is not None and trace.nodes is not None and not replaced:
        if settings.config is not None:
            raise SimulationError(
                f"--config: {trace.source} brings its own nodes; leave out --config"
            )
        cluster = Cluster.from_nodes(trace.nodes)
        return cluster, DEFAULT_VCS, {"default": cluster.total_gpus}, None
    if settings.config is not None:
        from corral.config_file import load_cluster_config
        from corral.core.config import vc_gpu_quota

        config = load_cluster_config(settings.config)
        return config.cluster, config.virtual_clusters, vc_gpu_quota(config), config.queues
    cluster = Cluster.shorthand(
        settings.nodes,
        settings.gpus_per_node,
        settings.racks,
        settings.gpu_type.lower(),
        settings.gpus_per_switch,
    )
    return cluster, DEFAULT_VCS, {"default": cluster.total_gpus}, None


def node_changes_of(
    settings: RunSettings, trace: Trace | None, cluster: Cluster
) -> list[NodeChange]:
    """The drains and resumes a run applies (corral.core.nodes): the trace's (a live manager's,
    exported) and the maintenance windows of `--config`, in time order. A trace's change of a
    node the cluster lacks (`--config` replaced its nodes) is refused, naming it."""
    names = {node.name for node in cluster.nodes}
    changes: list[NodeChange] = []
    if trace is not None:  # (a streamed trace carries none)
        changes = list(trace.node_changes)
        for change in changes:
            if change.node not in names:
                raise SimulationError(
                    f"{trace.source}: a node change at {change.at:g} s names node "
                    f"{change.node!r}, which the cluster does not have"
                )
    if settings.config is not None:
        from corral.config_file import load_cluster_config

        changes += load_cluster_config(settings.config).maintenance
    return sorted(changes, key=lambda change: change.at)


def check_fits(trace: Trace, cluster: Cluster, skip: bool) -> tuple[list[JobSpec], int]:
    """Refuse (or, with skip, drop) jobs that no placement on this cluster could ever hold."""
    kept: list[JobSpec] = []
    dropped = 0
    for position, spec in enumerate(trace.jobs):
        if fits(spec, position, cluster, skip, trace.source):
            kept.append(spec)
        else:
            dropped += 1
    return kept, dropped


def fits(spec: JobSpec, position: int, cluster: Cluster, skip: bool, source: str) -> bool:
    """Whether some placement on this cluster could hold the job; one that none could is
    refused (SimulationError) or, with skip, dropped (False)."""
    capacity = cluster.capacity_for(spec.gpu_types)
    if spec.gpus <= capacity:
        return True
    if not skip:
        raise SimulationError(
            f"{source}: job {spec.id} (number {position + 1} by arrival): gpus={spec.gpus} exceeds "
            f"the {count_noun(capacity, 'GPU')} the cluster has for it; use a bigger cluster or --skip-oversized"
        )
    return False


def service_history(settings: RunSettings, jobs: list[JobSpec]) -> list[float]:
    """GPU-seconds per job that Gittins takes as the distribution of job sizes."""
    if settings.gittins_history is None:
        return [s.gpus * s.duration_s for s in jobs if s.duration_s]
    path = settings.gittins_history
    samples: list[float] = []
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames is None or "duration" not in reader.fieldnames:
            raise SimulationError(f"{path}: line 1: needs a 'duration' column (GPU-seconds)")
        for line, row in enumerate(reader, start=2):
            try:
                value = float(row["duration"])
            except (TypeError, ValueError):
                raise SimulationError(
                    f"{path}: line {line}: duration: not a number: {row['duration']!r}"
                ) from None
            if value > 0:
                samples.append(value)
    if not samples:
        raise SimulationError(f"{path}: no positive durations")
    return samples


#: config_for's answers, by the id of the settings' scheduler config (kept beside the answer, so
#: that an id reused by a later object is told apart), the policy and its changes: a run asks for
#: a policy's config some 5 times, each a build and check of every option (8 ms).
_CONFIGS: dict[tuple[int, str, str], tuple[SchedulerConfig, SchedulerConfig]] = {}
_CONFIGS_KEPT = 64


def config_for(settings: RunSettings, policy: str) -> SchedulerConfig:
    changes = settings.policy_changes.get(policy)
    key = (id(settings.scheduler), policy, repr(changes))
    known = _CONFIGS.get(key)
    if known is not None and known[0] is settings.scheduler:
        return known[1]
    if not changes:
        config = settings.scheduler.with_policy(policy)
    else:
        mapping = merge(settings.scheduler.to_mapping(), changes)
        config = config_from_mapping(mapping | {"policy": policy})
    if len(_CONFIGS) >= _CONFIGS_KEPT:
        _CONFIGS.clear()
    _CONFIGS[key] = (settings.scheduler, config)
    return config


def shared_data_file(relative: str) -> Path | None:
    """A file of the shared data directory (shared/data/RELATIVE), looked for as the bundled
    Philly run times are: beside the working directory's project, then beside this repository."""
    repo_root = Path(__file__).resolve().parents[2]
    for base in (Path.cwd().parent, repo_root.parent):
        path = base / "shared" / "data" / relative
        if path.is_file():
            return path
    return None


def admission_of(settings: RunSettings, vcs: dict[str, dict[str, int]], policy: str) -> str:
    return config_for(settings, policy).admission_for(vcs)


def run_simulations(
    settings: RunSettings, *, out: Path, plot: bool, console: Console
) -> list[dict[str, object]]:
    try:
        return _run(settings, out=out, plot=plot, console=console)
    except REFUSALS as error:
        raise SimulationError(str(error)) from None


def check_settings(settings: RunSettings) -> None:
    """Refuse impossible option values up front, naming the option."""
    problems = [
        ("--failure-rate", not 0 <= settings.failure_rate <= 1, "must be between 0 and 1"),
        ("--optimus-noise", settings.optimus_noise < 0, "must not be negative"),
        ("--max-retries", settings.max_retries < 0, "must not be negative"),
        ("--seed", settings.seed < 0, "must not be negative"),
        ("--workers", settings.workers < 0, "must not be negative"),
        (
            "--deadline-factor",
            settings.deadline_factor is not None
            and not 0 < settings.deadline_factor[0] <= settings.deadline_factor[1],
            "needs 0 < LO <= HI",
        ),
        ("--arrival-scale", settings.arrival_scale <= 0, "must be positive"),
        (
            "--checkpoint-every-s",
            settings.checkpoint_every_s is not None and not settings.checkpoint_every_s > 0,
            "must be positive",
        ),
        ("--racks", settings.racks <= 0, "must be positive"),
        (
            "--time-limit-factor",
            settings.time_limit_factor is not None and not settings.time_limit_factor > 0,
            "must be positive",
        ),
        ("--precheck-report-s", not settings.precheck_report_s > 0, "must be positive"),
        (
            "--opportunistic-share",
            not 0 <= settings.opportunistic_share <= 1,
            "must be between 0 and 1",
        ),
    ]
    for option, bad, reason in problems:
        if bad:
            raise SimulationError(f"{option}: {reason}")
    for name in settings.policies:
        if name not in POLICIES:
            raise SimulationError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")
        # the combination, before any trace is read
        check_config(config_for(settings, name), uses_cache=settings.cache_gb_per_node is not None)
    if settings.gittins_history is not None and not settings.gittins_history.is_file():
        raise SimulationError(f"{settings.gittins_history}: no such file (--gittins-history)")
    check_cache_settings(settings)


def check_cache_settings(settings: RunSettings) -> None:
    cache_gb = settings.cache_gb_per_node
    if cache_gb is not None and not cache_gb >= 0:
        raise SimulationError("--cache-gb-per-node: must not be negative")
    if not settings.storage_gbps > 0:
        raise SimulationError("--storage-gbps: must be positive")
    if settings.cache_policy not in CACHE_POLICIES:
        raise SimulationError(
            f"--cache-policy: unknown {settings.cache_policy!r}; choose {', '.join(CACHE_POLICIES)}"
        )
    from corral.sim.datasets import DATASET_SCOPES

    if settings.datasets not in DATASET_SCOPES:
        raise SimulationError(
            f"--datasets: unknown {settings.datasets!r}; choose {', '.join(DATASET_SCOPES)}"
        )
    if cache_gb is not None and settings.private_baseline:
        raise SimulationError("--cache-gb-per-node: not supported with --private-baseline")
    sharing = [
        name
        for name in settings.scheduler.core.stages
        if name in STAGES and STAGES[name].shares_gpus
    ]
    if cache_gb is not None and sharing:  # such a stage sets the speeds of jobs sharing GPUs
        raise SimulationError(
            f"--cache-gb-per-node: not supported with the {sharing[0]} stage (it lets jobs "
            "share GPUs, at speeds it sets)"
        )


#: Admissions that act on `priority: opportunistic` (the others schedule both classes alike).
OPPORTUNISTIC_ADMISSIONS = frozenset({"hived", "quota", "fairshare"})


def assign_tenants(
    jobs: list[JobSpec], settings: RunSettings, vcs: dict[str, dict[str, int]]
) -> list[JobSpec]:
    """Map jobs to the configured VCs and mark a share of them opportunistic (seeded)."""
    admissions = {admission_of(settings, vcs, name) for name in settings.policies}
    if settings.opportunistic_share > 0 and admissions - OPPORTUNISTIC_ADMISSIONS:
        raise SimulationError(
            "--opportunistic-share: opportunistic jobs need admission hived, quota or fairshare"
        )
    if admissions - {"none", "elasticflow"}:
        if vcs == DEFAULT_VCS:
            jobs = [replace(spec, vc="default") for spec in jobs]
        unknown = sorted({spec.vc for spec in jobs} - set(vcs))
        if unknown:
            raise SimulationError(
                f"the trace has jobs of VCs the cluster config does not define: "
                f"{', '.join(unknown[:5])}{' ...' if len(unknown) > 5 else ''}; "
                f"it defines {', '.join(sorted(vcs))}"
            )
    if settings.opportunistic_share > 0:
        import numpy as np

        rng = np.random.default_rng(settings.seed)
        marks = rng.random(len(jobs)) < settings.opportunistic_share
        jobs = [
            replace(spec, priority=Priority.OPPORTUNISTIC) if mark else spec
            for spec, mark in zip(jobs, marks, strict=True)
        ]
    return jobs


def with_deadlines(
    jobs: list[JobSpec], settings: RunSettings, perf: PerfModel | None
) -> list[JobSpec]:
    """Deadlines as ElasticFlow's evaluation drew them: submit + lambda x duration, lambda uniform
    in --deadline-factor (seeded); with a throughput table, each job is also elastic (see
    `elastic_range`). Every policy of the run replays the same deadlines."""
    wanted = settings.deadline_factor is not None or any(
        name in DEADLINE_POLICIES for name in settings.policies
    )
    if not wanted:
        return jobs
    import numpy as np

    low, high = settings.deadline_factor or DEFAULT_DEADLINE_FACTOR
    factors = np.random.default_rng([settings.seed, 0xEDF]).uniform(low, high, len(jobs))
    return [
        replace(
            spec,
            deadline=spec.submit_time + float(factor) * spec.duration_s,
            elastic=elastic_range(perf, spec) if perf is not None else None,
        )
        if spec.duration_s is not None
        else spec
        for spec, factor in zip(jobs, factors, strict=True)
    ]


def with_time_limit(spec: JobSpec, factor: float) -> JobSpec:
    """The job with a time limit of `factor` times its run time (`duration_s`), unless its
    trace gave it one or its run time is not known."""
    if spec.time_limit_s is not None or spec.duration_s is None:
        return spec
    return replace(spec, time_limit_s=factor * spec.duration_s)


def elastic_range(perf: PerfModel, spec: JobSpec) -> Elastic | None:
    """From 1 GPU up to the larger of the count asked for and the largest count at which the
    table measured the model. Above what was measured the table scales linearly (perfect
    scaling), which would make growing look free: there a value is exactly twice the one at half
    the count, which a measurement never is."""
    if not perf.knows(spec.model):
        return None
    largest = 1
    size = 2
    while size <= max(spec.gpus, 64):
        here = perf.throughput(spec.model, size, GAVEL_REFERENCE_TYPE)
        half = perf.throughput(spec.model, size // 2, GAVEL_REFERENCE_TYPE)
        if here is not None and half is not None and here != 2 * half:
            largest = size
        size *= 2
    return Elastic(min_gpus=1, max_gpus=max(spec.gpus, largest), base_gpus=spec.gpus)


def table_throughput(perf: PerfModel) -> Callable[[Job, int], float]:
    """ElasticFlow's scaling curve from the throughput table (steps/s on consolidated v100s)."""

    def throughput(job: Job, gpus: int) -> float:
        value = perf.throughput(job.spec.model, gpus, GAVEL_REFERENCE_TYPE)
        return float(gpus) if value is None else value

    return throughput


def make_scheduler(
    settings: RunSettings,
    cluster: Cluster,
    vcs: dict[str, dict[str, int]],
    quota: dict[str, int],
    config: SchedulerConfig,
    speed_for: Callable[[Cluster], SpeedModel],
    jobs: list[JobSpec],
    *,
    cache: DataCache | None = None,
    pair_table: PairTable | None = None,
    throughput: Callable[[Job, int], float] | None = None,
    workload: Workload | None = None,
    tree: QueueTree | None = None,
) -> SchedulerCore:
    """The scheduler `config` describes, with what the simulator knows: the trace (job lengths,
    Gittins's history, its task types), its performance model and tables."""
    services = Services(
        cluster,
        vc_cells=vcs,
        vc_quota=quota,
        vc_tree=tree,
        speed_model_for=speed_for,
        service_history=lambda: service_history(settings, jobs),
        durations_known=all(spec.duration_s is not None for spec in jobs),
        observe=LossCurveModel(settings.seed, noise=settings.optimus_noise),
        throughput=throughput,
        cache=cache,
        pair_table=pair_table,
        # a streamed run knows no jobs up front: a placement that needs a workload refuses
        workload=workload if workload is not None or not jobs else Workload.from_specs(jobs),
        seed=settings.seed,
    )
    return build_scheduler(config, services, uses_cache=cache is not None)


def reserve_all(
    settings: RunSettings, scheduler: SchedulerCore, trace: Trace | None = None
) -> None:
    """The reservations of `--config` and those a corral trace recorded (the live manager's,
    their GPUs by name: one on nodes the run's cluster lacks is refused) made in the scheduler
    (corral.core.reservations)."""
    made: list[tuple[str, Reservation]] = []
    if trace is not None and trace.reservations:
        ids = {name: gpu for gpu, name in enumerate(scheduler.cluster.gpu_names())}
        for recorded in trace.reservations:
            missing = [name for name in recorded.gpus if name not in ids]
            if missing:
                raise SimulationError(
                    f"{trace.source}: reservation {recorded.name}: no GPU {missing[0]} in the "
                    "cluster"
                )
            reservation = Reservation(
                recorded.name,
                recorded.start,
                recorded.duration,
                tuple(sorted(ids[name] for name in recorded.gpus)),
                users=frozenset(recorded.users),
                vcs=frozenset(recorded.vcs),
            )
            made.append((trace.source, reservation))
    if settings.config is not None:
        from corral.config_file import load_cluster_config

        made += [
            (f"{settings.config}: reservations", reservation)
            for reservation in load_cluster_config(settings.config).reservations
        ]
    for where, reservation in made:
        try:
            scheduler.reserve(reservation)
        except ReservationError as error:
            raise SimulationError(f"{where}: {error}") from None


def private_baselines(
    settings: RunSettings,
    jobs: list[JobSpec],
    physical: Cluster,
    vcs: dict[str, dict[str, int]],
    policy: str,
    speed_for: Callable[[Cluster], SpeedModel],
    failures: FailureModel | PhillyFailures | None,
) -> dict[str, dict[str, object]]:
    """Each VC alone on a private cluster made of exactly its cells: its reference queueing."""
    baselines: dict[str, dict[str, object]] = {}
    for name, cells in sorted(vcs.items()):
        own = [s for s in jobs if s.vc == name and s.priority is Priority.GUARANTEED]
        if not own:
            continue
        from corral.core.vcluster import build_virtual_cluster

        private = build_virtual_cluster(name, cells, physical).cluster
        own = [s for s in own if s.gpus <= private.capacity_for(s.gpu_types)]
        alone = config_from_mapping(
            config_for(settings, policy).to_mapping() | {"admission": "none"}
        )
        scheduler = make_scheduler(settings, private, DEFAULT_VCS, {}, alone, speed_for, own)
        result = Simulation(
            own,
            scheduler,
            failures=failures,
            node_failures=settings.node_failures,
            seed=settings.seed,
            precheck_report_s=settings.precheck_report_s,
        ).run()
        baselines[name] = per_vc(result).get(name, {})
    return baselines


def sharing_anomalies(
    shared: dict[str, dict[str, object]], private: dict[str, dict[str, object]], key: str
) -> list[str]:
    """VCs whose queueing under sharing is worse than alone, beyond noise: more than 5 % and ten
    minutes worse (under preemptive policies first starts come within minutes either way, and a
    resume's restore time alone shifts them by that much)."""
    worse = []
    for name, alone in private.items():
        mine, theirs = shared.get(name, {}).get(key), alone.get(key)
        if isinstance(mine, float) and isinstance(theirs, float) and mine > theirs * 1.05 + 600.0:
            worse.append(name)
    return worse


def simulate_results(settings: RunSettings, console: Console) -> list[SimResult]:
    """Every run `settings` asks for (one per policy), not yet written anywhere: what `corral
    simulate` reports, and what `corral fgd` takes medians of."""
    try:
        return _simulate(settings, console)[0]
    except REFUSALS as error:
        raise SimulationError(str(error)) from None


def base_perf(settings: RunSettings) -> PerfModel:
    """The performance model before the trace's own: spread slowdowns (off, or overridden)."""
    perf = PerfModel.default_for_durations()
    if not settings.spread_slowdown:
        perf = perf.with_slowdowns({})
    if settings.slowdowns is not None:
        perf = perf.with_overrides(load_slowdowns(settings.slowdowns))
    return perf


def failure_model(settings: RunSettings) -> FailureModel | PhillyFailures | None:
    if settings.failure_model == "philly":
        return PhillyFailures(max_retries=settings.max_retries)
    if settings.failure_rate > 0:
        return FailureModel(settings.failure_rate, settings.max_retries)
    return None


def summary_options(settings: RunSettings) -> dict[str, object]:
    """The settings as summary.json's `options` (the scheduler's are added per run, resolved)."""
    return {
        k: str(v) if isinstance(v, Path) else v
        for k, v in asdict(settings).items()
        if k not in ("scheduler", "workers")  # how many processes ran it changes no result
    }


@dataclass(slots=True)
class _Prepared:
    """What every policy's run of `_simulate` shares: the trace read, the cluster's shape and
    the models, built once (and once more in each worker process, `_each_policy`)."""

    trace: Trace
    perf: PerfModel
    speed_for: Callable[[Cluster], SpeedModel]
    profiles: Profiles | None
    pair_table: PairTable | None
    vcs: dict[str, dict[str, int]]
    quota: dict[str, int]
    jobs: list[JobSpec]
    probed: bool
    workload: Workload | None
    grid: list[float]
    table: PerfModel | None
    multi_tenant: bool
    measured: set[str] | None
    failures: FailureModel | PhillyFailures | None
    options: dict[str, object]


def _simulate(settings: RunSettings, console: Console) -> tuple[list[SimResult], bool]:
    """The results, and whether VCs share the cluster (multi-tenant)."""
    prepared = _prepare(settings, console)
    results = _each_policy(
        settings,
        console,
        len(prepared.jobs),
        lambda number, progressed: _run_policy(settings, prepared, number, progressed),
        None,
    )
    return results, prepared.multi_tenant


def _prepare(settings: RunSettings, console: Console) -> _Prepared:
    """Check the settings, read the trace and print what is run (its first line)."""
    check_settings(settings)
    perf = base_perf(settings)
    trace = load_trace(
        settings.trace, perf=perf, seed=settings.seed, arrival_scale=settings.arrival_scale
    )
    speed_for = (trace.perf or perf).speed_model
    profiles = trace.profiles
    if settings.throughputs is not None:
        profiles = load_throughputs(settings.throughputs)
        trace.notes.append(f"speeds from {settings.throughputs} ({len(profiles)} measured shapes)")
    if profiles is not None:  # the live manager's speed model, on the same measurements
        speed_for = profiles.speed_model
    pair_table = None
    if "packing" in settings.scheduler.core.stages:
        if trace.perf is None or not trace.perf.has_throughputs:
            raise SimulationError("stage packing: needs a trace with a throughput table (gavel)")
        from corral.sim.colocation import load_pair_table

        pair_table = load_pair_table(trace.perf.source)
    cluster, vcs, quota, tree = build_cluster_queues(settings, trace)
    if tree is not None:  # an admission that cannot run with departments, before any run
        for name in settings.policies:
            check_config(
                config_for(settings, name),
                Services(cluster, vc_cells=vcs, vc_quota=quota, vc_tree=tree),
                uses_cache=settings.cache_gb_per_node is not None,
            )
    jobs, dropped = check_fits(trace, cluster, settings.skip_oversized)
    probed = trace.place_or_fail or any(not spec.plain for spec in jobs)
    workload = trace.workload
    if probed and workload is None:
        workload = Workload.from_specs(jobs)
    grid: list[float] = []
    if probed:  # (the probe's points; corral.sim.fragmentation comes with the probe)
        from corral.sim.fragmentation import grid_for

        grid = grid_for(
            sum(spec.total_gpu_milli for spec in jobs),
            cluster.total_gpus * MILLI,
            trace.target_load,
        )
    jobs = assign_tenants(jobs, settings, vcs)
    if settings.checkpoint_every_s is not None:
        jobs = [replace(spec, checkpoint_every_s=settings.checkpoint_every_s) for spec in jobs]
    if settings.time_limit_factor is not None:
        jobs = [with_time_limit(spec, settings.time_limit_factor) for spec in jobs]
    table = trace.perf if trace.perf is not None and trace.perf.has_throughputs else None
    if table is None and "elasticflow" in settings.policies:
        raise SimulationError("--policy elasticflow: needs a trace with a throughput table (gavel)")
    admissions = sorted({admission_of(settings, vcs, name) for name in settings.policies})
    multi_tenant = bool(set(admissions) - {"none", "elasticflow"})
    jobs = with_deadlines(jobs, settings, table)
    measured = None
    if settings.window is not None:
        start, end = settings.window
        if start >= len(jobs):
            raise SimulationError(f"--window: the trace has only {len(jobs)} jobs")
        measured = {spec.id for spec in jobs[start:end]}
    console.print(
        f"[bold]{trace.source}[/]: {count_noun(len(jobs), 'job')} on {cluster.describe()}"
        + (
            f", {count_noun(len(vcs), 'VC')}, admission {'/'.join(admissions)}"
            if multi_tenant
            else ""
        )
        + (f"; dropped {count_noun(dropped, 'job')} larger than the cluster" if dropped else ""),
        soft_wrap=True,  # a long trace path must not break the line
    )
    for note in trace.notes:
        console.print(f"  note: {note}", soft_wrap=True)
    failures = failure_model(settings)
    options = summary_options(settings)
    return _Prepared(
        trace=trace,
        perf=perf,
        speed_for=speed_for,
        profiles=profiles,
        pair_table=pair_table,
        vcs=vcs,
        quota=quota,
        jobs=jobs,
        probed=probed,
        workload=workload,
        grid=grid,
        table=table,
        multi_tenant=multi_tenant,
        measured=measured,
        failures=failures,
        options=options,
    )


def _run_policy(
    settings: RunSettings, prepared: _Prepared, number: int, progressed: RunProgress
) -> SimResult:
    """The run of `_simulate` of the policy `settings.policies[number]`, annotated."""
    policy = settings.policies[number]
    trace, perf, speed_for = prepared.trace, prepared.perf, prepared.speed_for
    profiles, jobs, vcs, quota = prepared.profiles, prepared.jobs, prepared.vcs, prepared.quota
    table, workload = prepared.table, prepared.workload
    run_cluster, _, _, tree = build_cluster_queues(settings, trace)
    type_log = TypeLog()  # which GPU type each job ran on, for the best-type share
    from corral.sim.colocation import gandiva_summary
    from corral.sim.datasets import make_cache

    cache = (
        None
        if settings.cache_gb_per_node is None
        else make_cache(
            run_cluster,
            trace.perf or perf,
            cache_gb_per_node=settings.cache_gb_per_node,
            storage_gbps=settings.storage_gbps,
            policy=settings.cache_policy,
            scope=settings.datasets,
        )
    )

    def logged_speed_for(cluster: Cluster, type_log: TypeLog = type_log) -> SpeedModel:
        return type_log.wrap(cluster, speed_for(cluster))

    scheduler = make_scheduler(
        settings,
        run_cluster,
        vcs,
        quota,
        config_for(settings, policy),
        logged_speed_for,
        jobs,
        cache=cache,
        pair_table=prepared.pair_table,
        throughput=table_throughput(table)
        if table is not None
        else (profiles.throughput if profiles is not None else None),
        workload=workload,
        tree=tree,
    )
    reserve_all(settings, scheduler, trace)
    probe = None
    if prepared.probed and workload is not None:
        from corral.sim.fragmentation import FragmentationProbe

        probe = FragmentationProbe(run_cluster, workload, prepared.grid)
    resolved = config_for(settings, policy).resolved(vcs)
    # The manager's own policy and placement replay its history: compared with its decisions.
    checked = (
        trace.decision_log is not None
        and policy == settings.scheduler.core.policy
        and config_for(settings, policy).core.placement == settings.scheduler.core.placement
    )
    simulation = Simulation(
        jobs,
        scheduler,
        failures=prepared.failures,
        node_failures=settings.node_failures,
        seed=settings.seed,
        measured=prepared.measured,
        on_progress=progressed.advance,
        options=prepared.options | {"scheduler": resolved},
        place_or_fail=trace.place_or_fail,
        observer=probe,
        precheck_report_s=settings.precheck_report_s,
        record_decisions=settings.decisions or checked,
        replay=trace.replay,
        node_changes=node_changes_of(settings, trace, scheduler.cluster),
    )
    result = simulation.run()
    if checked and trace.decision_log is not None:
        result.replay_check = check_replay(trace, simulation, result, trace.decision_log)
    if probe is not None:
        probe.finish()
        result.annotations.update(probe.summary())
        result.curves = probe.result_curves()
    if settings.private_baseline:
        progressed.describe(f"{policy}: private baselines")
        alone = private_baselines(
            settings, jobs, run_cluster, vcs, policy, speed_for, prepared.failures
        )
        shared = per_vc(result)
        for name, values in alone.items():
            shared.setdefault(name, {}).update(
                {
                    "private_avg_queue_s": values.get("avg_queue_s"),
                    "private_multi_gpu_avg_queue_s": values.get("multi_gpu_avg_queue_s"),
                    "private_avg_jct_s": values.get("avg_jct_s"),
                }
            )
        result.annotations |= {
            "per_vc": shared,
            "sharing_anomaly_vcs": sharing_anomalies(shared, alone, "avg_queue_s"),
            "sharing_anomaly_multi_gpu_vcs": sharing_anomalies(
                shared, alone, "multi_gpu_avg_queue_s"
            ),
        }
    if len(run_cluster.gpu_types) > 1:
        result.annotations.update(
            type_log.summary(measured_jobs(result), run_cluster, speed_for(run_cluster))
        )
    if cache is not None:
        result.annotations.update(cache.summary(measured_jobs(result)))
    result.annotations.update(gandiva_summary(simulation.scheduler))
    counters = scheduler.counters()
    for name in ("refused_alone", "grows", "shrinks", "suspensions"):
        if name in counters:  # ElasticFlow's
            result.annotations[name] = counters[name]
    return result


def check_replay(trace: Trace, simulation: Simulation, result: SimResult, log: Path) -> ReplayCheck:
    """The replay's decisions against the manager's log (corral.sim.replaydiff)."""
    from corral.sim.replaydiff import compare, read_decisions

    try:
        live = read_decisions(log)
    except (OSError, ValueError) as exc:
        raise SimulationError(f"{log}: {' '.join(str(exc).split())}") from None
    ends = {
        job.id: (
            trace.replay[job.id].finished_at if job.id in trace.replay else None,
            job.finished_at,
        )
        for job in result.jobs
    }
    notes = simulation.gates.notes if simulation.gates is not None else []
    return compare(live, result.decision_records(), notes, ends)


def stream_refusal(settings: RunSettings) -> str | None:
    """Why these settings cannot be streamed: each needs the whole trace (or every job's result)
    before or after the run."""
    deadlines = settings.deadline_factor is not None or any(
        name in DEADLINE_POLICIES for name in settings.policies
    )
    problems = [
        (settings.window is not None, "--window (its jobs are counted by position in the trace)"),
        (settings.private_baseline, "--private-baseline (it replays each VC's jobs again)"),
        (settings.opportunistic_share > 0, "--opportunistic-share"),
        (settings.cache_gb_per_node is not None, "--cache-gb-per-node"),
        (deadlines, "deadlines (edf, elasticflow, --deadline-factor)"),
        (
            settings.failure_model == "philly",
            "--failure-model philly (it draws per job from the whole trace)",
        ),
        ("packing" in settings.scheduler.core.stages, "the packing stage"),
        (
            "gittins" in settings.policies and settings.gittins_history is None,
            "gittins without --gittins-history (it learns job sizes from the whole trace)",
        ),
    ]
    for refused, what in problems:
        if refused:
            return f"--stream: not with {what}"
    return None


@dataclass(slots=True)
class _PreparedStream:
    """What every policy's run of `_simulate_streamed` shares (its trace is read once a run)."""

    perf: PerfModel
    speed_for: Callable[[Cluster], SpeedModel]
    vcs: dict[str, dict[str, int]]
    quota: dict[str, int]
    failures: FailureModel | PhillyFailures | None
    options: dict[str, object]
    #: Each run's jobs-POLICY-PLACEMENT.csv, in the order of `settings.policies`.
    jobs_csv: list[str]


def _simulate_streamed(settings: RunSettings, console: Console, out: Path) -> list[SimResult]:
    """Each policy's run, streamed: the trace read as the run reaches each job, and each job's
    row written (and dropped) as it ends (corral.sim.streamed), so that memory is bounded by the
    jobs in the system, not by the trace. The timeline is kept as sums (`TimelineTotals`)."""
    prepared = _prepare_streamed(settings, console, out)
    return _each_policy(
        settings,
        console,
        None,
        lambda number, progressed: _run_streamed(settings, prepared, number, out, progressed),
        out,
    )


def _each_policy(
    settings: RunSettings,
    console: Console,
    total: int | None,
    run_here: Callable[[int, RunProgress], SimResult],
    out: Path | None,
) -> list[SimResult]:
    """Each policy's run, by `run_here` in this process one after the other, or side by side
    in `settings.workers` processes (0: one per CPU), each of which reads the trace again."""
    placement = settings.scheduler.core.placement
    labels = [f"{policy}/{placement}" for policy in settings.policies]
    workers = worker_count(settings.workers, len(labels))
    with progress_bar(console) as progress:
        if workers <= 1:
            return [
                run_here(number, ShownProgress(progress, label, total))
                for number, label in enumerate(labels)
            ]
        shown = [ShownProgress(progress, label, total, started=False) for label in labels]
        return run_in_workers(
            partial(_prepare_in_worker, settings, out),
            partial(_run_in_worker, settings, out),
            labels,
            workers,
            shown,
        )


def _prepare_in_worker(settings: RunSettings, out: Path | None) -> _Prepared | _PreparedStream:
    """A worker process's share of its runs: the settings checked and the trace read again."""
    from rich.console import Console

    quiet = Console(quiet=True)
    try:
        if settings.stream:
            assert out is not None
            return _prepare_streamed(settings, quiet, out)
        return _prepare(settings, quiet)
    except REFUSALS as error:
        raise SimulationError(str(error)) from None


def _run_in_worker(
    settings: RunSettings,
    out: Path | None,
    prepared: _Prepared | _PreparedStream,
    number: int,
    progressed: RunProgress,
) -> SimResult:
    """A worker process's run of the policy `settings.policies[number]`."""
    try:
        if isinstance(prepared, _PreparedStream):
            assert out is not None
            return _run_streamed(settings, prepared, number, out, progressed)
        return _run_policy(settings, prepared, number, progressed)
    except REFUSALS as error:
        raise SimulationError(str(error)) from None


def _prepare_streamed(settings: RunSettings, console: Console, out: Path) -> _PreparedStream:
    check_settings(settings)
    refusal = stream_refusal(settings)
    if refusal is not None:
        raise SimulationError(refusal)
    perf = base_perf(settings)
    speed_for = perf.speed_model
    if settings.throughputs is not None:
        speed_for = load_throughputs(settings.throughputs).speed_model
    cluster, vcs, quota = build_cluster(settings)
    if len(cluster.gpu_types) > 1:
        raise SimulationError("--stream: not with more than one GPU type")
    multi_tenant = {admission_of(settings, vcs, name) for name in settings.policies} - {"none"}
    if multi_tenant:
        raise SimulationError(f"--stream: not with admission {', '.join(sorted(multi_tenant))}")
    trace = stream_trace(
        settings.trace, perf=perf, seed=settings.seed, arrival_scale=settings.arrival_scale
    )
    console.print(f"[bold]{trace.source}[/]: streamed on {cluster.describe()}", soft_wrap=True)
    out.mkdir(parents=True, exist_ok=True)
    placement = settings.scheduler.core.placement
    taken: set[str] = set()
    return _PreparedStream(
        perf=perf,
        speed_for=speed_for,
        vcs=vcs,
        quota=quota,
        failures=failure_model(settings),
        options=summary_options(settings),
        jobs_csv=[jobs_csv_name(policy, placement, taken) for policy in settings.policies],
    )


def _run_streamed(
    settings: RunSettings,
    prepared: _PreparedStream,
    number: int,
    out: Path,
    progressed: RunProgress,
) -> SimResult:
    """The run of `_simulate_streamed` of the policy `settings.policies[number]`."""
    policy = settings.policies[number]
    trace = stream_trace(
        settings.trace, perf=prepared.perf, seed=settings.seed, arrival_scale=settings.arrival_scale
    )
    run_cluster, _, _ = build_cluster(settings)
    jobs = (
        spec
        for position, spec in enumerate(trace.jobs)
        if fits(spec, position, run_cluster, settings.skip_oversized, trace.source)
    )
    if settings.checkpoint_every_s is not None:
        jobs = (replace(s, checkpoint_every_s=settings.checkpoint_every_s) for s in jobs)
    factor = settings.time_limit_factor
    if factor is not None:
        jobs = (with_time_limit(s, factor) for s in jobs)
    config = config_for(settings, policy)
    scheduler = make_scheduler(
        settings, run_cluster, prepared.vcs, prepared.quota, config, prepared.speed_for, []
    )
    reserve_all(settings, scheduler)
    from corral.sim.colocation import gandiva_summary
    from corral.sim.streamed import StreamedOutput

    jobs_csv = prepared.jobs_csv[number]
    with StreamedOutput(
        out / jobs_csv,
        out / decisions_name(jobs_csv) if settings.decisions else None,
        run_cluster.gpu_names(),
    ) as written:
        simulation = Simulation(
            jobs,
            scheduler,
            failures=prepared.failures,
            node_failures=settings.node_failures,
            seed=settings.seed,
            on_progress=progressed.advance,
            options=prepared.options | {"scheduler": config.resolved(prepared.vcs)},
            precheck_report_s=settings.precheck_report_s,
            on_end=written.job_ended,
            on_decision=written.decided if settings.decisions else None,
            keep_ended=False,
            timeline=TimelineTotals(total_gpus=run_cluster.total_gpus),
            node_changes=node_changes_of(settings, None, run_cluster),
        )
        result = simulation.run()
        result.stats = written.finish(result.jobs)
    result.annotations.update(gandiva_summary(simulation.scheduler))
    return result


def precheck_line(summary: dict[str, object]) -> str | None:
    """What the pre-runs of a run did, in one line (None: it ran none)."""
    prechecks = summary.get("prechecks")
    if not isinstance(prechecks, int):
        return None
    return (
        f"{summary['policy']}/{summary['placement']}: "
        f"{count_noun(prechecks, 'pre-run', spec=',')}, "
        f"{summary['precheck_passed']:,} passed, {summary['precheck_failed']:,} failed "
        f"(ended on one worker); {summary['precheck_gpu_hours']:,.1f} GPU-hours in pre-runs"
    )


def _run(
    settings: RunSettings, *, out: Path, plot: bool, console: Console
) -> list[dict[str, object]]:
    if settings.stream:
        results, multi_tenant = _simulate_streamed(settings, console, out), False
    else:
        results, multi_tenant = _simulate(settings, console)
    from corral.sim.colocation import gandiva_line
    from corral.sim.datasets import cache_line

    summaries = write_outputs(results, out, plot)
    console.print(summary_table(summaries))
    for summary in summaries:
        share, ratio = summary.get("best_type_share"), summary.get("min_equal_share_ratio")
        if isinstance(share, float) and isinstance(ratio, float):
            console.print(
                f"{summary['policy']}/{summary['placement']}: {share:.1%} of GPU time on each "
                f"job's fastest GPU type; slowest job at {ratio:.2f}x its equal-share speed"
            )
    if settings.cache_gb_per_node is not None:
        for summary in summaries:
            console.print(cache_line(summary))
    for line in filter(None, map(gandiva_line, summaries)):
        console.print(line)
    for line in filter(None, map(precheck_line, summaries)):
        console.print(line)
    from corral.sim.fragmentation import fragmentation_line

    for line in filter(None, map(fragmentation_line, summaries)):
        console.print(line, soft_wrap=True)
    for summary in summaries:
        if "deadline_met_share" in summary:
            console.print(
                f"{summary['policy']}/{summary['placement']}: {summary['deadline_met_share']:.1%} "
                f"of deadlines met ({summary['deadlines_met']} of {summary['deadline_jobs']}, "
                f"{summary['admitted']} admitted)"
                + (
                    f"; {count_noun(summary['grows'], 'grow')}, "  # type: ignore[arg-type]
                    f"{count_noun(summary['shrinks'], 'shrink')}, "  # type: ignore[arg-type]
                    f"{count_noun(summary['suspensions'], 'suspension')}"  # type: ignore[arg-type]
                    if "grows" in summary
                    else ""
                )
            )
    if multi_tenant or settings.private_baseline:
        for summary in summaries:
            console.print(vc_table(summary))
    for result in results:
        check = result.replay_check
        if check is None:
            continue
        name = f"replay-{result.policy}-{result.placement}.jsonl"
        (out / name).write_text("".join(json.dumps(r) + "\n" for r in check.records()))
        console.print(
            f"{result.policy}/{result.placement} against the manager's decisions: "
            f"{check.summary()} ({out / name})",
            soft_wrap=True,
        )
        for difference in check.differences[:5]:
            console.print(f"  differs: {difference.why}", soft_wrap=True)
        for note in check.notes[:5]:
            console.print(
                f"  note: at {note.at:.3f} s, job {note.job}: {note.what}", soft_wrap=True
            )
    console.print(f"wrote {out / 'summary.json'}" + (" and plots" if plot else ""))
    return summaries
