"""Hierarchical queues (corral.core.queues, corral.core.admission.queues): a department's quota
shared by its teams, idle GPUs lent within the department first and then across, by over-quota
weight, capped by limits, and reclaimed in the reverse order. Every expected value is worked out
by hand in the comments (one 8-GPU node, 1-GPU jobs, fifo, consolidate)."""

from __future__ import annotations

from collections import Counter

import pytest

from corral.core import Cluster, JobRefused, JobSpec, Preempt, Priority, Scheduler, Start
from corral.core.admission.queues import QueuesAdmission
from corral.core.admission.quota import QuotaAdmission
from corral.core.config import ConfigError, parse_cluster_config, vc_gpu_quota
from corral.core.framework import build_scheduler, config_from_mapping
from corral.core.placement import make_placement
from corral.core.plugin import PluginError, Services
from corral.core.policy import make_policy
from corral.core.queues import Queue, QueueTree, flat_tree


def tree(*queues: Queue) -> QueueTree:
    return QueueTree({q.name: q for q in queues})


def dept(name: str, quota: int, weight: float = 1.0, limit: int | None = None) -> Queue:
    return Queue(name, None, quota, weight, limit, is_vc=False)


def vc(
    name: str, parent: str | None, quota: int, weight: float = 1.0, limit: int | None = None
) -> Queue:
    return Queue(name, parent, quota, weight, limit)


def scheduler(queues: QueueTree, gpus: int = 8, oversubscribe: bool = True) -> Scheduler:
    cluster = Cluster.shorthand(1, gpus)
    return Scheduler(
        cluster,
        make_policy("fifo"),
        make_placement("consolidate"),
        admission=QueuesAdmission(queues, cluster, oversubscribe=oversubscribe),
    )


def submit(s: Scheduler, vc_name: str, count: int, at: float) -> None:
    for i in range(count):
        s.submit(
            JobSpec(id=f"{vc_name}{i}", submit_time=at, gpus=1, vc=vc_name, duration_s=1e6), at
        )


def running(s: Scheduler) -> Counter[str]:
    return Counter(job.spec.vc for job in s.running_jobs())


#: Department d (quota 4): teams a and b (2 each); department e (quota 4): team c (4).
TWO_DEPARTMENTS = tree(
    dept("d", 4), vc("a", "d", 2), vc("b", "d", 2), dept("e", 4), vc("c", "e", 4)
)


def test_idle_quota_is_lent_within_the_department_before_across():
    # a asks for nothing; b for 4, c for 6 (c's jobs first in fifo order).
    # Cluster level: d gets min(4, 4) = 4, e gets min(6, 4) = 4, nothing left over.
    # Inside d: b gets min(4, 2) = 2, then a's idle 2 (d's share 4 - 2) -> b's share 4.
    # So b runs 4 and c 4: a's idle quota stays in d, though c's jobs came first. (Flat, the
    # lending walk would give the 2 idle GPUs to c's earlier jobs: b 2, c 6.)
    s = scheduler(TWO_DEPARTMENTS)
    submit(s, "c", 6, 0)
    submit(s, "b", 4, 1)
    s.decide(1)
    assert running(s) == {"b": 4, "c": 4}
    assert shares(s) == {"d": 4, "a": 0, "b": 4, "e": 4, "c": 4}


def shares(s: Scheduler) -> dict[str, float]:
    admission = s.admission.members[0]
    assert isinstance(admission, QueuesAdmission)
    return admission.fair_shares()


def test_what_a_department_leaves_idle_goes_across_by_weight():
    # d (quota 4, team a) is idle; e (quota 2, weight 1: team b) and f (quota 2, weight 3: team
    # c) each ask for 6. Cluster level: e 2, f 2, 4 left over split 1:3 -> e 3, f 5.
    queues = tree(
        dept("d", 4),
        vc("a", "d", 4),
        dept("e", 2, weight=1),
        vc("b", "e", 2),
        dept("f", 2, weight=3),
        vc("c", "f", 2),
    )
    s = scheduler(queues)
    submit(s, "b", 6, 0)
    submit(s, "c", 6, 1)
    s.decide(1)
    assert running(s) == {"b": 3, "c": 5}


def test_weights_split_a_departments_idle_share_among_its_teams():
    # One department (quota 8): a (quota 2, weight 1), b (quota 2, weight 3), c (quota 4) idle.
    # a and b ask for 6 each: a 2, b 2, c's idle 4 split 1:3 -> a 3, b 5.
    queues = tree(
        dept("d", 8),
        vc("a", "d", 2, weight=1),
        vc("b", "d", 2, weight=3),
        vc("c", "d", 4),
    )
    s = scheduler(queues)
    submit(s, "a", 6, 0)
    submit(s, "b", 6, 1)
    s.decide(1)
    assert running(s) == {"a": 3, "b": 5}


def test_a_limit_caps_what_is_lent_and_the_rest_goes_to_the_others():
    # As the weights across (e 1, f 3 share d's idle 4), but f's limit is 4 GPUs: f's part of
    # the 4 would be 3 but it has room for only 2 (4 - its quota 2); e takes 1 of its part,
    # and the 1 f handed back goes to e too: e 4, f 4.
    queues = tree(
        dept("d", 4),
        vc("a", "d", 4),
        dept("e", 2, weight=1),
        vc("b", "e", 2),
        dept("f", 2, weight=3, limit=4),
        vc("c", "f", 2),
    )
    s = scheduler(queues)
    submit(s, "b", 6, 0)
    submit(s, "c", 6, 1)
    s.decide(1)
    assert running(s) == {"b": 4, "c": 4}


def test_a_limit_holds_even_on_idle_gpus():
    # b alone asks for 8 but its limit is 5: it runs 5 and 3 GPUs stay idle.
    queues = tree(dept("d", 4), vc("a", "d", 2), vc("b", "d", 2, limit=5), vc("c", None, 4))
    s = scheduler(queues)
    submit(s, "b", 8, 0)
    s.decide(0)
    assert running(s) == {"b": 5}
    assert s.cluster.free_gpus == 3
    assert "VC b is at its limit: 5 of 5 GPUs in use, 1 more asked" in s.explain("b5", 0)


def test_reclaim_takes_from_outside_the_department_first_then_within():
    # d (quota 4): a (2), b (2); e (quota 4): c (4).
    # t=0: b asks for 3, c for 5. Cluster: d min(3, 4) = 3, e min(5, 4) = 4, 1 left, only e
    # wants more -> e 5. Inside d, b 3 (a's idle 1); inside e, c 5. b runs 3, c 5: the node full.
    s = scheduler(TWO_DEPARTMENTS)
    submit(s, "b", 3, 0)
    submit(s, "c", 5, 0)
    s.decide(0)
    assert running(s) == {"b": 3, "c": 5}
    # t=10: a asks for 2. Demand a 2, b 3, c 5: d 4 (its quota), e 4; inside d a 2, b 2.
    # b is over by 1 (3 of 2), c by 1 (5 of 4), and so are their branches against a: b itself
    # (inside d), e (5 of 4). a0 takes back from outside its department first: one of c's
    # jobs. Then e is at its share (4 of 4) and c no longer lends; a1 takes one of b's.
    submit(s, "a", 2, 10)
    decision = s.decide(10)
    preempted = [a.job_id for a in decision.actions if isinstance(a, Preempt)]
    started = [a.job_id for a in decision.actions if isinstance(a, Start)]
    assert [job_id[0] for job_id in preempted] == ["c", "b"]
    assert started == ["a0", "a1"]
    assert running(s) == {"a": 2, "b": 2, "c": 4}
    # Settled: nobody is over a share, so the next round preempts nothing.
    assert not [a for a in s.decide(20).actions if isinstance(a, Preempt)]


def test_among_borrowers_outside_the_furthest_over_its_share_gives_first():
    # x (quota 4: team a), y (quota 2, weight 1: team b), z (quota 2, weight 3: team c).
    # t=0: a asks nothing, c 6 (first in fifo order), b 6. Cluster: x 0, y 2, z 2, 4 left split
    # 1:3 -> y 3, z 5. b runs 3, c 5.
    queues = tree(
        dept("x", 4),
        vc("a", "x", 4),
        dept("y", 2, weight=1),
        vc("b", "y", 2),
        dept("z", 2, weight=3),
        vc("c", "z", 2),
    )
    s = scheduler(queues)
    submit(s, "c", 6, 0)
    submit(s, "b", 6, 0)
    s.decide(0)
    assert running(s) == {"b": 3, "c": 5}
    # t=10: a asks 3 (within its quota). x 3, y 2, z 2, 1 left split 1:3 -> y 2.25, z 2.75.
    # b is over by 0.75, c by 2.25: both outside a's department, c further over, so c gives
    # first (though b's jobs are the lowest in fifo order). After one: c 4, over by 1.25, still
    # further: c again. After two: c 3, over by 0.25, b by 0.75: b gives. a 3, b 2, c 3.
    submit(s, "a", 3, 10)
    decision = s.decide(10)
    preempted = [a.job_id for a in decision.actions if isinstance(a, Preempt)]
    assert [job_id[0] for job_id in preempted] == ["c", "c", "b"]
    assert shares(s) == pytest.approx({"x": 3, "a": 3, "y": 2.25, "b": 2.25, "z": 2.75, "c": 2.75})
    assert running(s) == {"a": 3, "b": 2, "c": 3}
    assert not [a for a in s.decide(20).actions if isinstance(a, Preempt)]


def test_a_job_larger_than_a_limit_above_it_is_refused_at_submission():
    # b's department d has a limit of 5: a 6-GPU job of b's could never start.
    queues = tree(dept("d", 4, limit=5), vc("a", "d", 2), vc("b", "d", 2), vc("c", None, 4))
    s = scheduler(queues)
    with pytest.raises(JobRefused, match="asks for 6 GPUs but the cluster has only 5 GPUs"):
        s.submit(JobSpec(id="big", submit_time=0, gpus=6, vc="b", duration_s=1.0), 0)
    s.submit(JobSpec(id="c8", submit_time=0, gpus=8, vc="c", duration_s=1.0), 0)  # no limit


def test_without_oversubscription_idle_quota_stays_in_its_department():
    # --no-quota-oversubscribe: d (a idle, b asks 6) gets nothing beyond its quota 4, and e's
    # idle quota is not lent across: b runs 4 (its 2 and a's idle 2), 4 GPUs stay idle.
    s = scheduler(TWO_DEPARTMENTS, oversubscribe=False)
    submit(s, "b", 6, 0)
    s.decide(0)
    assert running(s) == {"b": 4}
    assert s.cluster.free_gpus == 4


@pytest.mark.parametrize(
    ("demand", "expected"),
    [
        # Nothing asked: nothing given.
        ({"a": 0, "b": 0, "c": 0}, {"d": 0, "a": 0, "b": 0, "e": 0, "c": 0}),
        # Everyone within quota: each its demand.
        ({"a": 1, "b": 2, "c": 3}, {"d": 3, "a": 1, "b": 2, "e": 3, "c": 3}),
        # c asks 10: e gets its 4 and all d leaves idle (8 - 3 = 5 -> e 5).
        ({"a": 1, "b": 2, "c": 10}, {"d": 3, "a": 1, "b": 2, "e": 5, "c": 5}),
        # Both departments ask 6: each its quota 4; inside d, a 2 and b's 4 -> b 2 and a's
        # idle... none (a asks 2): a 2, b 2.
        ({"a": 2, "b": 4, "c": 6}, {"d": 4, "a": 2, "b": 2, "e": 4, "c": 4}),
    ],
)
def test_fair_shares_by_hand(demand: dict[str, int], expected: dict[str, float]):
    assert TWO_DEPARTMENTS.fair_shares(demand, 8) == pytest.approx(expected)


def test_departments_nest_and_idle_quota_stays_in_the_nearest_one_first():
    # org (quota 6): department x (quota 4: a 2, b 2) and VC c (2); z (2) beside org; 8 GPUs.
    # a asks 4, z asks 8, b and c nothing. Cluster: org min(4, 6) = 4, z 2, 2 left, org asks no
    # more: z 4. Inside org: x 4, c 0. Inside x: a 2 + b's idle 2 = 4. b's idle quota went to
    # a (same department x); c's idle quota and org's spare 2 went across to z.
    nested = tree(
        Queue("org", None, 6, is_vc=False),
        Queue("x", "org", 4, is_vc=False),
        vc("a", "x", 2),
        vc("b", "x", 2),
        vc("c", "org", 2),
        vc("z", None, 2),
    )
    shares = nested.fair_shares({"a": 4, "b": 0, "c": 0, "z": 8}, 8)
    assert shares == {"org": 4, "x": 4, "a": 4, "b": 0, "c": 0, "z": 4}
    # The config takes a department under a department.
    parsed = parse_cluster_config(
        config(
            {
                "a": {"cells": {"ONE": 2}, "parent": "x"},
                "c": {"cells": {"ONE": 2}, "parent": "org"},
            },
            {"x": {"parent": "org"}, "org": {"quota": 6}},
        )
    )
    assert parsed.queues is not None and parsed.queues.chain("a") == ["a", "x", "org"]


def test_opportunistic_jobs_give_way_before_any_borrower():
    # c runs 4 (its quota); a's 4 opportunistic jobs take the idle GPUs (no quota counted).
    # b asks 2 within its quota: the opportunistic jobs go first (lowest first: a3, a2), not c's.
    s = scheduler(TWO_DEPARTMENTS)
    submit(s, "c", 4, 0)
    for i in range(4):
        s.submit(
            JobSpec(
                id=f"o{i}",
                submit_time=0,
                gpus=1,
                vc="a",
                duration_s=1e6,
                priority=Priority.OPPORTUNISTIC,
            ),
            0,
        )
    s.decide(0)
    assert running(s) == {"c": 4, "a": 4}
    submit(s, "b", 2, 10)
    preempted = [a.job_id for a in s.decide(10).actions if isinstance(a, Preempt)]
    assert sorted(preempted) == ["o2", "o3"]
    assert running(s) == {"c": 4, "a": 2, "b": 2}


def test_a_flat_tree_is_each_vc_its_quota_plus_an_equal_part():
    # Flat a (quota 2), b (quota 2) on 8 GPUs, both asking 8: 2 + 2 each of the 4 left.
    assert flat_tree({"a": 2, "b": 2}).fair_shares({"a": 8, "b": 8}, 8) == {"a": 4, "b": 4}


# -- the config ------------------------------------------------------------------------------

BASE = {
    "cell_types": {"ONE": {"child": "gpu", "count": 1}, "NODE": {"child": "ONE", "count": 8}},
    "physical_cells": [{"type": "NODE", "count": 1}],
}


def config(vcs: dict, departments: dict | None = None) -> dict:
    return BASE | {"virtual_clusters": vcs} | ({"departments": departments} if departments else {})


def test_the_config_gives_each_level_its_quota_weight_and_limit():
    parsed = parse_cluster_config(
        config(
            {
                "a": {"cells": {"ONE": 2}, "parent": "d", "weight": 3, "limit": 6},
                "b": {"ONE": 2},  # the short form: under no department, weight 1, no limit
                "c": {"cells": {"ONE": 2}, "parent": "d"},
            },
            {"d": {"quota": 5, "weight": 2, "limit": 7}},
        )
    )
    assert parsed.virtual_clusters == {"a": {"ONE": 2}, "b": {"ONE": 2}, "c": {"ONE": 2}}
    assert parsed.queues == tree(
        vc("a", "d", 2, weight=3, limit=6),
        vc("b", None, 2),
        vc("c", "d", 2),
        dept("d", 5, weight=2, limit=7),
    )
    # A department's quota is by default its children's together.
    parsed = parse_cluster_config(config({"a": {"cells": {"ONE": 3}, "parent": "d"}}, {"d": {}}))
    assert parsed.queues is not None and parsed.queues.queues["d"].quota == 3


def test_a_flat_config_has_no_tree():
    assert parse_cluster_config(config({"a": {"ONE": 2}, "b": {"ONE": 2}})).queues is None


@pytest.mark.parametrize(
    ("vcs", "departments", "message"),
    [
        (
            {"a": {"cells": {"ONE": 2}, "parent": "resarch"}},
            {"research": {"quota": 4}, "other": {"quota": 1}},
            "virtual_clusters.a.parent: no department 'resarch' (did you mean 'research'?)",
        ),
        (
            {"a": {"cells": {"ONE": 2}, "parent": "x"}},
            None,
            "virtual_clusters.a.parent: no department 'x' (departments: none are declared)",
        ),
        (
            {"a": {"cells": {"ONE": 2}, "parent": "x"}},
            {"x": {"parent": "y"}, "y": {"parent": "x"}},
            "departments.x.parent: a cycle of departments: x -> y -> x",
        ),
        (
            {"a": {"cells": {"ONE": 2}, "parent": "d"}, "b": {"cells": {"ONE": 3}, "parent": "d"}},
            {"d": {"quota": 4}},
            "departments.d.quota: its children's quotas sum to 5 GPUs (a 2, b 3), over its "
            "quota of 4",
        ),
        (
            {"a": {"cells": {"ONE": 2}, "limit": 1}},
            None,
            "virtual_clusters.a.limit: 1 GPUs is below its quota of 2",
        ),
        (
            {"a": {"cells": {"ONE": 2}, "parent": "d"}},
            {"d": {"quota": 9}},
            "departments.d.quota: the top-level quotas sum to 9 GPUs (d 9) but the cluster has 8",
        ),
        (
            {"a": {"cells": {"ONE": 2}, "parent": "d"}},
            {"d": {}, "idle": {"quota": 1}},
            "departments.idle: no VC or department names it as its parent",
        ),
        (
            {"a": {"cells": {"ONE": 2}, "weight": 0}},
            None,
            "virtual_clusters.a.weight: must be a positive number, got 0",
        ),
        (
            {"a": {"cells": {"ONE": 2}, "parnt": "d"}},
            None,
            "virtual_clusters.a.parnt: unknown key (expected one of: cells, parent, weight, limit)",
        ),
        (
            {"a": {"cells": {"TWO": 2}}},
            None,
            "virtual_clusters.a.cells.TWO: unknown cell type 'TWO'",
        ),
        (
            {"a": {"cells": {"ONE": 2}, "parent": "a"}},
            {"a": {}},
            "departments.a: 'a' is also a VC; name it otherwise",
        ),
    ],
)
def test_a_bad_tree_is_refused_in_one_line_naming_the_queue_and_field(
    vcs: dict, departments: dict | None, message: str
):
    with pytest.raises(ConfigError) as error:
        parse_cluster_config(config(vcs, departments))
    assert str(error.value).startswith(message), str(error.value)
    assert "\n" not in str(error.value)


TREE_CONFIG = config(
    {"a": {"cells": {"ONE": 2}, "parent": "d"}, "b": {"cells": {"ONE": 2}, "parent": "d"}},
    {"d": {}},
)


def services_for(data: dict) -> Services:
    parsed = parse_cluster_config(data)
    return Services(
        parsed.cluster,
        vc_cells=parsed.virtual_clusters,
        vc_quota=vc_gpu_quota(parsed),
        vc_tree=parsed.queues,
    )


@pytest.mark.parametrize("admission", ["hived", "fairshare"])
def test_admissions_without_departments_refuse_a_tree_naming_the_option(admission: str):
    # HiveD's guarantees are cells bound to VCs; a department's quota lent across by weight
    # would break them, so hived (and fairshare, whose shares are weights of its own) refuse.
    chosen = config_from_mapping({"policy": "fifo", "admission": admission})
    with pytest.raises(PluginError) as error:
        build_scheduler(chosen, services_for(TREE_CONFIG))
    assert str(error.value) == (
        f"admission {admission} does not run with departments (the cluster config's "
        "departments and a VC's parent, weight, limit): use admission quota"
    )


def test_quota_and_auto_build_the_tree_and_a_flat_config_the_flat_quota():
    for name in ("quota", "auto"):
        built = build_scheduler(
            config_from_mapping({"policy": "fifo", "admission": name}), services_for(TREE_CONFIG)
        )
        assert isinstance(built.admission.members[0], QueuesAdmission)
    flat = config({"a": {"ONE": 2}, "b": {"ONE": 2}})
    built = build_scheduler(config_from_mapping({"policy": "fifo"}), services_for(flat))
    member = built.admission.members[0]
    assert isinstance(member, QuotaAdmission) and not isinstance(member, QueuesAdmission)
