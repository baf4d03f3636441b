"""A waiting job's search for victims that found no place is remembered until something that could
give it one happens (Preemption.no_room): hand-worked LAS scenarios, and random traces decided
exactly as with a search at every round."""

from __future__ import annotations

from dataclasses import replace

import pytest

from corral.core import Preempt, Priority, Start
from corral.core.admission.hived import HivedScheduler
from corral.core.config import parse_cluster_config
from corral.core.placement import make_placement
from corral.core.policy import make_policy
from corral.core.scheduler import Scheduler
from corral.sim.engine import FailureModel, Simulation
from corral.sim.failures import NodeFailures
from tests.core.helpers import random_trace, scheduler, spec


def _waiting_for_room() -> Scheduler:
    """Two 4-GPU nodes, LAS with one threshold at 100 GPU-s (Tiresias's rule: only a job of a
    higher queue preempts). A (2 GPUs, from 0) reaches 100 GPU-s at 50: queue 1. D (2 GPUs) and
    E (4 GPUs) come at 60, in queue 0 until 110 and 85. At 70, J (4 GPUs, queue 0) needs one
    whole node: it may preempt only A, whose node keeps D, and E's node is full. Its search
    finds too few victims (A's 2 GPUs) and is remembered."""
    s = scheduler(2, 4, "las", policy_options={"thresholds_gpu_s": [100]})
    s.submit(spec("A", 2, submit=0), 0)
    assert s.decide(0).actions == [Start("A", (0, 1))]
    s.submit(spec("D", 2, submit=60), 60)
    s.submit(spec("E", 4, submit=60), 60)
    assert s.decide(60).actions == [Start("D", (2, 3)), Start("E", (4, 5, 6, 7))]
    s.submit(spec("J", 4, submit=70), 70)
    assert s.decide(70).actions == []
    assert s.preemption.no_room == {s.jobs["J"].seq: ("node", "too few victims")}
    return s


def test_a_victim_that_ends_keeps_the_failed_search_and_a_job_it_may_not_preempt_forgets_it():
    s = _waiting_for_room()
    # A, a victim, ends: its 2 GPUs are free, J still finds 2 on node 0 and none on node 1.
    s.finished("A", 72)
    assert s.decide(72).actions == []
    assert s.jobs["J"].seq in s.preemption.no_room
    # D, which J may not preempt, ends: node 0 is free, and J starts there.
    s.finished("D", 75)
    assert s.preemption.no_room == {}
    assert s.decide(75).actions == [Start("J", (0, 1, 2, 3))]


def test_a_running_job_that_drops_below_the_waiting_job_forgets_its_failed_search():
    s = _waiting_for_room()
    # At 85 E reaches 100 GPU-s: queue 1, below J, a victim now. J preempts it, not A (whose
    # node keeps D).
    assert s.decide(85).actions == [Preempt("E", (4, 5, 6, 7), "J"), Start("J", (4, 5, 6, 7))]
    assert s.preemption.no_room == {}


def test_a_node_that_comes_back_forgets_the_failed_searches():
    s = scheduler(2, 4, "las", policy_options={"thresholds_gpu_s": [100]})
    s.node_failed(1, 0)
    s.submit(spec("A", 2, submit=0), 0)
    assert s.decide(0).actions == [Start("A", (0, 1))]
    s.submit(spec("D", 2, submit=60), 60)
    assert s.decide(60).actions == [Start("D", (2, 3))]
    s.submit(spec("J", 4, submit=70), 70)
    assert s.decide(70).actions == []  # node 1 is down: 2 GPUs of victims on node 0 (A's)
    assert s.jobs["J"].seq in s.preemption.no_room
    s.node_recovered(1)
    assert s.decide(71).actions == [Start("J", (4, 5, 6, 7))]


def test_gpus_another_gives_back_on_the_same_cluster_forget_the_failed_searches():
    # As HiveD's opportunistic scheduler shares its cluster with the VCs' jobs: one 4-GPU node,
    # GPUs 2 and 3 held by another (allocated on the cluster directly). A (2 GPUs, from 0) is in
    # queue 1 from 50. J (4 GPUs, queue 0) comes at 60: only A's 2 GPUs to preempt, too few.
    # The other gives GPUs 2 and 3 back at 61, by no event of this scheduler's: J preempts A and
    # takes the node.
    s = scheduler(1, 4, "las", policy_options={"thresholds_gpu_s": [100]})
    s.cluster.allocate([2, 3])
    s.submit(spec("A", 2, submit=0), 0)
    assert s.decide(0).actions == [Start("A", (0, 1))]
    s.submit(spec("J", 4, submit=60), 60)
    assert s.decide(60).actions == []
    assert s.jobs["J"].seq in s.preemption.no_room
    s.cluster.release([2, 3])
    assert s.decide(61).actions == [Preempt("A", (0, 1), "J"), Start("J", (0, 1, 2, 3))]


def test_a_job_that_leaves_the_queue_leaves_no_failed_search_behind():
    s = _waiting_for_room()
    s.cancel("J", 71)
    assert s.preemption.no_room == {} and s.preemption.no_room_keys == []


def test_a_search_that_passed_over_a_job_started_at_that_instant_is_not_remembered():
    # One 4-GPU node, LAS at 100 GPU-s. A (2 GPUs) runs from 0; B (2 GPUs) starts at 60 on the
    # other two. C (4 GPUs, level 1: it may preempt any job of level 0) comes at 60 after that
    # round, and in a second round at 60 finds A's 2 GPUs only: B, started at this instant, is
    # no victim yet. From the next instant on it is one, so that search is not remembered, and
    # at 61 C preempts both.
    s = scheduler(1, 4, "las", policy_options={"thresholds_gpu_s": [100]})
    s.submit(spec("A", 2, submit=0), 0)
    assert s.decide(0).actions == [Start("A", (0, 1))]
    s.submit(spec("B", 2, submit=60), 60)
    assert s.decide(60).actions == [Start("B", (2, 3))]
    s.submit(spec("C", 4, submit=60, level=1), 60)
    assert s.decide(60).actions == []
    assert s.preemption.no_room == {}
    assert s.decide(61).actions == [
        Preempt("A", (0, 1), "C"),
        Preempt("B", (2, 3), "C"),
        Start("C", (0, 1, 2, 3)),
    ]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("policy", "within"), [("las", False), ("las", True), ("gittins", None)])
@pytest.mark.parametrize("placement", ["consolidate", "relax", "yarn", "any"])
def test_remembering_failed_searches_decides_exactly_as_searching_every_time(
    seed: int, policy: str, within: bool | None, placement: str
):
    # Random overloaded traces on 4 nodes x 4 GPUs in 2 racks, where 8-GPU jobs often find no
    # place: every start and preemption, in order and instant, is the same with failed searches
    # remembered and with a search every time.
    if policy == "las":
        options: dict = {"thresholds_gpu_s": [60, 200, 900], "preempt_within_queue": within}
    else:
        history = random_trace(seed + 100, 300)
        options = {"service_samples_gpu_s": [j.gpus * (j.duration_s or 0) for j in history]}
    runs, hits = [], 0
    for remember in (True, False):
        s = scheduler(4, 4, policy, placement=placement, racks=2, policy_options=options)
        s.preemption.remembers = remember
        make_room = s.preemption.make_room

        def counted(job, now, actions, s=s, make_room=make_room):  # type: ignore[no-untyped-def]
            nonlocal hits
            hits += job.seq in s.preemption.no_room  # remembered (under the same scope: most are)
            return make_room(job, now, actions)

        s.preemption.make_room = counted
        result = Simulation(random_trace(seed, 150, 20.0), s, record_decisions=True).run()
        runs.append(result.decisions)
    assert any(isinstance(a, Preempt) for _, a in runs[0])
    assert runs[0] == runs[1]
    assert hits > 0


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("policy", ["las", "gittins"])
def test_remembering_failed_searches_decides_exactly_as_searching_with_nodes_failing(
    seed: int, policy: str
):
    # The same, with nodes that fail (their jobs requeued, their GPUs held) and come back (their
    # GPUs free again) every hour or so, and attempts that fail and retry.
    if policy == "las":
        options: dict = {"thresholds_gpu_s": [60, 200, 900]}
    else:
        history = random_trace(seed + 100, 300)
        options = {"service_samples_gpu_s": [j.gpus * (j.duration_s or 0) for j in history]}
    runs = []
    for remember in (True, False):
        s = scheduler(4, 4, policy, placement="relax", racks=2, policy_options=options)
        s.preemption.remembers = remember
        result = Simulation(
            random_trace(seed, 150, 20.0),
            s,
            failures=FailureModel(rate=0.1, max_retries=3),
            node_failures=NodeFailures(mtbf_s=3_600.0, mttr_s=600.0),
            seed=seed,
            record_decisions=True,
        ).run()
        runs.append(result.decisions)
    assert runs[0] == runs[1]
    assert sum(isinstance(a, Preempt) for _, a in runs[0]) > 10


@pytest.mark.parametrize("seed", range(4))
def test_remembering_failed_searches_decides_exactly_as_searching_under_hived(seed: int):
    # HiveD: each VC's scheduler over its own cells, and the opportunistic jobs' scheduler over
    # the whole cluster, where the VCs' jobs take and give back GPUs without it. Random
    # overloaded traces of guaranteed and opportunistic jobs: the same decisions with failed
    # searches remembered and with a search every time.
    config = {
        "cell_types": {"NODE": {"child": "V100", "count": 4, "node": True}},
        "physical_cells": [{"type": "NODE", "count": 4}],
        "virtual_clusters": {"a": {"NODE": 1}, "b": {"NODE": 1}},
    }
    options = {"thresholds_gpu_s": [60, 200, 900]}
    trace = [
        replace(
            job,
            gpus=min(job.gpus, 4) if i % 3 else job.gpus,
            vc="ab"[i % 2],
            priority=Priority.GUARANTEED if i % 3 else Priority.OPPORTUNISTIC,
        )
        for i, job in enumerate(random_trace(seed, 150, 20.0))
    ]
    runs = []
    for remember in (True, False):
        parsed = parse_cluster_config(config)
        s = HivedScheduler(
            parsed.cluster,
            parsed.virtual_clusters,
            make_policy("las", **options),
            make_placement("consolidate"),
        )
        for inner in [s.opportunistic, *s.schedulers.values()]:
            inner.preemption.remembers = remember
        runs.append(Simulation(trace, s, record_decisions=True).run().decisions)
    assert sum(isinstance(a, Preempt) for _, a in runs[0]) > 10
    assert runs[0] == runs[1]
