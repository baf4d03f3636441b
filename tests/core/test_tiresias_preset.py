"""The `tiresias` preset's pieces, worked by hand: yarn placement, Tiresias's LAS preemption rule,
its queue thresholds, its victims, its list order and its late demotions, its Gittins index, and
the preset itself. tests/sim/test_tiresias_reference.py compares the whole preset with the
Tiresias simulator's output, job by job."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from corral.cli.main import app
from corral.core import Cluster, Job, Preempt, Scheduler, Start
from corral.core.cluster import NodeDef
from corral.core.framework import build_scheduler, config_from_mapping, merge
from corral.core.placement import NotPlaced, Placed, make_placement
from corral.core.plugin import PluginError, Services
from corral.core.policy import make_policy
from corral.core.policy.gittins import gittins_index_fixed, tiresias_rank
from corral.core.policy.las import LasState
from corral.core.presets import TIRESIAS, get_preset, given_keys, without
from corral.sim.engine import Simulation
from tests.core.helpers import random_trace, scheduler, spec


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
    # No job waits: A's crossings wake no round (a waiting job would be woken for them).
    assert s.decide(0).wake_at is None
    job = s.jobs["A"]
    # 4 GPUs reach 3,250 GPU-s after 812.5 s: queue 1; then 7,200 after 1,800 s: queue 2.
    assert las.key_changes_at(job, 0) == pytest.approx(812.5)
    assert las.queue_of(job, 812.0) == 0
    assert las.queue_of(job, 812.5) == 1
    assert las.key_changes_at(job, 812.5) == pytest.approx(1800)
    assert las.queue_of(job, 1800) == 2
    assert las.key_changes_at(job, 1800) == math.inf  # the last queue: no more crossings


def run_until(s, until: float, wake: float | None) -> float | None:
    """Hold the rounds the scheduler asks for up to `until` (not beyond)."""
    while wake is not None and wake <= until:
        wake = s.decide(wake).wake_at
    return wake


def victims_scenario(victims: str) -> list[object]:
    """One 8-GPU node, LAS at 1 GPU-s, placement `any` (the first free GPUs). X (2 GPUs) A (2)
    and B (4) start at 0 on GPUs 0-1, 2-3 and 4-7; X ends at 5; C (1) and D (1) start at 6 and 7
    on GPUs 0 and 1. All drop to queue 1: B at 0.25, A at 0.5, C at 7, D at 8, so queue 1 is
    B, A, C, D. J (3 GPUs, queue 0) arrives at 10 with no GPU free."""
    s = scheduler(
        1, 8, "las", placement="any", policy_options={"thresholds_gpu_s": [1]}, victims=victims
    )
    for name, gpus in (("X", 2), ("A", 2), ("B", 4)):
        s.submit(spec(name, gpus, submit=0), 0)
    wake = s.decide(0).wake_at
    wake = run_until(s, 5, wake)
    s.finished("X", 5)
    s.submit(spec("C", 1, submit=6), 6)
    assert s.decide(6).actions == [Start("C", (0,))]
    s.submit(spec("D", 1, submit=7), 7)
    assert s.decide(7).actions == [Start("D", (1,))]
    run_until(s, 9, 8)
    s.submit(spec("J", 3, submit=10), 10)
    return s.decide(10).actions


def test_lowest_victims_give_way_from_the_lowest_until_the_job_fits():
    # D (1), C (1), then A (2): 4 GPUs; J takes the first three free, 0 (C), 1 (D) and 2 (A),
    # and C, waiting now at the head of queue 1, takes A's other GPU in the same round.
    assert victims_scenario("lowest") == [
        Preempt("D", (1,), "J"),
        Preempt("C", (0,), "J"),
        Preempt("A", (2, 3), "J"),
        Start("J", (0, 1, 2)),
        Start("C", (3,), resumed=True),
    ]


def test_in_order_victims_keep_their_gpus_while_they_fit_in_what_the_job_leaves():
    # Tiresias's pass: J leaves 8 - 3 = 5 GPUs. B (4) keeps its GPUs (1 left), A (2) does not
    # fit, C (1) fits (0 left), D (1) does not: A and D give way, exactly J's 3 GPUs.
    assert victims_scenario("in-order") == [
        Preempt("A", (2, 3), "J"),
        Preempt("D", (1,), "J"),
        Start("J", (1, 2, 3)),
    ]


@pytest.mark.parametrize("sliced", [True, False])
def test_in_order_a_job_started_at_this_instant_is_no_victim_until_the_next(sliced):
    # One 2-GPU node, LAS at 10 GPU-s, Tiresias's pass. A (2 GPUs) reaches queue 1 at 5; B (2,
    # queue 0) preempts it at 6 and ends at 8, when A starts again. J (1 GPU, queue 0) comes at
    # that same instant: A is no victim of a round at 8 (no start undone at its instant), and
    # gives way to J at the next round.
    s = scheduler(
        1, 2, "las", placement="any", policy_options={"thresholds_gpu_s": [10]}, victims="in-order"
    )
    s.preemption.slices = sliced
    s.submit(spec("A", 2, submit=0), 0)
    assert s.decide(0).actions == [Start("A", (0, 1))]
    s.submit(spec("B", 2, submit=6), 6)
    assert s.decide(6).actions == [Preempt("A", (0, 1), "B"), Start("B", (0, 1))]
    s.finished("B", 8)
    assert s.decide(8).actions == [Start("A", (0, 1), resumed=True)]
    s.submit(spec("J", 1, submit=8), 8)
    assert s.decide(8).actions == []
    assert s.decide(9).actions == [Preempt("A", (0, 1), "J"), Start("J", (0,))]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("policy", ["las-started", "las-entered", "gittins"])
def test_in_order_victims_read_as_a_slice_are_those_found_one_by_one(seed, policy):
    # Random overloaded traces, some jobs of one GPU type on 4 nodes of 4 GPUs of two types, in
    # Tiresias's pass: every start and preemption is the same with the victims read as one
    # slice of the running index and found one by one (`_victims`, `_candidates`).
    if policy == "gittins":
        history = random_trace(seed + 100, 300)
        options: dict = {
            "service_samples_gpu_s": [j.gpus * (j.duration_s or 0) for j in history],
            "queues": True,
            "thresholds_gpu_s": [300, 2000],
        }
    else:
        options = {"thresholds_gpu_s": [300, 2000], "queue_order": policy.split("-")[1]}
    trace = [
        replace(job, gpus=min(job.gpus, 4), gpu_types=frozenset({"k80"}) if i % 5 == 0 else None)
        for i, job in enumerate(random_trace(seed, 200, 15.0))
    ]
    runs = []
    for sliced in (True, False):
        s = Scheduler(
            Cluster.from_nodes([NodeDef(f"n{i}", 4, "v100" if i < 2 else "k80") for i in range(4)]),
            make_policy(policy.split("-")[0], **options),
            make_placement("any"),
            victims="in-order",
        )
        assert s.preemption.slices
        s.preemption.slices = sliced
        runs.append(Simulation(trace, s, record_decisions=True).run().decisions)
    assert sum(isinstance(action, Preempt) for _, action in runs[0]) > 5
    assert runs[0] == runs[1]


def test_in_tiresias_order_a_job_that_drops_into_a_queue_gives_way_to_those_waiting_there():
    # One 2-GPU node, LAS at 10 GPU-s. P (2 GPUs) drops to queue 1 at t=5; R (queue 0) arrives
    # at 6 and preempts it. R reaches 10 GPU-s at 11 and drops into queue 1 behind P, which
    # waits there: in Tiresias's lists a dropped job joins the tail, and P takes its GPUs back.
    # With corral's order the two share queue 1 and only a higher queue preempts: R runs on.
    for order, at_11 in (
        ("started", [Preempt("R", (0, 1), "P"), Start("P", (0, 1), resumed=True)]),
        ("entered", []),
    ):
        options = {"thresholds_gpu_s": [10], "queue_order": order}
        s = scheduler(1, 2, "las", placement="any", policy_options=options)
        s.submit(spec("P", 2, submit=0), 0)
        run_until(s, 5, s.decide(0).wake_at)
        s.submit(spec("R", 2, submit=6), 6)
        assert s.decide(6).actions == [Preempt("P", (0, 1), "R"), Start("R", (0, 1))]
        assert s.decide(11).actions == at_11, order


@pytest.mark.parametrize(
    ("order", "at_21"),
    [
        ("started", [Preempt("B", (1, 2), "D"), Start("D", (1,))]),
        ("entered", [Preempt("A", (0,), "D"), Start("D", (0,))]),
    ],
)
def test_in_tiresias_order_running_jobs_give_way_last_started_first(
    order: str, at_21: list[object]
):
    # One 3-GPU node, LAS at 10 GPU-s, in-order victims. A (1 GPU) and B (2) start at 0; B drops
    # to queue 1 at 5, A at 10. C (2 GPUs, queue 0) arrives at 11: it leaves 1 GPU, B (first in
    # queue 1) does not fit in it and gives way, A keeps its GPU. C ends at 20 and B starts again.
    # D (1 GPU) arrives at 21 and leaves 2 GPUs. Tiresias's lists put B, started last, after A:
    # A keeps its GPU and B gives way. corral's order keeps B first (it entered queue 1 at 5):
    # B keeps its 2 GPUs and A gives way.
    options = {"thresholds_gpu_s": [10], "queue_order": order}
    s = scheduler(1, 3, "las", placement="any", policy_options=options, victims="in-order")
    s.submit(spec("A", 1, submit=0), 0)
    s.submit(spec("B", 2, submit=0), 0)
    run_until(s, 10, s.decide(0).wake_at)
    s.submit(spec("C", 2, submit=11, duration=9), 11)
    assert s.decide(11).actions == [Preempt("B", (1, 2), "C"), Start("C", (1, 2))]
    s.finished("C", 20)
    assert s.decide(20).actions == [Start("B", (1, 2), resumed=True)]
    s.submit(spec("D", 1, submit=21), 21)
    assert s.decide(21).actions == at_21


def test_demotions_at_rounds_come_at_the_next_round_or_tiresias_s_own_late_wake_up():
    # One 2-GPU node, LAS at 10 GPU-s, demotions at rounds: A (2 GPUs) starts at 0 and would
    # cross at t=5. Tiresias's wake-up at its start: 0 + (10 - 0 s executed) / 2 = 5. B (1 GPU)
    # arrives at 2: its round asks again, 2 + (10 - 2) // 2 = 6 (executed seconds, not GPU-seconds:
    # later than the crossing). At 6 A drops (entered 6) and B, queue 0, preempts it.
    options = {"thresholds_gpu_s": [10], "demote_at_rounds": True}
    s = scheduler(1, 2, "las", placement="any", policy_options=options)
    s.submit(spec("A", 2, submit=0), 0)
    assert s.decide(0).wake_at == 5
    s.submit(spec("B", 1, submit=2), 2)
    decision = s.decide(2)
    assert decision.actions == [] and decision.wake_at == 6
    assert s.decide(6).actions == [Preempt("A", (0, 1), "B"), Start("B", (0,))]
    # Demoted at 6, not at its crossing: it sits in queue 1 from then.
    assert s.jobs["A"].peek(LasState).entered == 6


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
    assert "victims: in-order" in out and "queue_order: started" in out
    assert "demote_at_rounds: true" in out
    fifo = CliRunner().invoke(app, ["config", "show", "--preset", "tiresias", "--policy", "fifo"])
    assert "placement: yarn" in fifo.output
    # A flag given with the preset overrides it.
    given = CliRunner().invoke(
        app, ["config", "show", "--preset", "tiresias", "--policy", "las", "--restore-s", "5"]
    )
    assert "restore_s: 5.0" in given.output


def test_tiresias_s_gittins_index_of_three_samples():
    # Samples 10, 20, 40; quantum 10. At 0: P = 1/3 (only 10 ends within 10) rounded 0.33333;
    # E = (10 + 10 x 2 still running) // 3 = 10; index 0.33333e6 / 10 = 33333.0.
    samples = np.array([10.0, 20.0, 40.0])
    assert tiresias_rank(samples, 0, 10) == 33333.0
    # At 15: 20 and 40 are above; P = 1/2; E counts 20's whole size, not the 5 left:
    # (20 + 10) // 2 = 15; index 0.5e6 / 15 = 33333.3333 (the textbook one: 0.5 / 7.5).
    assert tiresias_rank(samples, 15, 10) == 33333.3333
    assert gittins_index_fixed(samples, 15, 10) == pytest.approx(1 / 15)
    # At 39 (the largest less one): no sample ends within the quantum: 0; beyond it: 0.
    assert tiresias_rank(samples, 39, 10) == 0.0
    assert tiresias_rank(samples, 39.5, 10) == 0.0


def test_gittins_with_tiresias_s_formula_takes_the_index_of_the_next_sample_above():
    gittins = make_policy(
        "gittins",
        service_samples_gpu_s=[10.0, 20.0, 40.0],
        thresholds_gpu_s=[3250.0],
        delta_gpu_s=10.0,
        formula="tiresias",
    )
    j = Job(spec=spec("j", 1))
    j.attained_gpu_s = 12.0  # the next sample above is 20: its index at 19
    assert gittins.index(j, 0) == tiresias_rank(np.array([10.0, 20.0, 40.0]), 19, 10)
    j.attained_gpu_s = 20.0  # next above: 40, at 39: 0
    assert gittins.index(j, 0) == 0.0
    with pytest.raises(ValueError, match="quantum"):
        make_policy("gittins", service_samples_gpu_s=[10.0], formula="tiresias")


def test_in_order_victims_are_refused_with_an_admission_that_chooses_its_own():
    config = config_from_mapping({"policy": "las", "admission": "quota", "victims": "in-order"})
    cluster = Cluster.shorthand(2, 4)
    with pytest.raises(
        PluginError,
        match="victims in-order: only with admissions that leave victims to the policy, not quota",
    ):
        build_scheduler(config, Services(cluster, vc_cells={"a": {"v100": 8}}))
