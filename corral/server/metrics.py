"""Prometheus metrics of a Manager, by Prometheus's conventions.

Two kinds: counters and histograms of what happened (`ManagerMetrics`: submissions, starts,
preemptions, failures by cause, retries, finished jobs, queueing and round times), kept in
memory from the manager's start (a restart begins them at 0 again, which `rate()` and
`increase()` take for a counter reset); and gauges of the current state, read from the manager
at scrape time (`ManagerCollector`: nothing to keep in step). One registry per manager holds both,
with the process's own metrics (CPU, memory, open files) and `corral_build_info`.

Labels: `vc` (the cluster's VCs: a few), `user` on submissions and finished jobs (the tokens'
names, not free text), `cause`, `kind` and `status` (fixed sets). Never a job id on a counter or a
histogram; the per-job gauges name their job `job_id` (a label `job` or `instance` would clash
with the ones Prometheus sets on every series it scrapes, and be stored as `exported_job`), and
list running jobs only.

Every labelled counter and histogram has a series at 0 for each label set known in advance
(`ManagerMetrics.know`: every VC with every cause, kind and final status; every user a live token
names with the VCs it may submit to, and the users of the jobs that wait or run), from the
manager's start: `increase()` and `rate()` see a series's first event only where the series was
scraped before it, at 0. A token made later (`POST /api/v1/tokens`) adds its user's series then.
"""

from __future__ import annotations

import platform
import time
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

import corral
from corral.core.job import JobStatus
from corral.server.store import StoreUnavailable

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from prometheus_client.core import Metric

    from corral.core.job import Job
    from corral.server.manager import Manager
    from corral.server.store import Store

# No `_created` series beside each counter and histogram: the text format Prometheus scrapes has
# no use for them, and they would double the series of every labelled counter.
disable_created_metrics()

#: Queueing of deep-learning jobs: seconds (an idle cluster) to a week (a busy VC's backlog).
QUEUEING_BUCKETS = (
    1.0,
    5.0,
    15.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
    2 * 3600.0,
    4 * 3600.0,
    8 * 3600.0,
    12 * 3600.0,
    86400.0,
    2 * 86400.0,
    4 * 86400.0,
    7 * 86400.0,
)
#: A scheduling round: a millisecond (a few jobs) to seconds (100,000 queued, a slow database).
ROUND_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Why an attempt failed, as the manager tells it (the `cause` label).
FAILURE_CAUSES = ("user", "infrastructure", "hung", "time_limit")
#: Why the scheduler stopped a running attempt for others' sake (the `kind` label; core.actions'
#: `Preempt.kind`).
PREEMPTION_KINDS = ("preempted", "migrated", "unpacked")
#: How a job ends (the `status` label of corral_jobs_finished_total).
FINAL_STATUSES = tuple(status.value for status in JobStatus if status.finished)


class ManagerMetrics:
    """The counters and histograms one manager updates as things happen, in its own registry
    (a test's many managers in one process each count their own)."""

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        self.submitted = Counter(
            "corral_jobs_submitted",
            "Jobs accepted (stored), per VC and user.",
            ["vc", "user"],
            registry=registry,
        )
        self.started = Counter(
            "corral_attempts_started",
            "Attempts started (first starts, resumes after a preemption, retries, pre-runs).",
            ["vc"],
            registry=registry,
        )
        self.preemptions = Counter(
            "corral_preemptions",
            "Running attempts the scheduler stopped to give their GPUs to others, per VC and "
            "kind (preempted, migrated, unpacked).",
            ["vc", "kind"],
            registry=registry,
        )
        self.failures = Counter(
            "corral_attempt_failures",
            "Attempts that failed, per VC and cause (user: the job's own error; infrastructure: "
            "lost, its node left or its supervisor died; hung: no progress report for its "
            "progress_timeout; time_limit: ran past its time_limit).",
            ["vc", "cause"],
            registry=registry,
        )
        self.retries = Counter(
            "corral_retries",
            "Failed attempts whose job was requeued to run again (the others ended it).",
            ["vc"],
            registry=registry,
        )
        self.finished = Counter(
            "corral_jobs_finished",
            "Jobs that ended, per VC, user and final status (SUCCEEDED, FAILED, CANCELLED).",
            ["vc", "user", "status"],
            registry=registry,
        )
        self.queueing = Histogram(
            "corral_job_queueing_seconds",
            "Seconds from a job's submission to the start of its first attempt, per VC.",
            ["vc"],
            buckets=QUEUEING_BUCKETS,
            registry=registry,
        )
        self.round_seconds = Histogram(
            "corral_scheduling_round_seconds",
            "Duration of scheduling rounds (collect ends, decide, record, carry out).",
            buckets=ROUND_BUCKETS,
            registry=registry,
        )
        #: The (VC, user) pairs whose series exist (`know`).
        self._owners: set[tuple[str, str]] = set()
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        self.build = (corral.__version__, platform.python_version())

    def watch(self, manager: Manager) -> None:
        """Add the gauges read from `manager` at each scrape."""
        self.registry.register(ManagerCollector(manager))

    def know(self, vcs: Iterable[str], owners: Iterable[tuple[str, str]] = ()) -> None:
        """Give every label set of these VCs and (VC, user) pairs its series, at 0 until it
        counts (one already there keeps its count)."""
        for vc in vcs:
            self.started.labels(vc)
            self.retries.labels(vc)
            self.queueing.labels(vc)
            for kind in PREEMPTION_KINDS:
                self.preemptions.labels(vc, kind)
            for cause in FAILURE_CAUSES:
                self.failures.labels(vc, cause)
        for vc, user in owners:
            if (vc, user) in self._owners:  # (each submission names its owner: kept cheap)
                continue
            self._owners.add((vc, user))
            self.submitted.labels(vc, user)
            for status in FINAL_STATUSES:
                self.finished.labels(vc, user, status)

    def know_from(self, store: Store, vcs: Iterable[str], jobs: Iterable[Job]) -> None:
        """`know` the label sets of a manager: its VCs; each live token's user with its VC (every
        VC for a token bound to none); the users of `jobs` (those waiting or running: a token
        since revoked may have submitted them)."""
        vcs = sorted(vcs)
        owners: set[tuple[str, str]] = set()
        now = time.time()
        for token in store.list_tokens():
            if token.revoked_at is not None or (
                token.expires_at is not None and token.expires_at <= now
            ):
                continue
            owners.update((vc, token.user) for vc in vcs if token.vc in (None, vc))
        owners.update((job.spec.vc, job.spec.user) for job in jobs)
        self.know(vcs, sorted(owners))

    def failed(self, vc: str, cause: str, *, retried: bool) -> None:
        self.failures.labels(vc, cause).inc()
        if retried:
            self.retries.labels(vc).inc()

    def text(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class ManagerCollector(Collector):
    """Gauges of the manager's current state, read at scrape time."""

    def __init__(self, manager: Manager) -> None:
        self.manager = manager

    def collect(self) -> Iterator[Metric]:
        manager = self.manager
        version, python = manager.metrics.build
        build = GaugeMetricFamily(
            "corral_build_info",
            "The corral version and Python the manager runs (always 1).",
            labels=["version", "python"],
        )
        build.add_metric([version, python], 1)
        yield build
        counts = manager.counts_by_vc()
        queue = GaugeMetricFamily(
            "corral_queue_length", "Jobs waiting to run, per VC.", labels=["vc"]
        )
        running = GaugeMetricFamily("corral_jobs_running", "Jobs running, per VC.", labels=["vc"])
        allocated = GaugeMetricFamily(
            "corral_gpus_allocated", "GPUs held by running jobs, per VC.", labels=["vc"]
        )
        guaranteed = GaugeMetricFamily(
            "corral_gpus_guaranteed", "GPUs each VC is guaranteed.", labels=["vc"]
        )
        for vc, count in sorted(counts.items()):
            queue.add_metric([vc], count["pending"])
            running.add_metric([vc], count["running"])
            allocated.add_metric([vc], count["gpus"])
            guaranteed.add_metric([vc], manager.vc_quota[vc])
        yield queue
        yield running
        yield allocated
        yield guaranteed
        node_state = GaugeMetricFamily(
            "corral_node_state",
            "1 for the state each node is in (up, draining, drained, unhealthy, down), 0 for the others.",
            labels=["node", "state"],
        )
        for node, state, value in manager.node_state_counts():
            node_state.add_metric([node, state], value)
        yield node_state
        up = GaugeMetricFamily(
            "corral_store_up",
            "1 while the store answers and the manager's state is the store's; 0 from a failed "
            "store call until the state is rebuilt from the store (changes are refused, 503).",
        )
        try:
            yield from self._from_store()
        except StoreUnavailable:
            up.add_metric([], 0)
        else:
            up.add_metric([], 0 if manager.degraded else 1)
        yield up
        gpus = GaugeMetricFamily("corral_gpus", "GPUs in the cluster.")
        gpus.add_metric([], manager.cluster.total_gpus)
        yield gpus
        offline = GaugeMetricFamily(
            "corral_gpus_offline",
            "GPUs held out of allocation: on nodes that left the cluster, or still used by "
            "processes an ended attempt left behind.",
        )
        offline.add_metric([], len(manager.offline_gpus()))
        yield offline
        last_round = GaugeMetricFamily(
            "corral_last_round_timestamp_seconds",
            "When the latest scheduling round ran (Unix time; 0 before the first): one runs at "
            "least every few seconds, also when idle, so an old value means a stuck control "
            "loop or a store it cannot write to.",
        )
        last_round.add_metric([], manager.last_round_at or 0.0)
        yield last_round
        yield from leader_metrics(manager)

    def _from_store(self) -> Iterator[Metric]:
        """The gauges read from the store (none while it is unavailable: StoreUnavailable)."""
        manager = self.manager
        states = GaugeMetricFamily(
            "corral_jobs", "Jobs by state (every state, 0 when none is in it).", labels=["state"]
        )
        counts = dict.fromkeys((status.value for status in JobStatus), 0)
        counts.update(manager.store.job_counts())
        for state, number in sorted(counts.items()):
            states.add_metric([state], number)
        rates = GaugeMetricFamily(
            "corral_job_steps_per_second",
            "Steps per second each running job reports (over its latest minute of reports).",
            labels=["job_id", "name", "vc"],
        )
        steps = GaugeMetricFamily(
            "corral_job_step",
            "The latest step each running job reported.",
            labels=["job_id", "name", "vc"],
        )
        for row in manager.store.list_jobs(status="RUNNING"):
            if row.progress is None:
                continue
            labels = [row.id, row.name, row.vc]
            steps.add_metric(labels, row.progress.step)
            if row.progress.steps_per_s is not None:
                rates.add_metric(labels, row.progress.steps_per_s)
        yield states  # (all read before any is yielded: none half-filled)
        yield rates
        yield steps


def leader_metrics(manager: Manager) -> Iterator[Metric]:
    """The role, the lease's age and the failovers of a manager that shares its database with
    standbys (docs/ha.md); a manager alone (SQLite) is always the leader, with no lease (its
    lease's age, epoch and failovers 0)."""
    lease = manager.lease
    role = GaugeMetricFamily(
        "corral_manager_leader",
        "1 while this manager leads (it schedules and writes), 0 for a standby.",
    )
    role.add_metric([], 1 if lease is None or lease.valid() else 0)
    yield role
    age = GaugeMetricFamily(
        "corral_lease_age_seconds",
        "Seconds since this manager last renewed its lease (a standby takes over past the "
        "lease's length).",
    )
    age.add_metric([], 0.0 if lease is None else lease.age_s() or 0.0)
    yield age
    epoch = GaugeMetricFamily(
        "corral_lease_epoch",
        "The lease's epoch, its fencing token: one more at each change of leader.",
    )
    epoch.add_metric([], 0 if lease is None else lease.epoch or 0)
    yield epoch
    failovers = CounterMetricFamily(
        "corral_failovers",
        "Times this manager took over from another one whose lease lapsed.",
    )
    failovers.add_metric([], 1 if lease is not None and lease.took_over_from is not None else 0)
    yield failovers


def metrics_text(manager: Manager) -> tuple[bytes, str]:
    return manager.metrics.text()
