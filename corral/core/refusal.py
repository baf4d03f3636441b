"""Why a job could never run on a cluster: refused at submission, in one line naming the cause.

`Refusals` asks, in order, the job's own request, its pre-run, the admissions' bounds, the
cluster's capacity of the GPU types it accepts, the placement, and whether its workers fit on
nodes. Every answer depends only on the cluster's shape and the admissions' configuration, so a
shell may ask before it stores the job.
"""

from __future__ import annotations

from collections.abc import Mapping

from corral.core.chain import AdmissionChain
from corral.core.cluster import Cluster
from corral.core.job import Job, JobSpec
from corral.core.placement.base import Placement
from corral.core.precheck import precheck_problem


class JobRefused(ValueError):
    """A job that can never run on this cluster."""


def refuse_new(jobs: Mapping[str, Job], spec: JobSpec, refusal: str | None = None) -> None:
    """JobRefused if a job of this id exists already, or for `refusal` (why it could never run)."""
    if spec.id in jobs:
        raise JobRefused(f"job {spec.id}: a job with this id already exists")
    if refusal is not None:
        raise JobRefused(f"job {spec.id}: {refusal}")


def worker_refusal(cluster: Cluster, spec: JobSpec, where: str = "") -> str | None:
    """Why the job's workers could never be placed on `cluster` (`where` names it in the message,
    e.g. " in VC a"), or None: each worker needs `gpus_per_worker` GPUs on one node."""
    unit = spec.gpus_per_worker
    if unit == 1:
        return None
    if unit < 1 or spec.gpus % unit:
        return f"{spec.gpus} GPUs cannot be split into workers of {unit} GPUs"
    largest, room = cluster.worker_room(spec.gpu_types, unit)  # (worked out once per cluster)
    if unit <= largest and spec.gpus <= room:
        return None
    kind = "" if spec.gpu_types is None else f" of type {'|'.join(sorted(spec.gpu_types))}"
    if unit > largest:
        return (
            f"each worker needs {unit} GPUs on one node, but the largest node{kind}{where} has "
            f"{largest} (use more workers)"
        )
    return (
        f"asks for {spec.gpus} GPUs, {unit} per worker on one node, but the nodes{kind}"
        f"{where} can give only {room} GPUs in whole workers"
    )


class Refusals:
    """`refusal(cluster, spec)` for one scheduler's placement and admissions."""

    def __init__(self, placement: Placement, admission: AdmissionChain) -> None:
        self.placement = placement
        self.admission = admission
        self._bounds = admission.having("refusal") or admission.having("capacity")
        self._placement_refuses = type(placement).refusal is not Placement.refusal

    def refusal(self, cluster: Cluster, spec: JobSpec) -> str | None:
        """Why this job could never run on `cluster`, or None."""
        if spec.plain:
            if spec.gpus <= 0:
                return f"gpus must be a positive integer, got {spec.gpus}"
        else:
            problem = spec.request_problem()
            if problem is not None:
                return problem
            if not self.placement.shares:
                return (
                    f"asks for {spec.describe_request()}, but placement {self.placement.name} "
                    "gives whole GPUs only (shares of a GPU, CPU and memory need a placement "
                    "that places them, such as fgd)"
                )
            if self.admission.counts_gpus:
                return (
                    f"asks for {spec.describe_request()}: shares of a GPU, CPU and memory are "
                    f"not supported with admission {self.admission.name}"
                )
        problem = precheck_problem(spec.precheck_s)
        if problem is not None:
            return problem
        capacity = cluster.capacity_for(spec.gpu_types)
        if self._bounds:
            problem = self.admission.refusal(spec)
            if problem is not None:
                return problem
            bound = self.admission.capacity(spec)  # None: no bound of the admissions'
            if bound is not None:
                capacity = min(capacity, bound)
        if spec.gpus > capacity:
            kind = "" if spec.gpu_types is None else f" of type {'|'.join(sorted(spec.gpu_types))}"
            unit = "GPU" if capacity == 1 else "GPUs"
            return f"asks for {spec.gpus} GPUs but the cluster has only {capacity} {unit}{kind}"
        if self._placement_refuses:
            problem = self.placement.refusal(cluster, spec)
            if problem is not None:
                return problem
        return worker_refusal(cluster, spec)
