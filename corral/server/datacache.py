"""The live manager's data caches: SiloD's node caches (corral.core.cache) on real directories.

With `corral up --cache-gb-per-node G`, the manager models every node's cache as the simulator
does (`DataCache`, given to the plugins as `Services.cache`, its allocation run by the scheduler's
start hook), for the jobs whose spec names a `dataset`; and each node's cache is a directory:
`ROOT/NODE/DATASET` (ROOT is `--cache-dir`, by default DATA_DIR/cache; the same path on every
Ray node). What is real:

* **The job's variables.** A worker on a node where its attempt got cache space for its data set
  gets `CORRAL_DATASET` (the spec's name), `CORRAL_DATASET_CACHE` (that node's directory of the
  data set) and `CORRAL_DATASET_CACHE_GB` (the space the allocation gave it there). The job reads
  through the directory and fills it as it reads (copy on first read), keeping within its GB;
  the next job of the data set on that node finds what it left (a cache hit).
* **Eviction.** When the allocation gives a data set less room on a node than its directory was
  allowed (another data set took the space), and no attempt that reads it there is still live
  (running, or stopping), the manager deletes files of the directory, least recently used first,
  down to what stays allocated; a data set left no room loses its directory. The deleting runs in
  the background (corral.exec.cachedir; on a Ray node, as a task there); an attempt that would
  read a directory being trimmed waits until it is done, as a start waits for its GPUs to drain.
* **Ownership.** In single-user mode the directories are the manager's account's (0700), shared
  by every job of the data set. In multi-user mode a data set is cached per Unix account (the
  model's key is `NAME@ACCOUNT`): its directory belongs to that account (0700), below
  directories of the manager's that others may pass but not list (0711); one account's jobs can
  neither read, fill nor delete another's cached data, and the manager deletes without following
  links (corral.exec.cachedir).
* **Restarts.** What each node holds (the model's GB and last use per data set, and what each
  directory may hold) is kept in the store (meta `data_cache`) whenever it changes, in the same
  transaction as the attempt that changed it; a restart (or a rebuild of the scheduler when
  nodes come and go) adopts it, pins what the attempts found running read (`on_restore`), and
  trims whatever the model does not give room to; on this machine, a directory the record does
  not know (left by a crash) is trimmed to the model's allocation too. A different cache root
  starts empty (the old one is left as it is).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from corral.core.cache import DataCache, DataRead
from corral.core.cluster import Cluster
from corral.core.framework import STAGES
from corral.core.job import JobSpec, JobStatus
from corral.core.protocol import SchedulerCore
from corral.exec.cachedir import CacheDirs, node_dir_name
from corral.exec.local import AttemptLaunch, own_directory
from corral.server.spec import DEFAULT_READ_GB_S, JobSpecModel
from corral.server.state import Attempt, CacheSettings, Executor, ManagerSettings
from corral.server.store import Store

if TYPE_CHECKING:
    from corral.core.actions import Start

log = logging.getLogger("corral.cache")

#: The store's meta key under which the manager keeps what the nodes' caches hold.
CACHE_META_KEY = "data_cache"
#: The variables a job gets where its attempt got cache space (and never from its spec's env).
CACHE_VARIABLES = ("CORRAL_DATASET", "CORRAL_DATASET_CACHE", "CORRAL_DATASET_CACHE_GB")
GB = 1e9


def cache_root(settings: CacheSettings, data_dir: Path) -> Path:
    """The root of the nodes' cache directories: `--cache-dir`, else DATA_DIR/cache."""
    return Path(settings.root or data_dir / "cache").resolve()


class Dirs(Protocol):
    """Where a node's cache directories are trimmed (corral.exec.cachedir)."""

    local: bool

    def trim(self, node: str, path: Path, keep_bytes: int) -> None: ...
    def busy(self, node: str, path: Path) -> bool: ...
    def clear_evicted(self, node_dir: Path) -> None: ...


class LiveCache:
    """The part of `Manager` that runs the nodes' data caches (see the module's docstring)."""

    # The manager's state this part reads (Manager.__init__ sets it).
    settings: ManagerSettings
    cluster: Cluster
    store: Store
    executor: Executor
    data_dir: Path
    clock: Callable[[], float]
    scheduler: SchedulerCore
    _spec_models: dict[str, JobSpecModel]
    _accounts: dict[str, str]
    _attempts: dict[str, Attempt]
    _draining: dict[tuple[str, int], tuple[int, ...]]
    _tainted: dict[tuple[str, int], tuple[int, ...]]

    # -- set-up -------------------------------------------------------------------------------

    def _init_data_cache(self) -> None:
        """The cache's state before the first scheduler is built: what the store kept."""
        self.data_cache: DataCache | None = None
        self._cache_reads: dict[str, DataRead] = {}
        #: (node, key) -> GB its directory may hold (inf: not known; the most an attempt was
        #: told since the directory was last trimmed).
        self._cache_allowed: dict[tuple[str, str], float] = {}
        #: attempt -> the (node, key) directories it reads.
        self._cache_live: dict[tuple[str, int], set[tuple[str, str]]] = {}
        self._cache_kept: dict[str, dict[str, tuple[float, float]]] = {}
        self._cache_saved = ""
        settings = self.settings.cache
        if settings is None:
            return
        core = self.settings.scheduler.core
        sharing = [name for name in core.stages if name in STAGES and STAGES[name].shares_gpus]
        if sharing:  # as `corral simulate` refuses it
            raise ValueError(
                f"--cache-gb-per-node: not supported with the {sharing[0]} stage (it lets jobs "
                "share GPUs, at speeds it sets)"
            )
        self._cache_root = cache_root(settings, self.data_dir)
        # Kept as it is when it exists: jobs found running after a restart read through it.
        self._cache_root.mkdir(mode=0o700, parents=True, exist_ok=True)
        factory = getattr(self.executor, "cache_dirs", None)
        self._cache_dirs: Dirs = factory() if callable(factory) else CacheDirs()
        saved = self.store.get_meta(CACHE_META_KEY)
        try:
            self._load_cache_state(json.loads(saved) if saved else {})
        except (ValueError, TypeError, AttributeError) as error:  # not what this version wrote
            log.warning("the caches' record is unreadable (%s); starting empty", error)
            self._cache_kept, self._cache_allowed = {}, {}
        if self._cache_dirs.local:  # what is on this machine's disk, a crash's leftovers too
            for node in self.cluster.nodes:
                node_dir = self._cache_root / node_dir_name(node.name)
                self._cache_dirs.clear_evicted(node_dir)
                if node_dir.is_dir():
                    for entry in node_dir.iterdir():
                        if not entry.name.startswith("."):
                            self._cache_allowed.setdefault((node.name, entry.name), math.inf)

    def _load_cache_state(self, state: dict[str, Any]) -> None:
        if state.get("root") != str(self._cache_root):
            return  # another root's record (or none): this one starts empty
        self._cache_kept = {
            str(node): {str(key): (float(gb), float(used)) for key, (gb, used) in held.items()}
            for node, held in state.get("held", {}).items()
        }
        for node, dirs in state.get("dirs", {}).items():
            for key, gb in dirs.items():
                self._cache_allowed[(str(node), str(key))] = math.inf if gb is None else float(gb)

    def _new_data_cache(self) -> DataCache | None:
        """The model of the nodes' caches for a new scheduler on `self.cluster`, holding what the
        previous one held (or, at the first, what the store kept), node by node."""
        settings = self.settings.cache
        if settings is None:
            return None
        held = self._cache_holdings() if self.data_cache is not None else self._cache_kept
        cache = DataCache(
            self.cluster,
            capacity_gb_per_node=settings.gb_per_node,
            storage_gb_s_per_node=settings.storage_gbps / 8.0,
            reads=self._dataset_read,
            policy=settings.policy,
        )
        for index, node in enumerate(self.cluster.nodes):
            for key, (gb, used) in held.get(node.name, {}).items():
                cache.adopt(index, key, gb, used)
        return cache

    def _cache_holdings(self) -> dict[str, dict[str, tuple[float, float]]]:
        """node name -> data set key -> (GB, last used), as the model has it now."""
        cache = self.data_cache
        if cache is None:
            return {}
        return {
            cache.cluster.nodes[index].name: {
                key: (holding.gb, holding.last_used) for key, holding in node.held.items()
            }
            for index, node in enumerate(cache.nodes)
            if node.held
        }

    # -- what a job reads ---------------------------------------------------------------------

    def _dataset_read(self, spec: JobSpec) -> DataRead | None:
        """The DataCache's `reads`: what the job of this core spec reads (by its id)."""
        return self._read_of(spec.id)

    def _read_of(self, job_id: str) -> DataRead | None:
        read = self._cache_reads.get(job_id)
        if read is not None:
            return read
        model = self._spec_models.get(job_id)
        job = self.scheduler.jobs.get(job_id)
        if model is None or model.dataset is None or job is None:
            return None
        key = model.dataset.name
        if self.settings.multi_user:  # cached per account: no account trusts another's data
            key += "@" + (self._accounts.get(job_id) or job.spec.user)
        rate = model.dataset.read_gb_s or DEFAULT_READ_GB_S
        read = self._cache_reads[job_id] = DataRead(key, model.dataset.size_gb, rate)
        return read

    def cache_path(self, node: str, key: str) -> Path:
        """A node's directory of a data set (the same path on that node's own disk)."""
        return self._cache_root / node_dir_name(node) / key

    # -- starts -------------------------------------------------------------------------------

    def _cache_env(
        self,
        job_id: str,
        attempt: int,
        placement: list[tuple[str, list[int]]],
        envs: list[dict[str, str]],
        now: float,
    ) -> None:
        """Each worker's cache variables (where its node gave the data set room), recorded with
        the attempt: the directories it reads, what they may hold, what the caches hold."""
        cache = self.data_cache
        if cache is None:
            return
        for env in envs:
            for name in CACHE_VARIABLES:  # corral's, not the spec's
                env.pop(name, None)
        read = self._read_of(job_id)
        model = self._spec_models.get(job_id)
        if read is None or model is None or model.dataset is None:
            return
        index = {node.name: node.index for node in self.cluster.nodes}
        given: dict[str, float] = {}
        for (node, _), env in zip(placement, envs, strict=True):
            gb = given[node] = cache.nodes[index[node]].gb(read.dataset)
            if gb <= 1e-9:
                continue
            env["CORRAL_DATASET"] = model.dataset.name
            env["CORRAL_DATASET_CACHE"] = str(self.cache_path(node, read.dataset))
            env["CORRAL_DATASET_CACHE_GB"] = f"{gb:.6g}"
            pair = (node, read.dataset)
            self._cache_live.setdefault((job_id, attempt), set()).add(pair)
            self._cache_allowed[pair] = max(self._cache_allowed.get(pair, 0.0), gb)
        for node, gb in given.items():
            message = (
                f"data set {model.dataset.name}: {gb:.3g} of its {read.size_gb:.3g} GB "
                f"cached on {node}"
                if gb > 1e-9
                else f"data set {model.dataset.name}: no cache space on {node}; it reads storage"
            )
            self.store.add_event(job_id, now, "cache", message)
        self._save_cache_state()

    def _prepare_cache_dirs(self, launch: AttemptLaunch) -> None:
        """The directories of a launch's workers, on this machine (the local executor; a Ray
        worker's actor makes its own): the manager's root and node directories, passable by the
        jobs' accounts in multi-user mode, and the data set's, the job's account's. One that
        cannot be made leaves its worker without cache variables (it reads storage)."""
        if self.data_cache is None or not self._cache_dirs.local:
            return
        passable = 0o711 if launch.run_as is not None else 0o700
        for worker in launch.workers:
            path = worker.env.get("CORRAL_DATASET_CACHE")
            if not path:
                continue
            try:
                own_directory(self._cache_root, None, passable)
                own_directory(Path(path).parent, None, passable)
                own_directory(Path(path), launch.run_as, 0o700)
            except (OSError, ValueError) as error:
                log.warning("job %s: no cache directory %s: %s", launch.job_id, path, error)
                for name in CACHE_VARIABLES:
                    worker.env.pop(name, None)

    def _cache_busy(self, start: Start) -> bool:
        """Whether a start must wait: a directory it would read is being trimmed."""
        if self.data_cache is None:
            return False
        read = self._read_of(start.job_id)
        if read is None:
            return False
        nodes = {self.cluster.nodes[self.cluster.gpu_node[g]].name for g in start.gpus}
        return any(self._cache_dirs.busy(n, self.cache_path(n, read.dataset)) for n in nodes)

    # -- after recovery, after each round -----------------------------------------------------

    def _restore_cache_readers(self, now: float) -> None:
        """The attempts found running (or stopping) read their directories; those running pin
        their data sets in the model, at their speed with what their nodes hold."""
        cache = self.data_cache
        if cache is None:
            return
        live = [(job_id, a.number, a.gpus) for job_id, a in self._attempts.items()]
        live += [(job_id, number, gpus) for (job_id, number), gpus in self._draining.items()]
        for job_id, number, gpus in live:
            read = self._read_of(job_id)
            if read is None:
                continue
            job = self.scheduler.jobs[job_id]
            if job.status is JobStatus.RUNNING and job.attempts == number:
                cache.on_restore(job, now)
            pairs = {
                (self.cluster.nodes[self.cluster.gpu_node[g]].name, read.dataset) for g in gpus
            }
            self._cache_live[(job_id, number)] = pairs
            for pair in pairs:  # it may have filled more than the record says
                self._cache_allowed.setdefault(pair, math.inf)

    def _cache_sweep(self) -> None:
        """After a round: a directory no live attempt reads is trimmed to what the model still
        gives its data set on its node (removed when nothing)."""
        cache = self.data_cache
        if cache is None:
            return
        live_attempts = {(job_id, a.number) for job_id, a in self._attempts.items()}
        live_attempts.update(self._draining, self._tainted)
        for attempt in [a for a in self._cache_live if a not in live_attempts]:
            del self._cache_live[attempt]
        reading = {pair for pairs in self._cache_live.values() for pair in pairs}
        index = {node.name: node.index for node in self.cluster.nodes}
        changed = False
        for pair, allowed in list(self._cache_allowed.items()):
            node, key = pair
            if pair in reading or node not in index:
                continue
            now_gb = cache.nodes[index[node]].gb(key)
            path = self.cache_path(node, key)
            if now_gb >= allowed - 1e-9 or self._cache_dirs.busy(node, path):
                continue
            log.info("cache of %s on %s: %.3g GB, was %.3g GB", key, node, now_gb, allowed)
            self._cache_dirs.trim(node, path, int(now_gb * GB) if now_gb > 1e-9 else 0)
            if now_gb > 1e-9:
                self._cache_allowed[pair] = now_gb
            else:
                del self._cache_allowed[pair]
            changed = True
        if changed:
            self._save_cache_state()

    def _save_cache_state(self) -> None:
        """Keep what the caches hold in the store (when it changed)."""
        state = json.dumps(
            {
                "root": str(self._cache_root),
                "held": {
                    node: {key: [gb, used] for key, (gb, used) in sorted(held.items())}
                    for node, held in sorted(self._cache_holdings().items())
                },
                "dirs": self._dirs_state(),
            },
            sort_keys=True,
        )
        if state != self._cache_saved:
            self.store.set_meta(CACHE_META_KEY, state)
            self._cache_saved = state

    def _dirs_state(self) -> dict[str, dict[str, float | None]]:
        dirs: dict[str, dict[str, float | None]] = {}
        for (node, key), gb in sorted(self._cache_allowed.items()):
            dirs.setdefault(node, {})[key] = None if math.isinf(gb) else gb
        return dirs

    def _cache_forget(self, job_id: str) -> None:
        """A job that ended: its read and its statistics go (its live attempts' directories stay
        recorded until they end)."""
        self._cache_reads.pop(job_id, None)
        if self.data_cache is not None:
            self.data_cache.forget(job_id)
