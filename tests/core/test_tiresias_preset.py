"""The `tiresias` preset's pieces, worked by hand: yarn placement, Tiresias's LAS preemption rule,
its queue thresholds, its fixed-quantum Gittins index, and the preset itself."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from corral.cli.main import app
from corral.core import Cluster, Job, Preempt, Start
from corral.core.framework import build_scheduler, config_from_mapping, merge
from corral.core.placement import NotPlaced, Placed, make_placement
from corral.core.plugin import Services
from corral.core.policy import make_policy
from corral.core.policy.gittins import gittins_index_fixed
from corral.core.presets import TIRESIAS, get_preset, given_keys, without
from tests.core.helpers import scheduler, spec


def job(gpus: int) -> Job:
    return Job(spec=spec("j", gpus))


# -- yarn placement -------------------------------------------------------------------------------


def test_yarn_puts_a_node_sized_job_on_the_first_node_that_fits_not_the_tightest():
    # Three 4-GPU nodes (GPUs 4n..4n+3): node 0 has 3 free, node 1 has 2 free, node 2 is idle.
    cluster = Cluster.shorthand(3, 4)
    cluster.allocate([0, 4, 5])
    yarn = make_placement("yarn")
    # 2 GPUs: node 0 is the first with 2 free (consolidate picks the tightest, node 1).
    assert yarn.place(cluster, job(2), 0) == Placed((1, 2))
    assert make_placement("consolidate").place(cluster, job(2), 0) == Placed((6, 7))
    # 1 GPU: node 0 again, its first free GPU.
    assert yarn.place(cluster, job(1), 0) == Placed((1,))
    # 4 GPUs: only the idle node 2 has them.
    assert yarn.place(cluster, job(4), 0) == Placed((8, 9, 10, 11))


def test_yarn_gives_a_larger_job_whole_idle_nodes_and_the_rest_first_fit():
    # Four 4-GPU nodes: node 0 has 3 free, node 1 idle, node 2 has 2 free, node 3 idle.
    cluster = Cluster.shorthand(4, 4)
    cluster.allocate([0, 8, 9])
    yarn = make_placement("yarn")
    # 6 = one whole idle node (the first, node 1) + 2 on the first other node with 2 free
    # (node 0, before node 2 and before the idle node 3).
    assert yarn.place(cluster, job(6), 0) == Placed((4, 5, 6, 7, 1, 2))
    # 8 = two whole idle nodes: 1 and 3; node 0's and node 2's free GPUs are not used.
    assert yarn.place(cluster, job(8), 0) == Placed((4, 5, 6, 7, 12, 13, 14, 15))
    # 9 = two idle nodes + 1 on node 0.
    assert yarn.place(cluster, job(9), 0) == Placed((4, 5, 6, 7, 12, 13, 14, 15, 1))
    # 12 free GPUs in all ... 3 + 4 + 2 + 4 = 13, but only two idle nodes: no room for 12.
    refused = make_placement("yarn").place(cluster, job(12), 0)
    assert isinstance(refused, NotPlaced) and "idle node" in refused.reason


def test_yarn_keeps_a_job_in_one_rack_and_refuses_one_larger_than_a_rack():
    # Two racks of two 4-GPU nodes; rack 0 has one idle node (node 1), rack 1 two.
    cluster = Cluster.shorthand(4, 4, racks=2)
    cluster.allocate([0])
    yarn = make_placement("yarn")
    assert yarn.place(cluster, job(8), 0) == Placed(tuple(range(8, 16)))
    assert yarn.refusal(cluster, spec("big", 12)) is not None
    assert yarn.refusal(cluster, spec("fits", 8)) is None


def test_yarn_on_an_empty_cluster_and_a_full_one():
    cluster = Cluster.shorthand(2, 4)
    yarn = make_placement("yarn")
    assert yarn.place(cluster, job(8), 0) == Placed(tuple(range(8)))
    cluster.allocate(range(8))
    assert isinstance(yarn.place(cluster, job(1), 0), NotPlaced)


# -- the LAS preemption rule ----------------------------------------------------------------------


def las_run(within: bool) -> tuple[list[object], list[object]]:
    """One 4-GPU node, one threshold at 100 GPU-s. A (4 GPUs, t=0) runs; B (4 GPUs, t=1) waits.
    A reaches 100 GPU-s at t=25 (queue 1); B (queue 0) preempts it. B reaches queue 1 at
    t = 25 + 100/4 = 50, after A entered it (t=25): both in queue 1, A ahead of B."""
    s = scheduler(
        1,
        4,
        "las",
        policy_options={"thresholds_gpu_s": [100], "preempt_within_queue": within},
        placement="any",
    )
    s.submit(spec("A", 4, submit=0), 0)
    s.decide(0)
    s.submit(spec("B", 4, submit=1), 1)
    assert s.decide(1).actions == []
    at_25 = s.decide(25).actions
    return at_25, s.decide(50).actions


def test_a_higher_queue_preempts_under_both_rules():
    for within in (True, False):
        at_25, _ = las_run(within)
        assert at_25 == [Preempt("A", (0, 1, 2, 3), "B"), Start("B", (0, 1, 2, 3))]


def test_a_waiting_job_of_the_same_queue_preempts_only_when_the_rule_allows_it():
    _, within = las_run(True)
    assert within == [Preempt("B", (0, 1, 2, 3), "A"), Start("A", (0, 1, 2, 3), resumed=True)]
    _, tiresias = las_run(False)
    assert tiresias == []  # Tiresias: only a strictly higher queue preempts


def test_tiresias_thresholds_make_three_queues_of_gpu_seconds():
    las = make_policy("las", thresholds_gpu_s=TIRESIAS.scheduler["las"]["thresholds_gpu_s"])  # type: ignore[index]
    s = scheduler(1, 4, "las", policy_options={"thresholds_gpu_s": [3250, 7200]}, placement="any")
    s.submit(spec("A", 4, submit=0, duration=10_000), 0)
    decision = s.decide(0)
    # 4 GPUs reach 3,250 GPU-s after 812.5 s: queue 1; then 7,200 after 1,800 s: queue 2.
    assert decision.wake_at == pytest.approx(812.5)
    assert las.queue_of(s.jobs["A"], 812.0) == 0
    assert las.queue_of(s.jobs["A"], 812.5) == 1
    assert s.decide(812.5).wake_at == pytest.approx(1800)
    assert las.queue_of(s.jobs["A"], 1800) == 2
    assert s.decide(1800).wake_at is None  # the last queue: no more crossings


# -- Gittins with a fixed quantum and queues ------------------------------------------------------


def test_fixed_quantum_gittins_index_of_a_two_point_distribution():
    samples = np.array([10.0, 100.0])
    # At 0 with quantum 10: P(S <= 10) = 0.5 over E[min(S, 10)] = 10 -> 0.05.
    assert gittins_index_fixed(samples, 0.0, 10.0) == pytest.approx(0.05)
    # At 5: 5 or 95 left; P(left <= 10) = 0.5, E[min(left, 10)] = (5 + 10) / 2 -> 1/15.
    assert gittins_index_fixed(samples, 5.0, 10.0) == pytest.approx(1 / 15)
    # Past 10: 90 left for sure, more than the quantum: index 0. Past every sample: 0.
    assert gittins_index_fixed(samples, 10.0, 10.0) == 0.0
    assert gittins_index_fixed(samples, 100.0, 10.0) == 0.0


def test_gittins_with_queues_orders_by_queue_before_index():
    gittins = make_policy(
        "gittins", service_samples_gpu_s=[10.0, 100.0], thresholds_gpu_s=[50.0], queues=True
    )
    young, old = Job(spec=spec("young", 1)), Job(spec=spec("old", 1))
    old.attained_gpu_s = 60.0  # queue 1, index 1/40; young: queue 0, index 0.05 at level 0
    assert gittins.key(young, 0)[0] == 0 and gittins.key(old, 0)[0] == 1
    assert gittins.key(young, 0) < gittins.key(old, 0)


# -- the preset -----------------------------------------------------------------------------------


def test_the_preset_builds_a_scheduler_for_each_policy():
    cluster = Cluster.shorthand(16, 4)
    services = Services(cluster, service_history=lambda: [100.0, 1_000.0, 10_000.0])
    placements = {}
    for policy in ("fifo", "las", "gittins"):
        mapping = merge(TIRESIAS.scheduler, TIRESIAS.by_policy.get(policy, {}))
        config = config_from_mapping(mapping | {"policy": policy})
        core = build_scheduler(config, services)
        placements[policy] = config.core.placement
        assert config.core.restore_s == 0
    # fifo places with yarn; Tiresias's dlas and gittins loops only count free GPUs.
    assert placements == {"fifo": "yarn", "las": "any", "gittins": "any"}
    assert core is not None
    with pytest.raises(ValueError, match="unknown preset"):
        get_preset("nope")


def test_what_the_user_gives_overrides_a_per_policy_change():
    given = given_keys({"placement": "consolidate", "las": {"starvation_factor": 2}})
    assert without({"placement": "any"}, given) == {}
    assert without({"las": {"preempt_within_queue": False}}, given) == {
        "las": {"preempt_within_queue": False}
    }


def test_config_show_prints_the_preset():
    result = CliRunner().invoke(app, ["config", "show", "--preset", "tiresias", "--policy", "las"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "placement: any" in out and "restore_s: 0.0" in out
    assert "- 3250.0\n    - 7200.0" in out and "preempt_within_queue: false" in out
    assert "spread_slowdown: false" in out and "yarn-gput1000.csv" in out
    fifo = CliRunner().invoke(app, ["config", "show", "--preset", "tiresias", "--policy", "fifo"])
    assert "placement: yarn" in fifo.output
    # A flag given with the preset overrides it.
    given = CliRunner().invoke(
        app, ["config", "show", "--preset", "tiresias", "--policy", "las", "--restore-s", "5"]
    )
    assert "restore_s: 5.0" in given.output
