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

#: Department d (quota 3): a (2 GPUs), b (1); department e (quota 2, over-quota weight 3): c
#: (2). One 6-GPU node: 1 GPU is nobody's quota.
TREE_YAML = """\
cell_types:
  ONE: {child: gpu, count: 1}
  NODE: {child: ONE, count: 6, node: true}
physical_cells:
  - {type: NODE, count: 1}
virtual_clusters:
  a: {cells: {ONE: 2}, parent: d}
  b: {cells: {ONE: 1}, parent: d}
  c: {cells: {ONE: 2}, parent: e}
departments:
  d: {quota: 3}
  e: {quota: 2, weight: 3}
"""

#: (instant, job, VC): c's four jobs, then b's three, then a's two one by one.
ARRIVALS = [
    (0.0, "c0", "c"),
    (0.0, "c1", "c"),
    (0.0, "c2", "c"),
    (0.0, "c3", "c"),
    (10.0, "b0", "b"),
    (10.0, "b1", "b"),
    (10.0, "b2", "b"),
    (30.0, "a0", "a"),
    (40.0, "a1", "a"),
]

#: By hand, (instant, start or preempt, job); a share is the queue's quota up to what it asks,
#: then its part by weight of what its parent's share leaves over:
#: 0: demand c 4, nobody else: e gets its quota 2 and 4 left over, capped by what c asks:
#:    c's share 4. c0-c3 start; 2 GPUs stay idle.
#: 10: demand b 3, c 4. Cluster: d min(3, 3) = 3, e min(4, 2) = 2, 1 left, d asks no more: e 3.
#:    Inside d: b 1 + a's idle 2 = 3. b0 (within b's quota) and b1 (within its share) take the
#:    idle GPUs; b2 (3 of a share of 3) takes one back from c (4 of 3): c3, its lowest in fifo
#:    order. a's idle quota is b's before it is lent across to c, though e weighs 3 to d's 1
#:    (lent across by weight, d would be guaranteed only b's 1, and of the 3 left over d would
#:    get 0.75, e the rest: b 1.75, c 4, and b2 would wait).
#: 30: demand a 1, b 3, c 4. Cluster: d 3, e 2, 1 left split 1 : 3 -> d 3.25, e 2.75. Inside d:
#:    a 1, b 1, the 1.25 left to b (a asks no more) -> b 2.25. b is over its share (3 of 2.25)
#:    and so is c (3 of 2.75): a0 (within a's quota) takes back from outside its department
#:    first: c2.
#: 40: demand a 2: d 3.25, e 2.75; inside d, a 2, b 1.25. b is over (3 of 1.25), c is not (2 of
#:    2.75): a1 takes b2's GPU. Outside the department gave first, then within.
EXPECTED = [
    (0.0, "start", "c0"),
    (0.0, "start", "c1"),
    (0.0, "start", "c2"),
    (0.0, "start", "c3"),
    (10.0, "start", "b0"),
    (10.0, "start", "b1"),
    (10.0, "preempt", "c3"),
    (10.0, "start", "b2"),
    (30.0, "preempt", "c2"),
    (30.0, "start", "a0"),
    (40.0, "preempt", "b2"),
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
