"""What the live manager's parts share: its settings, the executor it drives, its records.

`Manager` (corral.server.manager) is one class composed of parts, one module each; the types here
are those that more than one part uses. Import the public ones from corral.server.manager.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from corral.core.cluster import Cluster
from corral.core.framework import SchedulerConfig
from corral.exec.contain import default_pids_max
from corral.exec.local import AttemptEnded, AttemptLaunch
from corral.exec.logcap import DEFAULT_CAP_BYTES
from corral.server.connections import ConnectionLimits
from corral.server.health import HealthSettings
from corral.server.telemetry import MAX_READS_PER_S


class Executor(Protocol):
    """How the manager runs attempts (corral.exec.local, .ray, .inert; chosen by name through
    corral.server.executors). Called from the control loop and, for `stop` and `signal`, from
    the API's threads under the manager's lock. Optional attributes the manager reads when an
    executor has them: `shares_gpus` (False: no shares of a GPU), `workdirs_here` (the API checks
    a spec's workdir on this machine), `unenforced_limits()` or `limits_text(cap)` and
    `identity_text` (what `corral up` says at its start), `cache_dirs()` (SiloD's directories)."""

    def launch(self, launch: AttemptLaunch) -> None:
        """Start the attempt and return at once (an exception: it is lost, never started). One
        that runs processes makes the job's directories first (`launch.job_dir`, its own
        workdir: corral.exec.local.make_job_dirs, whose LaunchRefused is a failed start)."""
        ...

    def stop(self, job_id: str, attempt: int) -> None:
        """Ask the attempt to end (its stop signal, then its grace); idempotent."""
        ...

    def signal(self, job_id: str, attempt: int, number: int) -> None:
        """Send the attempt's workers signal `number` without stopping them."""
        ...

    def poll(self) -> list[AttemptEnded]:
        """The attempts that ended since the last call, each reported once; never blocks."""
        ...

    def recover(self, job_id: str, attempt: int, attempt_dir: Path) -> str | AttemptEnded:
        """After a restart or rebuild: "running" (tracked again), its end, or "never-started".
        Called for several attempts at once, from several threads."""
        ...

    def leftover(self, job_id: str, attempt: int, attempt_dir: Path) -> int:
        """How many processes of an ended attempt still live (its GPUs wait until 0)."""
        ...

    def close(self) -> None:
        """Stop tracking; never ends an attempt (they outlive the manager where they can)."""
        ...


class SubmitError(ValueError):
    """A job the manager refuses (unknown VC, too big for the cluster); nothing is stored."""


@dataclass(slots=True, frozen=True)
class CacheSettings:
    """SiloD's node caches live (`corral up --cache-gb-per-node`; docs/silod.md#live)."""

    gb_per_node: float
    #: Remote-storage bandwidth per node, Gbit/s, shared equally by its GPUs.
    storage_gbps: float = 1.0
    #: lru (cache-oblivious) or silod (gain per GB): corral.core.cache.CACHE_POLICIES.
    policy: str = "lru"
    #: The root of every node's cache directories (NODE/DATASET below it); None: DATA_DIR/cache.
    root: Path | None = None


@dataclass(slots=True)
class ManagerSettings:
    #: The scheduler: policy, placement, admission, stages and every plugin's options, the same
    #: config (and defaults) `corral simulate` builds from (corral.core.framework).
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    #: Gittins's job sizes (GPU-seconds); None: learned from the jobs this manager finished.
    gittins_history_gpu_s: list[float] | None = None
    tick_s: float = 0.2
    #: The longest grace period a job's spec may ask for (then SIGKILL).
    max_grace_s: float = 300.0
    #: The shortest time between two scheduling rounds.
    round_gap_s: float = 0.02
    #: How often the running jobs' progress reports are read (and hangs and time limits checked).
    progress_check_s: float = 1.0
    #: At most this many attempts' progress files are read a second in all: with more attempts
    #: running than fit in `progress_check_s`, each is read less often (corral.server.telemetry);
    #: None: no bound.
    progress_reads_per_s: float | None = MAX_READS_PER_S
    #: An attempt's measured rate is folded into its shape's profile after this many seconds of
    #: its reports (and when it ends, or starts or stops sharing its GPUs).
    profile_fold_s: float = 30.0
    #: An attempt measured faster than this many steps/s (by the manager's clock) has its progress
    #: reports rejected: none of its measurements count (corral.server.telemetry); None: no
    #: ceiling.
    max_steps_per_s: float | None = 100_000.0
    #: How often a cluster whose nodes come and go (Ray) is read again.
    node_check_s: float = 1.0
    #: Where jobs' checkpoint dirs go (one per job); storage every node sees. Default: the
    #: data dir's jobs/JOB/checkpoint.
    checkpoint_root: Path | None = None
    #: The nodes' data caches (SiloD); None: jobs' data sets are not modelled.
    cache: CacheSettings | None = None
    #: Run each user's jobs under their own Unix account (the manager runs as root); False: every
    #: job runs as the manager's own user (single-user mode).
    multi_user: bool = False
    #: Each worker's stdout and stderr keep at most this many bytes (the oldest are dropped).
    log_cap_bytes: int = DEFAULT_CAP_BYTES
    #: The most tasks (processes and threads) of one attempt at once, its pids.max (`corral up
    #: --job-pids-max`; each worker's on Ray); None: no limit.
    job_pids_max: int | None = field(default_factory=default_pids_max)
    #: The API refuses (413) a request body longer than this (corral.server.limits).
    max_body_bytes: int = 1 << 20
    #: The API's connections: at most so many in all and per peer, and how long a request may
    #: take to arrive (corral.server.connections).
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)
    #: Each GPU type's memory in MiB, where known (NVML's, or `corral up --gpu-memory`): what a
    #: spec's `gpu_memory` is a share of, and a share's MPS memory limit (docs/fgd.md#live).
    gpu_memory_mib: dict[str, int] = field(default_factory=dict)
    #: FGD's target workload live: the task shapes of the latest this many jobs submitted.
    workload_jobs: int = 1000
    #: /metrics: the SHA-256 of the token Prometheus sends (`corral up`'s metrics token file);
    #: None: only admins' API tokens read it. `metrics_public`: it needs no token at all.
    metrics_token_sha256: bytes | None = None
    metrics_public: bool = False
    #: A scheduling round runs at least this often, also when nothing happened (a quiet round
    #: repeats the last one cheaply): /readyz and corral_last_round_timestamp_seconds see a
    #: live loop. `ready_round_s`: /readyz answers 503 once no round ran for this long.
    round_every_s: float = 5.0
    ready_round_s: float = 30.0
    #: The nodes' health checks (a site's command, NVML's signals: corral.server.health); None:
    #: none.
    health: HealthSettings | None = None


@dataclass(slots=True)
class Attempt:
    """A launched attempt the manager tracks: its number, its GPUs and when it started."""

    number: int
    gpus: tuple[int, ...]
    started_at: float


def gpu_ids_by_name(cluster: Cluster) -> dict[str, int]:
    return {
        f"{node.name}/{device}": gpu
        for node in cluster.nodes
        for device, gpu in enumerate(cluster.node_gpus[node.index])
    }
