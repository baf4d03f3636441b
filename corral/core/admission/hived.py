"""HiveD admission: each VC schedules inside its own guaranteed cells; idle GPUs are harvested.

Every VC has a `Scheduler` over its virtual cluster (its cells, topology intact), with the chosen
ordering policy and placement: its guaranteed jobs never compete with other VCs' guaranteed jobs.
When a VC starts a job on a virtual cell that is not bound yet, a physical cell of that type is
bound with buddy allocation (`CellAllocator`), preferring the cell where the least opportunistic
work would be lost; when a top-level virtual cell empties, its physical cell is released and
merges back with its buddies.

Opportunistic jobs (HiveD's priority -1, PilotFish's harvesting) have their own `Scheduler` over
the physical cluster: they run on any GPU no guaranteed job holds, including idle GPUs inside
other VCs' cells, and are preempted through the checkpoint contract when a guaranteed job needs
their GPUs. With `spill`, a guaranteed job that its VC cannot place yet runs the same way on idle
GPUs (lent, as a quota's oversubscription lends them) and goes back to its VC's queue whenever it
is waiting again: a VC's own cells always come first, and lending never delays another VC.

The live manager drives the same object: after a restart it `adopt`s the waiting jobs and
`restore_running`s the ones found running, which binds the VCs' cells again from the physical GPUs.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from corral.core.actions import Action, Decision, Preempt, Start
from corral.core.admission.base import AdmissionScheme, Assembly
from corral.core.admission.hived_options import HivedOptions as HivedOptions
from corral.core.cells import CellAllocator
from corral.core.cluster import Cell, Cluster
from corral.core.job import Job, JobSpec, JobStatus, Priority
from corral.core.placement.base import Placement
from corral.core.plugin import PluginError, SpeedModel
from corral.core.policy.base import Policy
from corral.core.precheck import precheck_problem
from corral.core.protocol import Admission, SchedulerCore
from corral.core.refusal import refuse_new, worker_refusal
from corral.core.reservations import Reservation, ReservationError
from corral.core.retry import FailureReport, RetryRule
from corral.core.scheduler import Scheduler
from corral.core.vcluster import VirtualCluster, build_virtual_cluster

#: The name under which opportunistic jobs are reported (they belong to no VC's guarantee).
OPPORTUNISTIC = "opportunistic"


class HivedScheduler:
    """The scheduler interface (`submit`, `decide`, `finished`, `failed`, `cancel`) over VCs."""

    name = "hived"

    def __init__(
        self,
        cluster: Cluster,
        virtual_clusters: dict[str, dict[str, int]],
        policy: Policy,
        placement: Placement,
        *,
        speed_model_for: Callable[[Cluster], SpeedModel] | None = None,
        restore_s: float = 0.0,
        backfill: str | bool = False,
        spill: bool = False,
        retry: RetryRule | None = None,
        precheck_s: float | None = None,
        admissions: Sequence[Admission] = (),
        preempt_exempt_s: float = 0.0,
    ) -> None:
        """`precheck_s`: the pre-run of jobs whose spec names none (corral.core.precheck),
        run by each VC's scheduler and the opportunistic one alike; `admissions`: chained
        after HiveD's own, consulted by each of them alike (the same objects, so that what
        they count is counted over all VCs)."""
        self.cluster = cluster
        self.spill = spill
        self._spilled: dict[str, str] = {}  # guaranteed job lent out -> its VC
        # virtual GPUs a VC cannot use: on a dead node of a bound cell, or in a top-level cell
        # that no healthy physical cell is left to bind
        self._virtual_offline: dict[tuple[str, int], list[int]] = {}
        self._dead_nodes: set[int] = set()
        #: physical GPUs held offline -> (VC, virtual GPU) where a VC has them bound
        self._held: dict[int, tuple[str, int] | None] = {}
        self.policy = policy
        self.placement = placement
        self.allocator = CellAllocator(cluster)
        self.vcs: dict[str, VirtualCluster] = {}
        self.schedulers: dict[str, Scheduler] = {}

        def scheduler_for(target: Cluster) -> Scheduler:
            speed = speed_model_for(target) if speed_model_for is not None else None
            return Scheduler(
                target,
                policy,
                placement,
                backfill=backfill,
                speed_model=speed,
                restore_s=restore_s,
                retry=retry,
                precheck_s=precheck_s,
                admission=admissions,
                preempt_exempt_s=preempt_exempt_s,
            )

        for name in sorted(virtual_clusters):
            vc = build_virtual_cluster(name, virtual_clusters[name], cluster)
            self.vcs[name] = vc
            self.schedulers[name] = scheduler_for(vc.cluster)
        self.opportunistic = scheduler_for(cluster)
        self.jobs: dict[str, Job] = {}
        self._owner: dict[str, str] = {}  # job id -> VC name, or OPPORTUNISTIC
        self._opportunistic_on: dict[int, str] = {}  # physical GPU -> opportunistic job id
        self.rounds = 0
        self.reclaims = 0

    # -- the scheduler interface ------------------------------------------------------------

    @property
    def preemptions(self) -> int:
        return self.opportunistic.preemptions + sum(s.preemptions for s in self.schedulers.values())

    @property
    def pending_count(self) -> int:
        return self.opportunistic.pending_count + sum(
            s.pending_count for s in self.schedulers.values()
        )

    @property
    def running_count(self) -> int:
        return self.opportunistic.running_count + sum(
            s.running_count for s in self.schedulers.values()
        )

    def refusal(self, spec: JobSpec) -> str | None:
        """Why `submit` would refuse this job, or None: an unknown VC, or more GPUs (or larger
        workers) than the VC's cells (than the cluster, for an opportunistic job) could hold.
        Depends on the shapes only."""
        problem = precheck_problem(spec.precheck_s) or self.opportunistic.admission.refusal(spec)
        if problem is not None:
            return problem
        if spec.priority is Priority.OPPORTUNISTIC:
            return self.opportunistic.refusal(spec)
        scheduler = self.schedulers.get(spec.vc)
        if scheduler is None:
            return f"unknown VC {spec.vc!r}; VCs are {', '.join(self.schedulers)}"
        if spec.gpus <= 0:
            return scheduler.refusal(spec)
        capacity = scheduler.cluster.capacity_for(spec.gpu_types)
        if spec.gpus > capacity:
            return (
                f"asks for {spec.gpus} GPUs but VC {spec.vc} is guaranteed only {capacity} GPUs "
                "that could hold it"
            )
        return worker_refusal(scheduler.cluster, spec, f" in VC {spec.vc}")

    def submit(self, spec: JobSpec, now: float) -> Job:
        refuse_new(self.jobs, spec, self.refusal(spec))
        owner = self._home(spec)
        job = self._scheduler_for(owner).submit(spec, now)
        self.jobs[spec.id] = job
        self._owner[spec.id] = owner
        return job

    def adopt(self, job: Job, now: float) -> None:
        """Queue a waiting job with its history (after a restart): in its VC's queue, or the
        opportunistic one for an opportunistic job."""
        refuse_new(self.jobs, job.spec, self.refusal(job.spec))
        owner = self._home(job.spec)
        self._scheduler_for(owner).adopt(job, now)
        self.jobs[job.id] = job
        self._owner[job.id] = owner

    def withdraw(self, job_id: str, now: float) -> Job:
        """Take a job out (see SchedulerCore.withdraw): a running one through its scheduler,
        its cells given back as at any stop; adopted again, it goes to its own VC's queue."""
        job = self.jobs[job_id]
        self._spilled.pop(job_id, None)
        if job.status is JobStatus.RUNNING:
            self._stopped(job_id, lambda scheduler: scheduler.withdraw(job_id, now))
        else:
            self._scheduler_of(job_id).withdraw(job_id, now)
        del self.jobs[job_id]
        del self._owner[job_id]
        return job

    def restore_running(
        self, job_id: str, gpus: tuple[int, ...], started_at: float, now: float
    ) -> Job:
        """After a restart: an adopted job is in fact running on these physical GPUs.

        A guaranteed job runs in its VC's cells if its GPUs lie in cells the VC holds, or in
        free cells that buddy allocation could have bound to the VC (those are bound now); else
        it was lent idle GPUs and runs as opportunistic work, reclaimed when their owner needs
        them. Jobs are restored in the order given: the first ones found get the VC's cells.
        """
        job = self.jobs[job_id]
        if job.status is not JobStatus.PENDING:
            raise ValueError(f"job {job_id} is {job.status.value}, not PENDING")
        busy = [g for g in gpus if not self.cluster.gpu_free[g]]
        if busy:
            names = ", ".join(self.cluster.gpus[g].name for g in busy)
            raise ValueError(f"job {job_id}: GPUs {names} are already in use")
        owner = self._owner[job_id]
        if owner != OPPORTUNISTIC:
            vc = self.vcs[owner]
            virtual = self._bind_for_restore(vc, gpus)
            if virtual is not None:
                self.schedulers[owner].restore_running(job_id, virtual, started_at, now)
                self.cluster.allocate(gpus)
                return job
            self.opportunistic.adopt(self.schedulers[owner].withdraw(job_id, now), now)
            self._owner[job_id] = OPPORTUNISTIC
            self._spilled[job_id] = owner
        self.opportunistic.restore_running(job_id, gpus, started_at, now)
        for gpu in gpus:
            self._opportunistic_on[gpu] = job_id
        return job

    def decide(self, now: float) -> Decision:
        """Each VC first starts what fits its free cells. With lending, the jobs a VC cannot
        place then try idle GPUs anywhere, and only those still waiting preempt their VC's own
        lower-priority jobs: no job is preempted inside a VC while GPUs that fit stand idle."""
        self.rounds += 1
        actions: list[Action] = []
        wakes: list[float] = []

        def take(decision: Decision, vc: VirtualCluster | None) -> None:
            if decision.wake_at is not None:
                wakes.append(decision.wake_at)
            for action in decision.actions:
                if vc is None:
                    self._track_opportunistic(action)
                    actions.append(action)
                elif isinstance(action, Preempt):
                    actions.append(self._release_guaranteed(vc, action, now))
                else:
                    actions.extend(self._start_guaranteed(vc, action, now))

        def vc_round(preempt: bool) -> None:
            for name, scheduler in self.schedulers.items():
                take(scheduler.decide(now, preempt=preempt), self.vcs[name])

        if self.spill:
            vc_round(preempt=False)
            self._lend_idle_gpus(now)
            take(self.opportunistic.decide(now), None)
            self._return_waiting(now)
        vc_round(preempt=True)
        take(self.opportunistic.decide(now), None)
        if self._spilled:
            self._return_waiting(now)
        return Decision(actions, min(wakes) if wakes else None)

    # Waiting guaranteed jobs looked at per VC and round when lending idle GPUs.
    LEND_LOOKAHEAD = 1024

    def _lend_idle_gpus(self, now: float) -> None:
        """Offer idle GPUs to the guaranteed jobs their VCs cannot place now, head first."""
        idle = self.cluster.free_gpus
        for name, scheduler in self.schedulers.items():
            if idle <= 0:
                return
            for job in list(itertools.islice(scheduler.pending_jobs(), self.LEND_LOOKAHEAD)):
                if job.spec.gpus > idle or job.hold_until > now:  # held: its retry backoff
                    continue
                idle -= job.spec.gpus
                self.opportunistic.adopt(scheduler.withdraw(job.id, now), now)
                self._owner[job.id] = OPPORTUNISTIC
                self._spilled[job.id] = name

    def _return_waiting(self, now: float) -> None:
        """Lent jobs that wait again (not placed, or evicted) go back to their VC's queue."""
        for job_id, name in list(self._spilled.items()):
            job = self.jobs[job_id]
            if job.status is JobStatus.PENDING:
                self.schedulers[name].adopt(self.opportunistic.withdraw(job_id, now), now)
                self._owner[job_id] = name
                del self._spilled[job_id]
            elif job.status.finished:
                del self._spilled[job_id]

    def finished(self, job_id: str, now: float) -> Job:
        return self._stopped(job_id, lambda scheduler: scheduler.finished(job_id, now))

    def failed(self, job_id: str, now: float, report: FailureReport | str) -> Job:
        """As `Scheduler.failed`; a lent job that will retry goes back to its VC's queue."""
        return self._stopped(job_id, lambda scheduler: scheduler.failed(job_id, now, report))

    def progressed(self, job_id: str, now: float) -> Preempt | None:
        """As `Scheduler.progressed`: a pre-run that passed is stopped (its physical GPUs are
        given back, its VC's idle cells unbound) and the job waits in its queue for its gang; a
        lent job in its pre-run goes back to its VC's queue, as a lent job that waits again."""
        job = self.jobs[job_id]
        if job.status is not JobStatus.RUNNING:
            return None
        owner = self._owner[job_id]
        placement = job.placement
        stop = self._scheduler_of(job_id).progressed(job_id, now)
        if stop is None:
            return None
        physical = self.physical_placement_of(owner, placement)
        self._after_stop(owner, job_id, placement)
        return replace(stop, gpus=physical)

    def cancel(self, job_id: str, now: float) -> Job:
        if self.jobs[job_id].status is not JobStatus.RUNNING:
            return self._scheduler_of(job_id).cancel(job_id, now)
        return self._stopped(job_id, lambda scheduler: scheduler.cancel(job_id, now))

    def explain(self, job_id: str, now: float) -> str:
        owner = self._owner[job_id]
        where = "opportunistic, on idle GPUs of any VC" if owner == OPPORTUNISTIC else f"VC {owner}"
        return f"{where}: {self._scheduler_of(job_id).explain(job_id, now)}"

    def pending_jobs(self) -> Iterator[Job]:
        """Waiting jobs: each VC's queue in policy order, then the opportunistic queue."""
        for scheduler in self._all_schedulers():
            yield from scheduler.pending_jobs()

    def running_jobs(self) -> Iterator[Job]:
        for scheduler in self._all_schedulers():
            yield from scheduler.running_jobs()

    def physical_placement(self, job_id: str) -> tuple[int, ...]:
        return self.physical_placement_of(self._owner[job_id], self.jobs[job_id].placement)

    def physical_placement_of(self, owner: str, placement: tuple[int, ...]) -> tuple[int, ...]:
        """The physical GPUs of a placement in the scheduler of `owner` (a VC, or opportunistic)."""
        if owner == OPPORTUNISTIC or not placement:
            return placement
        return self.vcs[owner].to_physical(placement)

    def vc_of(self, job_id: str) -> str:
        return self._owner[job_id]

    # -- guaranteed jobs: virtual -> physical -------------------------------------------------

    def _start_guaranteed(self, vc: VirtualCluster, action: Start, now: float) -> list[Action]:
        actions: list[Action] = []
        for top in vc.tops_of(action.gpus):
            if top not in vc.bound and not self._bind(vc, top, now):
                # Dead nodes left no healthy cell of this type: the job waits again, and the
                # VC does not use this virtual cell until a node recovers.
                scheduler = self.schedulers[vc.name]
                scheduler.evict(action.job_id, now, "no healthy cell to bind")
                self._unbind_idle(vc, action.gpus)
                offline = [g for g, (t, _) in enumerate(vc.gpu_home) if t == top]
                scheduler.take_offline(offline)
                self._virtual_offline[(vc.name, top)] = offline
                return actions
        physical = vc.to_physical(action.gpus)
        for victim_id in sorted(
            {self._opportunistic_on[g] for g in physical if g in self._opportunistic_on}
        ):
            actions.append(self._evict_opportunistic(victim_id, action.job_id, now))
        self.cluster.allocate(physical)
        actions.append(replace(action, gpus=physical))
        return actions

    def _release_guaranteed(self, vc: VirtualCluster, action: Preempt, now: float) -> Preempt:
        physical = vc.to_physical(action.gpus)
        self.cluster.release(physical)
        self._unbind_idle(vc, action.gpus)
        return replace(action, gpus=physical)

    def _bind(self, vc: VirtualCluster, top: int, now: float) -> bool:
        cell_type = vc.top_types[top]

        def work_at_risk(cell: Cell) -> tuple[float, int]:
            """Opportunistic GPU-seconds of the current attempts a binding would preempt."""
            lost = 0.0
            busy = 0
            for victim_id in {
                self._opportunistic_on[leaf.index]
                for leaf in cell.leaves()
                if leaf.index in self._opportunistic_on
            }:
                victim = self.jobs[victim_id]
                lost += victim.spec.gpus * victim.running_s(now)
                busy += victim.spec.gpus
            return (lost, busy)

        if self._dead_nodes and self._spare_cells(vc.name, cell_type) < 1:
            return False  # the healthy cells left are other VCs' guarantees
        cell = self.allocator.bind(cell_type, prefer=work_at_risk)
        if cell is None:  # only when dead nodes took the last healthy cells of the type
            return False
        vc.bound[top] = (cell, [leaf.index for leaf in cell.leaves()])
        return True

    def _bind_for_restore(
        self, vc: VirtualCluster, physical: tuple[int, ...]
    ) -> tuple[int, ...] | None:
        """The VC's virtual GPUs for a job found running on these physical GPUs, binding free
        cells as needed; None (nothing bound) when the GPUs do not fit the VC's cells."""
        home = {where: virtual for virtual, where in enumerate(vc.gpu_home)}
        newly_bound: list[int] = []
        virtual: list[int] = []
        for gpu in physical:
            found = self._virtual_gpu(vc, gpu, home)
            if found is None:
                top = self._bind_containing(vc, gpu)
                if top is not None:
                    newly_bound.append(top)
                    found = self._virtual_gpu(vc, gpu, home)
            if found is None or not vc.cluster.gpu_free[found]:
                for top in newly_bound:
                    cell, _ = vc.bound.pop(top)
                    self.allocator.release(cell)
                return None
            virtual.append(found)
        return tuple(virtual)

    @staticmethod
    def _virtual_gpu(vc: VirtualCluster, gpu: int, home: dict[tuple[int, int], int]) -> int | None:
        """The virtual GPU that a bound top cell of the VC maps to this physical GPU."""
        for top, (_, cell_gpus) in vc.bound.items():
            if gpu in cell_gpus:
                return home[(top, cell_gpus.index(gpu))]
        return None

    def _bind_containing(self, vc: VirtualCluster, gpu: int) -> int | None:
        """Bind an unbound top cell of the VC to the physical cell of its type that holds this
        GPU, if buddy allocation could have chosen that cell now (a free cell of the type, or
        split from the nearest bigger free cell when none is free). A cell taken out of that
        order could split the big cells other VCs are guaranteed: then the job counts as lent."""
        leaf = self.cluster.gpus[gpu]
        for top, cell_type in enumerate(vc.top_types):
            if top in vc.bound:
                continue
            target: Cell | None = leaf
            while target is not None and target.cell_type != cell_type:
                target = target.parent
            if target is None:
                continue
            # Among the choices the allocator may make, ask for the cell on the GPU's path.
            cell = self.allocator.bind(cell_type, prefer=_towards(target))
            if cell is None:
                continue
            if cell is not target:  # not a choice buddy allocation had: undo it
                self.allocator.release(cell)
                continue
            vc.bound[top] = (cell, [g.index for g in cell.leaves()])
            return top
        return None

    def _unbind_idle(self, vc: VirtualCluster, virtual_gpus: Iterable[int]) -> None:
        """Release the physical cells of top-level virtual cells that hold no job any more; a
        cell with a dead node is given back too, so the next binding lands on a healthy one."""
        for top in vc.tops_of(tuple(virtual_gpus)):
            if top not in vc.bound:
                continue
            offline = self._virtual_offline.get((vc.name, top), [])
            cell_free = vc.cluster.root.children[top].free_gpus
            if cell_free + len(offline) < vc.cluster.root.children[top].total_gpus:
                continue
            cell, _ = vc.bound[top]
            if (
                not self.allocator.is_healthy(cell)
                and self._spare_cells(vc.name, vc.top_types[top]) < 1
            ):
                continue  # no healthy cell to move to that is not another VC's guarantee
            if offline:
                self.schedulers[vc.name].bring_online(offline)
                del self._virtual_offline[(vc.name, top)]
            cell, _ = vc.bound.pop(top)
            self.allocator.release(cell)

    # -- node failures ----------------------------------------------------------------------

    def node_failed(self, node: int, now: float) -> list[Job]:
        """A physical node died: its attempts end as infrastructure failures and are requeued,
        its GPUs leave allocation, and VC bindings move off it as soon as their cells are idle."""
        dead = set(self.cluster.node_gpus[node])
        self._dead_nodes.add(node)
        unhealthy = self.allocator.mark_unhealthy(self.cluster.nodes[node])
        reason = f"node {self.cluster.nodes[node].name} failed"
        hit: list[Job] = []
        for name, vc in self.vcs.items():
            scheduler = self.schedulers[name]
            for job in list(scheduler.running_jobs()):
                physical = vc.to_physical(job.placement)
                if dead.intersection(physical):
                    virtual = job.placement
                    scheduler.failed(job.id, now, FailureReport(reason, infrastructure=True))
                    self.cluster.release(physical)
                    self._unbind_idle(vc, virtual)
                    hit.append(job)
        hit.extend(self.opportunistic.node_failed(node, now))
        self._opportunistic_on = {
            g: j
            for g, j in self._opportunistic_on.items()
            if self.jobs[j].status is JobStatus.RUNNING
        }
        for cell in unhealthy:
            for name, vc in self.vcs.items():
                for top, (bound_cell, cell_gpus) in list(vc.bound.items()):
                    if bound_cell is not cell:
                        continue
                    offline = [
                        v
                        for v, (t, k) in enumerate(vc.gpu_home)
                        if t == top and cell_gpus[k] in dead
                    ]
                    self.schedulers[name].take_offline(offline)
                    self._virtual_offline[(name, top)] = offline
                    self._unbind_idle(vc, offline)
        return hit

    def evict_node(self, node: int, now: float, by: str) -> list[Preempt]:
        """Preempt the attempts whose physical GPUs lie on the node (an operator's drain): each
        through its scheduler, its cells given back as at any stop."""
        on_node = set(self.cluster.node_gpus[node])
        stops: list[Preempt] = []
        for job_id, job in list(self.jobs.items()):
            if job.status is not JobStatus.RUNNING:
                continue
            owner = self._owner[job_id]
            if not on_node.intersection(self.physical_placement_of(owner, job.placement)):
                continue
            if owner == OPPORTUNISTIC:
                stop = self._evict_opportunistic(job_id, by, now)
            else:
                vc = self.vcs[owner]
                stop = self._release_guaranteed(
                    vc, self.schedulers[owner].evict(job_id, now, by), now
                )
            stops.append(stop)
        return stops

    def _spare_cells(self, vc_name: str, cell_type: str) -> int:
        """Free healthy cells of a type beyond what the other VCs may still bind of it (cells
        inside bigger free cells are not counted: a conservative bound while nodes are dead)."""
        reserved = 0
        for name, vc in self.vcs.items():
            if name != vc_name:
                bound = sum(1 for top in vc.bound if vc.top_types[top] == cell_type)
                reserved += vc.top_types.count(cell_type) - bound
        return len(self.allocator.free_cells(cell_type)) - reserved

    def node_recovered(self, node: int) -> None:
        self._dead_nodes.discard(node)
        if not any(self.cluster.gpu_node[g] == node for g in self._held):
            self.allocator.mark_healthy(self.cluster.nodes[node])
        self.opportunistic.node_recovered(node)
        self._virtual_back(set(self.cluster.node_gpus[node]))

    def _virtual_back(self, back: set[int]) -> None:
        """VCs' virtual cells held out for want of a healthy cell may bind again."""
        for (name, top), offline in list(self._virtual_offline.items()):
            vc = self.vcs[name]
            unbound = top not in vc.bound
            if unbound or any(vc.bound[top][1][vc.gpu_home[v][1]] in back for v in offline):
                self.schedulers[name].bring_online(offline)
                del self._virtual_offline[(name, top)]

    def reserve(self, reservation: Reservation) -> None:
        raise ReservationError(
            "reservations: not with admission hived (each VC schedules on its own virtual cluster)"
        )

    def unreserve(self, name: str) -> Reservation:
        raise ReservationError(f"name: no reservation {name!r}")

    def take_offline(self, gpus: Iterable[int]) -> None:
        """Hold free physical GPUs out of allocation (a node leaving, processes that would not
        end): taken in the physical cluster, in the VC that has them bound, and their node is not
        bound anew until every one of them is back."""
        for gpu in gpus:
            if gpu in self._held or not self.cluster.gpu_free[gpu]:
                continue
            node = self.cluster.gpu_node[gpu]
            self.allocator.mark_unhealthy(self.cluster.nodes[node])  # idempotent
            self.cluster.allocate([gpu])
            self._held[gpu] = None
            for name, vc in self.vcs.items():
                for top, (_, cell_gpus) in vc.bound.items():
                    if gpu in cell_gpus:
                        virtual = vc.gpu_home.index((top, cell_gpus.index(gpu)))
                        self.schedulers[name].take_offline([virtual])
                        self._held[gpu] = (name, virtual)

    def bring_online(self, gpus: Iterable[int]) -> None:
        nodes: set[int] = set()
        for gpu in gpus:
            if gpu not in self._held:
                continue
            home = self._held.pop(gpu)
            if home is not None:
                self.schedulers[home[0]].bring_online([home[1]])
            self.cluster.release([gpu])
            nodes.add(self.cluster.gpu_node[gpu])
        held_nodes = {self.cluster.gpu_node[g] for g in self._held}
        healthy = nodes - held_nodes - self._dead_nodes
        for node in healthy:
            self.allocator.mark_healthy(self.cluster.nodes[node])
        if healthy:
            self._virtual_back({g for node in healthy for g in self.cluster.node_gpus[node]})

    def counters(self) -> dict[str, int]:
        counters = {"preemptions": self.preemptions, "reclaims": self.reclaims}
        for name in ("prechecks", "precheck_passed", "precheck_failed"):
            counters[name] = sum(s.counters()[name] for s in self._all_schedulers())
        counters.update(self.opportunistic.admission.counters())  # the chained ones, shared
        return counters

    # -- opportunistic jobs -----------------------------------------------------------------

    def _evict_opportunistic(self, job_id: str, by: str, now: float) -> Preempt:
        job = self.jobs[job_id]
        for gpu in job.placement:
            self._opportunistic_on.pop(gpu, None)
        self.reclaims += 1
        return self.opportunistic.evict(job_id, now, by)

    def _track_opportunistic(self, action: Action) -> None:
        if isinstance(action, Start):
            for gpu in action.gpus:
                self._opportunistic_on[gpu] = action.job_id
        else:
            for gpu in action.gpus:
                self._opportunistic_on.pop(gpu, None)

    # -- endings ----------------------------------------------------------------------------

    def _scheduler_of(self, job_id: str) -> Scheduler:
        return self._scheduler_for(self._owner[job_id])

    def _scheduler_for(self, owner: str) -> Scheduler:
        return self.opportunistic if owner == OPPORTUNISTIC else self.schedulers[owner]

    @staticmethod
    def _home(spec: JobSpec) -> str:
        """Where a new or adopted job waits: its VC's queue, or the opportunistic one."""
        return OPPORTUNISTIC if spec.priority is Priority.OPPORTUNISTIC else spec.vc

    def _all_schedulers(self) -> list[Scheduler]:
        return [*self.schedulers.values(), self.opportunistic]

    def _stopped(self, job_id: str, stop: Callable[[Scheduler], object]) -> Job:
        """End a running attempt through its scheduler, then give back what it held."""
        job = self.jobs[job_id]
        placement = job.placement
        owner = self._owner[job_id]
        stop(self._scheduler_of(job_id))
        self._after_stop(owner, job_id, placement)
        return job

    def _after_stop(self, owner: str, job_id: str, placement: tuple[int, ...]) -> None:
        job = self.jobs[job_id]
        if job_id in self._spilled and job.status is JobStatus.PENDING:
            # a lent job that failed and will retry: back to its VC's queue
            name = self._spilled.pop(job_id)
            for gpu in placement:
                self._opportunistic_on.pop(gpu, None)
            self.schedulers[name].adopt(
                self.opportunistic.withdraw(job_id, job.queued_since), job.queued_since
            )
            self._owner[job_id] = name
            return
        if owner == OPPORTUNISTIC:
            for gpu in placement:
                self._opportunistic_on.pop(gpu, None)
            return
        vc = self.vcs[owner]
        self.cluster.release(vc.to_physical(placement))
        self._unbind_idle(vc, placement)


def _towards(target: Cell) -> Callable[[Cell], bool]:
    """A `prefer` key for CellAllocator.bind that puts the target and the cells holding it first."""
    on_path: set[Cell] = set()
    up: Cell | None = target
    while up is not None:
        on_path.add(up)
        up = up.parent
    return lambda cell: cell not in on_path


# -- the admission scheme (corral.core.admission.ADMISSIONS) ------------------------------------


class Hived(AdmissionScheme):
    name = "hived"
    summary = "HiveD: each VC owns cells that keep their topology; idle cells are lent"
    Options = HivedOptions
    picks_victims = True
    stages = frozenset()
    why_not = {
        "packing": "each VC schedules on its own virtual cluster",
        "migration": "each VC schedules on its own virtual cluster",
        "cache": "each VC schedules on its own virtual cluster",
    }

    @classmethod
    def unsupported_placement(cls, options: Any, placement: str) -> str | None:
        if placement == "hetero" and options.lend:
            # A lent job the lender's matching would not place bounces back every round.
            return "placement hetero does not run with admission hived lending (hived.lend false)"
        return None

    @classmethod
    def build(cls, options: Any, parts: Assembly) -> SchedulerCore:
        services = parts.services
        if not any(services.vc_cells.values()):
            raise PluginError(
                "admission hived: the VCs need guaranteed cells (a cluster config with "
                "virtual_clusters)"
            )
        return HivedScheduler(
            services.cluster,
            services.vc_cells,
            parts.policy,
            parts.placement,
            speed_model_for=services.speed_model_for,
            restore_s=parts.restore_s,
            backfill=parts.backfill,
            spill=options.lend,
            retry=parts.retry,
            precheck_s=parts.precheck_s,
            admissions=parts.admissions,
            preempt_exempt_s=parts.preempt_exempt_s,
        )
