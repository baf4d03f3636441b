"""Hierarchical queues in the simulator: the scenario of tests/server/test_queues_live.py, with
the same decisions, worked out by hand (one node of 4 GPUs, 1-GPU jobs, fifo, consolidate,
admission quota through the framework, as `corral simulate` and `corral up` build it)."""

from __future__ import annotations

import yaml

from corral.core import JobSpec, Preempt, Start
from corral.core.config import parse_cluster_config, vc_gpu_quota
from corral.core.framework import build_scheduler, config_from_mapping
from corral.core.plugin import Services
from corral.sim.engine import Simulation

#: Department d (quota 3): a (2 GPUs), b (1); department e (quota 1, over-quota weight 3): c
#: (1). One 4-GPU node.
TREE_YAML = """\
cell_types:
  ONE: {child: gpu, count: 1}
  NODE: {child: ONE, count: 4, node: true}
physical_cells:
  - {type: NODE, count: 1}
virtual_clusters:
  a: {cells: {ONE: 2}, parent: d}
  b: {cells: {ONE: 1}, parent: d}
  c: {cells: {ONE: 1}, parent: e}
departments:
  d: {quota: 3}
  e: {quota: 1, weight: 3}
"""

#: (instant, job, VC): c's three jobs, then b's two, then a's one by one.
ARRIVALS = [
    (0.0, "c0", "c"),
    (0.0, "c1", "c"),
    (0.0, "c2", "c"),
    (10.0, "b0", "b"),
    (10.0, "b1", "b"),
    (30.0, "a0", "a"),
    (40.0, "a1", "a"),
]

#: By hand, (instant, start or preempt, job):
#: 0: demand c 3, nothing else: e gets its quota 1 and all d leaves idle (3), capped by what c
#:    asks: c's share 3. c0, c1, c2 start; one GPU stays idle.
#: 10: demand b 2, c 3. Cluster level: d min(2, 3) = 2, e min(3, 1) = 1, 1 left, only e asks
#:    more: e 2. Inside d: b 1 + a's idle 1 = 2. b0 (within b's quota) takes the idle GPU; b1
#:    (within b's share, lent a's idle GPU inside d) takes one back from c, 3 of a share of 2:
#:    c2, its lowest in fifo order. A GPU idle inside d goes to b before c, though e's weight
#:    is 3 to d's 1: lent across by weight, d's idle 2 would split 0.5 : 1.5 (b 1.5, c 2.5),
#:    and b1 would wait.
#: 30: demand a 1: d min(4, 3) = 3, e 1. Inside d: a 1, b 1, 1 left, only b asks more: b 2.
#:    a0 (within a's quota) reclaims: c is over its share (2 of 1) from outside d, b is not
#:    (2 of 2): c1 goes.
#: 40: demand a 2: inside d, a 2, b 1. b is over (2 of 1), c is not (1 of 1): a1 takes b1's.
#:    Outside the department gave first (c, at 30), then within (b, at 40).
EXPECTED = [
    (0.0, "start", "c0"),
    (0.0, "start", "c1"),
    (0.0, "start", "c2"),
    (10.0, "start", "b0"),
    (10.0, "preempt", "c2"),
    (10.0, "start", "b1"),
    (30.0, "preempt", "c1"),
    (30.0, "start", "a0"),
    (40.0, "preempt", "b1"),
    (40.0, "start", "a1"),
]


def simulate() -> list[tuple[float, str, str]]:
    config = parse_cluster_config(yaml.safe_load(TREE_YAML))
    services = Services(
        config.cluster,
        vc_cells=config.virtual_clusters,
        vc_quota=vc_gpu_quota(config),
        vc_tree=config.queues,
    )
    scheduler = build_scheduler(
        config_from_mapping({"policy": "fifo", "placement": "consolidate", "admission": "quota"}),
        services,
    )
    jobs = [JobSpec(job_id, at, 1, vc=vc, duration_s=3600.0) for at, job_id, vc in ARRIVALS]
    result = Simulation(jobs, scheduler, record_decisions=True).run()
    return [
        (at, "start" if isinstance(action, Start) else "preempt", action.job_id)
        for at, action in result.decisions
        if at <= 60.0 and isinstance(action, (Start, Preempt))
    ]


def test_the_two_level_queue_lends_within_first_and_reclaims_from_outside_first():
    assert simulate() == EXPECTED
