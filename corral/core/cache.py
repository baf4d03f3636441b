"""A data-set cache on every node, scheduled as a resource (SiloD, Zhao et al., EuroSys'23).

Training jobs read their data set from a remote storage service; each node keeps a local cache
(SSD or memory) of data-set contents. SiloD's observation is that the scheduler should manage
that cache, and the remote IO, together with the GPUs, because a job's speed is bounded by both:

* **Speed.** A job that reads `rate` GB/s per GPU at full compute speed, gets `share` GB/s of
  remote IO per GPU and finds a fraction `hit` of its reads in the node's cache runs at
  `min(compute, share / (rate x (1 - hit)))` (SiloD's performance estimator: throughput is the
  smaller of the compute-bound and the IO-bound rate, and only misses use remote IO). A gang
  runs at the pace of its slowest node.
* **Hit ratio.** Each epoch reads every sample once in a fresh random order, so a cache holding
  a fraction `x` of the data set serves `x` of the reads if it keeps a fixed subset for the whole
  run (SiloD's uniform caching; the same finding as CoorDL's MinIO cache, Mohan et al., VLDB'21).
  An LRU cache does worse: a sample hits only if fewer than `x` of the data set were read since
  its last access. Between two reads of one sample at positions `u` and `v` of consecutive
  epochs (uniform), `1 - u (1 - v)` of the data set was read, so
  `P(hit) = P(u (1 - v) > 1 - x) = x + (1 - x) ln(1 - x)` (0.15 instead of 0.5 at `x = 0.5`;
  our derivation, checked by simulation in tests/core/test_cache.py).
* **Remote IO.** A node's storage bandwidth is shared by its GPUs in equal, fixed shares (the
  share of a job is `gpus on the node x node bandwidth / node GPUs`).

**Speed is fixed per attempt.** Cache contents are decided when a job starts (`on_start`, a hook
the scheduler calls once per attempt). The part of its data set a running job needs is pinned:
never shrunk while the job runs (uniform caching never evicts during training; under `silod` it
is what keeps the job at its speed, under `lru` all it holds), and the IO share is fixed, so
nothing later changes a running job's rates; the scheduler never has to learn about a cache
change. The one transient, the first epoch, which must read from remote storage what the
cache does not hold yet (it is inserted as it is read), is charged as a stall before the job's
work counts: `epoch x (1 / first-epoch speed - 1 / speed)`, the epoch capped by the work left.

**Allocation.** When a job starts on a node, the node's space that running jobs do not pin is
handed out again, greedily, to requests in rank order, each up to its size (`greedy_allocation`):

* `silod` ranks by throughput gain per GB (SiloD's greedy cache allocation). The starting job
  asks for the part of its data set it needs to run at full speed, `need = size x (1 - share /
  (rate x compute))` under uniform caching, at a gain of `gpus x (compute - storage-bound speed) /
  need` GPU-speed per GB; the rest of its data set, what running jobs hold beyond their need, and
  the data sets no running job reads (kept for later jobs, most recently used first) bring no
  running job any speed: gain 0. So
  the needed part evicts idle data, while a job that storage alone keeps at full speed, or the
  part beyond what a job needs, only takes space nobody else wants.
* `lru` (cache-oblivious) ranks by recency: the starting job's whole data set first (whatever
  runs is cached), then the idle data sets by when they were last read.

SiloD also re-plans the cache of running jobs as jobs come and go; here a running job's needed
part is pinned for its attempt (see above), so the greedy choice is made among the starting
job's request and the space nobody needs. `greedy_allocation` itself ranks any set of requests.

The placement that uses this state is `corral.core.placement.cacheaware`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from corral.core.cacheerror import CACHE_POLICIES as CACHE_POLICIES
from corral.core.cacheerror import CacheError as CacheError
from corral.core.cluster import Cluster
from corral.core.job import Job, JobSpec, JobStatus


@dataclass(slots=True, frozen=True)
class DataRead:
    """What a job reads: its data set, the data set's size and the GB/s it reads per GPU when it
    runs at speed 1.0 (full compute speed on its reference GPU type)."""

    dataset: str
    size_gb: float
    gb_s_per_gpu: float


#: What the shell knows about a job's input: None for a job that reads no data set.
ReadsOf = Callable[[JobSpec], DataRead | None]


@dataclass(slots=True, frozen=True)
class Want:
    """A request for cache space: up to `gb` for `dataset`, ranked by `rank` (lower first; a
    data set may make several requests of different ranks)."""

    dataset: str
    gb: float
    rank: tuple[float, ...]


def greedy_allocation(space_gb: float, wants: Sequence[Want]) -> dict[str, float]:
    """Fill `space_gb` with the wants in rank order, each up to its size (the last one partly)."""
    given: dict[str, float] = {}
    left = max(0.0, space_gb)
    for want in sorted(wants, key=lambda w: (w.rank, w.dataset)):
        take = min(max(0.0, want.gb), left)
        given[want.dataset] = given.get(want.dataset, 0.0) + take
        left -= take
    return given


def uniform_hit_ratio(fraction: float) -> float:
    return min(1.0, max(0.0, fraction))


def lru_hit_ratio(fraction: float) -> float:
    """Hit ratio of an LRU cache holding `fraction` of a data set read in shuffled epochs."""
    x = min(1.0, max(0.0, fraction))
    if x >= 1.0:
        return 1.0
    return max(0.0, x + (1.0 - x) * math.log1p(-x))


def io_bound_speed(share_gb_s: float, rate_gb_s: float, hit: float) -> float:
    """The speed remote IO allows (per GPU): `share / (rate x miss)`, infinite with no misses."""
    miss = 1.0 - hit
    if rate_gb_s <= 0 or miss <= 1e-12:
        return math.inf
    return share_gb_s / (rate_gb_s * miss)


@dataclass(slots=True)
class Holding:
    gb: float
    last_used: float  # when a job last started or stopped reading it on this node


@dataclass(slots=True, frozen=True)
class AttemptRead:
    """One attempt of a job that reads a data set, for the hit-ratio and stall statistics."""

    work_at_start: float
    epoch_s: float  # ideal seconds to read the data set once
    hit_first_epoch: float
    hit: float
    gb_per_ideal_s: float  # what the job reads per ideal second of work
    stall_s: float
    gpus: int


@dataclass(slots=True)
class NodeCache:
    capacity_gb: float
    held: dict[str, Holding] = field(default_factory=dict)
    #: job id -> (job, attempt, data set, GB it needs for full speed) of the jobs reading here
    readers: dict[str, tuple[Job, int, str, float]] = field(default_factory=dict)

    def gb(self, dataset: str) -> float:
        holding = self.held.get(dataset)
        return 0.0 if holding is None else holding.gb


class DataCache:
    """The caches of all nodes of one cluster, and the speeds they give the jobs that start."""

    def __init__(
        self,
        cluster: Cluster,
        *,
        capacity_gb_per_node: float,
        storage_gb_s_per_node: float,
        reads: ReadsOf,
        policy: str = "lru",
    ) -> None:
        if not math.isfinite(capacity_gb_per_node) or capacity_gb_per_node < 0:
            raise CacheError(f"cache capacity must be >= 0 GB, got {capacity_gb_per_node}")
        if not math.isfinite(storage_gb_s_per_node) or storage_gb_s_per_node <= 0:
            raise CacheError(f"storage bandwidth must be > 0, got {storage_gb_s_per_node}")
        if policy not in CACHE_POLICIES:
            raise CacheError(
                f"unknown cache policy {policy!r}; choose one of {', '.join(CACHE_POLICIES)}"
            )
        self.cluster = cluster
        self.reads = reads
        self.policy = policy
        self.storage_gb_s_per_node = storage_gb_s_per_node
        self.nodes = [NodeCache(capacity_gb_per_node) for _ in cluster.nodes]
        self._holders: dict[str, set[int]] = {}  # data set -> nodes holding some of it
        self.attempts: dict[str, list[AttemptRead]] = {}

    # -- queries (pure) ----------------------------------------------------------------------

    def share_gb_s(self, node: int) -> float:
        """Remote IO per GPU on a node: its storage bandwidth over its GPUs."""
        return self.storage_gb_s_per_node / self.cluster.nodes[node].total_gpus

    def hit_ratio(self, fraction: float) -> float:
        return uniform_hit_ratio(fraction) if self.policy == "silod" else lru_hit_ratio(fraction)

    def cached_fraction(self, node: int, read: DataRead) -> float:
        return min(1.0, self.nodes[node].gb(read.dataset) / read.size_gb)

    def holders(self, dataset: str) -> Iterable[int]:
        return self._holders.get(dataset, ())

    def io_bound(self, read: DataRead, node: int) -> bool:
        """Would a job reading this run below full speed from remote storage alone there?"""
        return read.gb_s_per_gpu > self.share_gb_s(node)

    def speed(self, read: DataRead, gpus: Sequence[int], compute: float) -> float:
        """The speed of a job at compute speed `compute` on these GPUs with the caches as they are."""
        per_node = Counter(self.cluster.gpu_node[g] for g in gpus)
        bounds = (
            io_bound_speed(
                self.share_gb_s(n), read.gb_s_per_gpu, self.hit_ratio(self.cached_fraction(n, read))
            )
            for n in per_node
        )
        return min(compute, *bounds)

    # -- the start hook ----------------------------------------------------------------------

    def on_start(self, job: Job, now: float) -> None:
        """A job starts on `job.placement` at compute speed `job.speed`: allocate the caches of
        its nodes, lower its speed to what IO allows and add the first epoch's extra time to its
        stall (corral.core.scheduler.StartHook)."""
        read = self.reads(job.spec)
        if read is None or read.size_gb <= 0 or read.gb_s_per_gpu <= 0 or not job.placement:
            return
        compute = job.speed
        per_node = Counter(self.cluster.gpu_node[g] for g in job.placement)
        first = speed = compute
        hit_first = hit = 0.0
        for node, count in sorted(per_node.items()):
            share = self.share_gb_s(node)
            cache = self.nodes[node]
            self._forget_stopped(cache, now)
            before = self.hit_ratio(self.cached_fraction(node, read))
            uncached = io_bound_speed(share, read.gb_s_per_gpu, 0.0)  # what storage alone allows
            need_gb = self._need_gb(node, read, compute)
            gain = count * (compute - min(compute, uncached))
            gain_per_gb = gain / need_gb if need_gb > 0 else 0.0
            self._allocate(node, read, need_gb, gain_per_gb, now)
            cache.readers[job.id] = (job, job.attempts, read.dataset, need_gb)
            after = self.hit_ratio(self.cached_fraction(node, read))
            before = min(before, after)  # a portion given up is gone from the first epoch too
            first = min(first, io_bound_speed(share, read.gb_s_per_gpu, before))
            speed = min(speed, io_bound_speed(share, read.gb_s_per_gpu, after))
            hit_first += before * count / job.spec.gpus
            hit += after * count / job.spec.gpus
        rate = read.gb_s_per_gpu * job.spec.gpus
        epoch_s = read.size_gb / rate
        stall = min(epoch_s, job.remaining_work_s(now)) * (1.0 / first - 1.0 / speed)
        job.speed = speed
        job.stall_until += max(0.0, stall)
        self.attempts.setdefault(job.id, []).append(
            AttemptRead(
                job.work_done_s, epoch_s, hit_first, hit, rate, max(0.0, stall), job.spec.gpus
            )
        )

    def on_restore(self, job: Job, now: float) -> None:
        """A running job found again after the shell rebuilt its scheduler (a restart, nodes that
        came or went): it reads from what its nodes hold, which stays pinned while it runs, and
        its speed is what IO allows with that. Nothing is allocated and no first epoch is
        charged: the attempt started before."""
        read = self.reads(job.spec)
        if read is None or read.size_gb <= 0 or read.gb_s_per_gpu <= 0 or not job.placement:
            return
        compute = job.speed
        speed = compute
        for node in sorted({self.cluster.gpu_node[g] for g in job.placement}):
            cache = self.nodes[node]
            self._forget_stopped(cache, now)
            cache.readers[job.id] = (
                job,
                job.attempts,
                read.dataset,
                self._need_gb(node, read, compute),
            )
            hit = self.hit_ratio(self.cached_fraction(node, read))
            speed = min(speed, io_bound_speed(self.share_gb_s(node), read.gb_s_per_gpu, hit))
        job.speed = speed

    def adopt(self, node: int, dataset: str, gb: float, last_used: float) -> None:
        """Record that a node's cache holds `gb` of a data set, last read at `last_used` (a shell
        carrying its caches over a rebuild of its scheduler, or a restart)."""
        if not math.isfinite(gb) or gb <= 1e-9:
            return
        self.nodes[node].held[dataset] = Holding(gb, last_used)
        self._holders.setdefault(dataset, set()).add(node)

    def forget(self, job_id: str) -> None:
        """Drop a finished job's statistics (a shell that runs for ever keeps no history)."""
        self.attempts.pop(job_id, None)

    def _need_gb(self, node: int, read: DataRead, compute: float) -> float:
        """GB of the data set that must hit on this node for the job to run at `compute`."""
        uncached = io_bound_speed(self.share_gb_s(node), read.gb_s_per_gpu, 0.0)
        return read.size_gb * max(0.0, 1.0 - uncached / compute) if compute > 0 else 0.0

    def _forget_stopped(self, cache: NodeCache, now: float) -> None:
        """Readers whose attempt ended no longer pin their data set; it was last used now (the
        cache learns of a stop at the next start on the node)."""
        for job_id, (job, attempt, dataset, _) in list(cache.readers.items()):
            if job.status is not JobStatus.RUNNING or job.attempts != attempt:
                del cache.readers[job_id]
                holding = cache.held.get(dataset)
                if holding is not None:
                    holding.last_used = now

    def _allocate(
        self, node: int, read: DataRead, need_gb: float, gain_per_gb: float, now: float
    ) -> None:
        cache = self.nodes[node]
        pinned = self._pinned(cache)
        floor = pinned.get(read.dataset, 0.0)
        space = cache.capacity_gb - sum(pinned.values())
        wanted = read.size_gb - floor
        if self.policy == "silod":
            needed = min(wanted, max(0.0, need_gb - floor))
            wants = [
                Want(read.dataset, needed, (-gain_per_gb, 1.0, -now)),
                Want(read.dataset, wanted - needed, (0.0, 1.0, -now)),
            ]
        else:
            wants = [Want(read.dataset, wanted, (-1.0, 0.0, -now))]
        wants += [  # the rest brings no running job any speed: gain 0; in use, then by recency
            Want(
                d, h.gb - pinned.get(d, 0.0), (0.0, 0.0, -math.inf if d in pinned else -h.last_used)
            )
            for d, h in cache.held.items()
            if d != read.dataset
        ]
        for dataset, given in greedy_allocation(space, wants).items():
            gb = pinned.get(dataset, 0.0) + given
            if gb <= 1e-9:
                cache.held.pop(dataset, None)
                self._holders.get(dataset, set()).discard(node)
            elif dataset in cache.held:
                cache.held[dataset].gb = gb
            else:
                cache.held[dataset] = Holding(gb, now)
                self._holders.setdefault(dataset, set()).add(node)
        if read.dataset in cache.held:
            cache.held[read.dataset].last_used = now

    def _pinned(self, cache: NodeCache) -> dict[str, float]:
        """GB of each data set that running jobs need: all of it under lru (any eviction lowers
        their hit ratio), what keeps them at their speed under silod (uniform caching at full speed
        does not miss what it holds beyond the need)."""
        pinned: dict[str, float] = {}
        for _, _, dataset, need_gb in cache.readers.values():
            held = cache.gb(dataset)
            keep = held if self.policy == "lru" else min(held, need_gb)
            pinned[dataset] = max(pinned.get(dataset, 0.0), keep)
        return pinned

    # -- statistics ---------------------------------------------------------------------------

    def summary(self, jobs: Iterable[Job]) -> dict[str, float | None]:
        """Over these jobs: the share of the data they read that a cache served, the work
        done per GPU-second they held, and the GPU-hours spent reading a first epoch."""
        read_gb = hit_gb = work = held = stall_gpu_s = 0.0
        for job in jobs:
            held += job.spec.gpus * job.executed_s
            work += job.spec.gpus * job.work_done_s
            attempts = self.attempts.get(job.id, [])
            if not attempts:
                continue
            ends = [a.work_at_start for a in attempts[1:]] + [job.work_done_s]
            for attempt, end in zip(attempts, ends, strict=True):
                done = max(0.0, end - attempt.work_at_start)
                first = min(done, attempt.epoch_s)
                read_gb += done * attempt.gb_per_ideal_s
                hit_gb += attempt.gb_per_ideal_s * (
                    first * attempt.hit_first_epoch + (done - first) * attempt.hit
                )
                stall_gpu_s += attempt.stall_s * attempt.gpus
        return {
            "cache_hit_ratio": hit_gb / read_gb if read_gb > 0 else None,
            "avg_speed": work / held if held > 0 else None,
            "first_epoch_stall_gpu_h": stall_gpu_s / 3600.0,
        }
