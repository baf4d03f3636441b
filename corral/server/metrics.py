"""Prometheus metrics of a Manager, read at scrape time (nothing to keep in step)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.core import Metric

    from corral.server.manager import Manager


class ManagerCollector(Collector):
    def __init__(self, manager: Manager) -> None:
        self.manager = manager

    def collect(self) -> Iterator[Metric]:
        manager = self.manager
        counts = manager.counts_by_vc()
        queue = GaugeMetricFamily(
            "corral_queue_length", "Jobs waiting to run, per VC.", labels=["vc"]
        )
        allocated = GaugeMetricFamily(
            "corral_gpus_allocated", "GPUs held by running jobs, per VC.", labels=["vc"]
        )
        guaranteed = GaugeMetricFamily(
            "corral_gpus_guaranteed", "GPUs each VC is guaranteed.", labels=["vc"]
        )
        for vc, count in sorted(counts.items()):
            queue.add_metric([vc], count["pending"])
            allocated.add_metric([vc], count["gpus"])
            guaranteed.add_metric([vc], manager.vc_quota[vc])
        yield queue
        yield allocated
        yield guaranteed
        states = GaugeMetricFamily("corral_jobs", "Jobs by state.", labels=["state"])
        for state, number in sorted(manager.store.job_counts().items()):
            states.add_metric([state], number)
        yield states
        rates = GaugeMetricFamily(
            "corral_job_steps_per_second",
            "Steps per second each running job reports (over its latest minute of reports).",
            labels=["job", "name", "vc"],
        )
        steps = GaugeMetricFamily(
            "corral_job_step",
            "The latest step each running job reported.",
            labels=["job", "name", "vc"],
        )
        for row in manager.store.list_jobs(status="RUNNING"):
            if row.progress is None:
                continue
            labels = [row.id, row.name, row.vc]
            steps.add_metric(labels, row.progress.step)
            if row.progress.steps_per_s is not None:
                rates.add_metric(labels, row.progress.steps_per_s)
        yield rates
        yield steps
        gpus = GaugeMetricFamily("corral_gpus", "GPUs in the cluster.")
        gpus.add_metric([], manager.cluster.total_gpus)
        yield gpus
        with manager.lock:
            latest = list(manager.round_seconds)
            rounds = manager.rounds
            total = manager.round_seconds_total
        quantiles = SummaryMetricFamily(
            "corral_scheduling_round_seconds",
            "Duration of scheduling rounds (collect ends, decide, record, carry out).",
            count_value=rounds,
            sum_value=total,
        )
        yield quantiles
        if latest:
            for q in (0.5, 0.9, 0.99):
                value = float(np.quantile(latest, q))
                yield GaugeMetricFamily(
                    f"corral_scheduling_round_seconds_p{int(q * 100)}",
                    f"The {int(q * 100)}th percentile of the last 1,000 rounds' durations.",
                    value=value,
                )


def metrics_text(manager: Manager) -> tuple[bytes, str]:
    registry = CollectorRegistry()
    registry.register(ManagerCollector(manager))
    return generate_latest(registry), CONTENT_TYPE_LATEST
