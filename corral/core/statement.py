"""Tentative moves, committed or discarded as a whole (Volcano's Statement).

A search for preemption victims frees their GPUs one by one in the cluster and asks the placement
whether the waiting job fits now: the frees are tentative. If the job fits, the statement is
committed (the victims whose GPUs the start uses are preempted, the others take their GPUs back);
if not, it is discarded (every victim takes its GPUs back). Either way each take-back happens in
the order the GPUs were freed, so that the cluster's history, which orders its buckets and so
the nodes placements meet, is the same as if the moves had been made one by one.

`claim` and `unclaim` are what a running job holds in the cluster: its GPUs (whole, or its share
of one) and its CPU and memory on its node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corral.core.cluster import Cluster
    from corral.core.job import Job


def claim(cluster: Cluster, job: Job, gpus: tuple[int, ...], node: int) -> None:
    """Take what the job asks for: its GPUs (whole, or its share of one) and its CPU and memory
    on `node` (the node of its GPUs unless it has none)."""
    spec = job.spec
    if spec.plain:
        cluster.allocate(gpus)
        job.node = -1
        return
    if node < 0 and gpus:
        node = cluster.gpu_node[gpus[0]]
    cluster.claim(gpus, spec.gpu_milli, node, spec.cpu_milli, spec.memory_mib)
    job.node = node


def unclaim(cluster: Cluster, job: Job) -> None:
    """Give back what the running job holds (it keeps `placement` and `node`)."""
    spec = job.spec
    if spec.plain:
        cluster.release(job.placement)
    else:
        cluster.unclaim(job.placement, spec.gpu_milli, job.node, spec.cpu_milli, spec.memory_mib)


class Statement:
    """Running jobs whose GPUs were freed tentatively, in the order they were."""

    __slots__ = ("cluster", "freed")

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.freed: list[Job] = []

    def __len__(self) -> int:
        return len(self.freed)

    def free(self, job: Job) -> None:
        """Free what the running job holds, until the statement is committed or discarded."""
        unclaim(self.cluster, job)
        self.freed.append(job)

    def free_each(self, jobs: list[Job]) -> None:
        """`free` each of the jobs in turn (whole GPUs in one pass, `Cluster.release_each`)."""
        if all(job.spec.plain for job in jobs):
            self.cluster.release_each([job.placement for job in jobs])
            self.freed += jobs
        else:
            for job in jobs:
                self.free(job)

    def discard(self) -> None:
        """Every job freed takes back what it held."""
        _take_back(self.cluster, self.freed)
        self.freed.clear()

    def commit(self, used: Callable[[Job], bool], stop: Callable[[Job], None]) -> None:
        """The frees a start needs become final: each job freed that `used` says the start
        uses is stopped (`stop`, whose GPUs are free already), each other one takes back what it
        held, in the order they were freed (those between two stops in one pass)."""
        back: list[Job] = []
        for job in self.freed:
            if used(job):
                if back:
                    _take_back(self.cluster, back)
                    back = []
                stop(job)
            else:
                back.append(job)
        if back:
            _take_back(self.cluster, back)
        self.freed.clear()

    def commit_among(
        self, jobs: list[Job], used: Callable[[Job], bool], stop: Callable[[Job], None]
    ) -> None:
        """`commit`, where the statement freed some of `jobs` (running jobs of whole GPUs, in
        the order a search met them) and left the others allocated: every job the start uses
        was freed. Each job of `jobs` the start uses is stopped; each other one takes back what
        it held, or keeps it, its nodes moved in their buckets as freeing and taking it back
        would have moved them (`Cluster.allocate_each`): the cluster is left as if the
        statement had freed them all (`Preemption.lowest_first`'s places with room)."""
        freed = {job.seq for job in self.freed}
        back: list[Job] = []
        for job in jobs:
            if job.seq in freed and used(job):  # (the others' GPUs were never free to use)
                if back:
                    _take_back_among(self.cluster, back, freed)
                    back = []
                stop(job)
            else:
                back.append(job)
        if back:
            _take_back_among(self.cluster, back, freed)
        self.freed.clear()


def _take_back_among(cluster: Cluster, jobs: list[Job], freed: set[int]) -> None:
    """Each job takes back what it held if it was freed (by seq), or keeps it (whole GPUs)."""
    cluster.allocate_each([job.placement for job in jobs], [job.seq not in freed for job in jobs])
    for job in jobs:
        job.node = -1  # (as `claim` sets it)


def _take_back(cluster: Cluster, jobs: list[Job]) -> None:
    """Each job freed takes back what it held, in turn (whole GPUs in one pass)."""
    if all(job.spec.plain for job in jobs):
        cluster.allocate_each([job.placement for job in jobs])
        for job in jobs:
            job.node = -1  # (as `claim` sets it)
    else:
        for job in jobs:
            claim(cluster, job, job.placement, job.node)
