"""hetero: GPU types chosen by min-cost matching, worked out by hand.

Costs follow corral/core/placement/hetero.py: slot k of type t costs
backlog_t + time x (1 + (k - 1) x gpus / C_t), where time = work / speed and a job without a
length has one unit of work (time 1 on its fastest type).
"""

from __future__ import annotations

import math

import pytest

from corral.core import Cluster, Job, JobSpec, NodeDef, Scheduler
from corral.core.gputypes import TypeLog, type_speeds
from corral.core.placement import make_placement
from corral.core.placement.hetero import (
    Hetero,
    JobSpeeds,
    match_types,
    run_times,
    type_backlog,
)
from corral.core.policy import make_policy
from tests.core.helpers import started

ONE_EACH = {"v100": 1, "k80": 1}
# Speeds relative to a V100. "swift" loses little on a K80, "fussy" a lot.
SPEEDS = {
    "swift": {"v100": 1.0, "k80": 2 / 3},  # time 1 on v100, 1.5 on k80
    "fussy": {"v100": 1.0, "k80": 0.1},  # time 1 on v100, 10 on k80
    "half": {"v100": 1.0, "k80": 0.5},  # time 2 on k80
    "quarter": {"v100": 1.0, "k80": 0.25},  # time 4 on k80
}


def demand(model: str, gpus: int = 1) -> JobSpeeds:
    return JobSpeeds(gpus, SPEEDS[model])


def two_type_cluster(v100: int = 1, k80: int = 1) -> Cluster:
    return Cluster.from_nodes(
        [NodeDef("v", v100, "v100", rack="r0"), NodeDef("k", k80, "k80", rack="r1")]
    )


def hetero_scheduler(cluster: Cluster, policy: str = "fifo", **options: object) -> Scheduler:
    def speed(job: object, gpus: tuple[int, ...]) -> float:
        return SPEEDS[job.spec.model][cluster.gpus[gpus[0]].gpu_type]  # type: ignore[attr-defined]

    placement = make_placement("hetero", relax_after_s=0.0, **options)
    return Scheduler(cluster, make_policy(policy), placement, speed_model=speed)


def job(job_id: str, model: str, gpus: int = 1, **kw: object) -> JobSpec:
    return JobSpec(id=job_id, submit_time=0.0, gpus=gpus, model=model, duration_s=100.0, **kw)  # type: ignore[arg-type]


# -- the matching --------------------------------------------------------------------------------


def test_matching_differs_from_each_job_taking_its_fastest_type():
    # One V100 and one K80. Both jobs are fastest on the V100, so greedy (the head job takes its
    # fastest type, then the next does) puts both there: swift in slot 2 (cost 2 x 1), fussy in
    # slot 1 (1): total 3. The matching sends swift to the K80 (1.5) and fussy to the V100 (1):
    # 2.5. Fussy on the K80 instead would cost 10.
    assert match_types([demand("swift"), demand("fussy")], ONE_EACH) == ["k80", "v100"]


def test_fairness_keeps_a_job_off_a_type_much_slower_than_its_equal_share():
    jobs = [demand("swift"), demand("fussy")]
    # Equal share of one V100 and one K80: swift (1 + 2/3) / 2 = 5/6, fussy (1 + 0.1) / 2 = 0.55.
    # fairness 1: swift's K80 speed 2/3 < 5/6 and fussy's 0.1 < 0.55: both only on the V100, one
    # behind the other (1 + 2 = 3).
    assert match_types(jobs, ONE_EACH, fairness=1.0) == ["v100", "v100"]
    # fairness 0.75: swift's floor 0.625 <= 2/3 lets it keep the K80 (fussy's 0.41 > 0.1 does not).
    assert match_types(jobs, ONE_EACH, fairness=0.75) == ["k80", "v100"]


def test_more_jobs_than_gpus_queue_on_the_type_where_waiting_costs_least():
    # Three 1-GPU jobs, one V100 and one K80. Slots: V100 1, 2, 3 for everyone; K80 k x time.
    # The three cheapest: V100 slot 1 (1) and slot 2 (2) and a K80 slot 1 for a "half" job (2):
    # 5. quarter on the K80 would cost 4 (total 7); everyone on the V100 1 + 2 + 3 = 6.
    # The two "half" jobs tie: one of them, either, goes to the K80.
    first, second, third = match_types(
        [demand("half"), demand("half"), demand("quarter")], ONE_EACH
    )
    assert third == "v100"
    assert sorted([first, second]) == ["k80", "v100"]


def test_a_gang_holds_a_bigger_share_of_a_small_type():
    # Two V100s, eight K80s; both jobs run in time 1 on the V100, 2 on a K80. Slot k is the k-th
    # job from the last on its type. On the V100 the 2-GPU gang costs k x (1 + (k-1) 2/2): 1, 2;
    # the 1-GPU job 1, 1.5. On the K80: gang 2, 2.5; job 2, 2.25.
    # Both on the V100, the 1-GPU job first (slot 2: 1.5) and the gang last (slot 1: 1): 2.5.
    # Gang first instead: 2 + 1 = 3; either job on the K80: 2 + 1 = 3.
    jobs = [JobSpeeds(2, SPEEDS["half"]), JobSpeeds(1, SPEEDS["half"])]
    assert match_types(jobs, {"v100": 2, "k80": 8}) == ["v100", "v100"]


def test_running_jobs_backlog_sends_a_waiting_job_elsewhere():
    # A 1-GPU job with a unit of work holds the only V100: backlog 1 x 1 / 1 = 1. Swift then
    # costs 1 + 1 = 2 on the V100, 1.5 on the idle K80, so it goes to the K80; without the
    # backlog it would take the V100 (1).
    backlog = type_backlog([(1, run_times(demand("fussy"), ONE_EACH), "v100")], ONE_EACH)
    assert backlog == {"v100": 1.0}
    assert match_types([demand("swift")], ONE_EACH, backlog) == ["k80"]
    assert match_types([demand("swift")], ONE_EACH) == ["v100"]


def test_known_lengths_weigh_the_matching():
    # With work given, time = work / speed. A long swift job (work 10: 10 on the V100, 15 on the
    # K80) and a short fussy one (work 1: 1 and 10). Swift to the K80 and fussy to the V100: 16;
    # the reverse 10 + 10 = 20; both on the V100, fussy first: 1 x 2 + 10 = 12: the best.
    jobs = [JobSpeeds(1, SPEEDS["swift"], work=10.0), JobSpeeds(1, SPEEDS["fussy"], work=1.0)]
    assert match_types(jobs, ONE_EACH) == ["v100", "v100"]


def test_types_a_job_cannot_use_are_never_matched():
    # Only a K80 speed (as type_speeds gives for gpu_types={k80}): K80 even though the V100 is
    # free. A 2-GPU job fits no type of one GPU; zero, negative and NaN speeds are unusable.
    assert match_types([JobSpeeds(1, {"k80": 0.1})], ONE_EACH) == ["k80"]
    assert match_types([JobSpeeds(2, SPEEDS["half"])], ONE_EACH) == [None]
    unusable = JobSpeeds(1, {"v100": 0.0, "k80": -1.0, "p100": math.nan})
    assert match_types([unusable, demand("half")], {**ONE_EACH, "p100": 1}) == [None, "v100"]
    assert match_types([demand("half"), demand("fussy")], {}) == [None, None]
    assert match_types([], ONE_EACH) == []


def test_bad_work_is_refused():
    for work in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="work must be a positive number"):
            match_types([JobSpeeds(1, SPEEDS["half"], work=work)], ONE_EACH)


def test_bad_fairness_is_refused():
    for fairness in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="fairness must be in"):
            match_types([demand("half")], ONE_EACH, fairness=fairness)
        with pytest.raises(ValueError, match="fairness must be in"):
            make_placement("hetero", fairness=fairness)


def test_type_speeds_honours_the_job_gpu_types_and_reads_consolidated_gpus():
    cluster = Cluster.from_nodes(
        [NodeDef("k-small", 2, "k80"), NodeDef("k-big", 4, "k80"), NodeDef("v", 4, "v100")]
    )
    seen: list[tuple[int, ...]] = []

    def speed(job: object, gpus: tuple[int, ...]) -> float:
        seen.append(gpus)
        return 1.0

    only_k80 = job("a", "half", gpus=3, gpu_types=frozenset({"k80"}))
    assert set(type_speeds(cluster, Job(spec=only_k80), speed)) == {"k80"}
    # The 4-GPU K80 node (GPUs 2..5) comes first: the 3 GPUs read are on one node.
    assert seen == [(2, 3, 4)]


# -- the placement inside the scheduler ---------------------------------------------------------


def test_scheduler_starts_each_job_on_its_matched_type():
    cluster = two_type_cluster()
    scheduler = hetero_scheduler(cluster)
    scheduler.submit(job("swift", "swift"), 0.0)
    scheduler.submit(job("fussy", "fussy"), 0.0)
    gpus = started(scheduler.decide(0.0).actions)
    types = {job_id: cluster.gpus[g[0]].gpu_type for job_id, g in gpus.items()}
    assert types == {"swift": "k80", "fussy": "v100"}


def test_a_job_waits_for_its_type_and_says_so():
    # Fussy runs on the only V100 (backlog 1). A second fussy job costs 1 + 1 = 2 on the V100 and
    # 10 on the idle K80: it waits for the V100.
    cluster = two_type_cluster()
    scheduler = hetero_scheduler(cluster)
    scheduler.submit(job("first", "fussy"), 0.0)
    assert started(scheduler.decide(0.0).actions) == {"first": (0,)}
    scheduler.submit(job("second", "fussy"), 1.0)
    assert started(scheduler.decide(1.0).actions) == {}
    assert "hetero: matched to v100" in scheduler.explain("second", 1.0)
    scheduler.finished("first", 2.0)
    assert started(scheduler.decide(2.0).actions) == {"second": (0,)}


def test_gpu_type_constraint_is_honoured_in_the_scheduler():
    # Fussy is 10x faster on the V100, which is free, but it accepts only K80s.
    cluster = two_type_cluster()
    scheduler = hetero_scheduler(cluster)
    scheduler.submit(job("pinned", "fussy", gpu_types=frozenset({"k80"})), 0.0)
    assert started(scheduler.decide(0.0).actions) == {"pinned": (1,)}


def test_fairness_option_changes_where_the_scheduler_starts_jobs():
    # As in the matching test: with fairness 1 swift may not use the K80, so it waits behind
    # fussy for the V100 while the K80 stays idle.
    cluster = two_type_cluster()
    scheduler = hetero_scheduler(cluster, fairness=1.0)
    scheduler.submit(job("swift", "swift"), 0.0)
    scheduler.submit(job("fussy", "fussy"), 0.0)
    assert set(started(scheduler.decide(0.0).actions)) == {"swift"}
    assert cluster.free_by_type["k80"] == 1


def test_one_type_or_no_waiting_job_places_like_the_wrapped_placement():
    # Empty queue: nothing to match, nothing started.
    scheduler = hetero_scheduler(two_type_cluster())
    assert scheduler.decide(0.0).actions == []
    # One GPU type: no restriction, the same GPUs as relax (tightest node first).
    for name in ("hetero", "relax"):
        cluster = Cluster.shorthand(2, 4)
        cluster.allocate([0, 1, 2])
        placement = make_placement(name)
        s = Scheduler(cluster, make_policy("fifo"), placement)
        s.submit(JobSpec(id="a", submit_time=0.0, gpus=1), 0.0)
        assert started(s.decide(0.0).actions) == {"a": (3,)}
    # Outside a round (no begin_round yet), place() is the wrapped placement's.
    alone = Hetero()
    result = alone.place(two_type_cluster(), Job(spec=job("x", "half")), 0.0)
    assert result.gpus == (1,)  # type: ignore[union-attr]  # relax: most free type, then name


def test_bad_max_jobs_is_refused():
    with pytest.raises(ValueError, match="max_jobs"):
        Hetero(max_jobs=0)


# -- where jobs ran ------------------------------------------------------------------------------


def test_type_log_counts_run_time_per_type_and_the_share_on_the_fastest():
    # A K80-pinned fussy job runs 10 s on the K80 while a free fussy job runs 5 s on the V100.
    cluster = two_type_cluster()

    def speed(job: object, gpus: tuple[int, ...]) -> float:
        return SPEEDS[job.spec.model][cluster.gpus[gpus[0]].gpu_type]  # type: ignore[attr-defined]

    log = TypeLog()
    scheduler = Scheduler(
        cluster, make_policy("fifo"), make_placement("hetero"), speed_model=log.wrap(cluster, speed)
    )
    scheduler.submit(job("pinned", "fussy", gpu_types=frozenset({"k80"})), 0.0)
    scheduler.submit(job("free", "fussy"), 0.0)
    scheduler.decide(0.0)
    scheduler.finished("free", 5.0)
    scheduler.finished("pinned", 10.0)
    jobs = [scheduler.jobs["pinned"], scheduler.jobs["free"]]
    # The matching's what-if reads of the speed model are not counted as starts.
    assert {j.id: log.seconds_by_type(j) for j in jobs} == {
        "pinned": {"k80": 10.0},
        "free": {"v100": 5.0},
    }
    # The K80 is the fastest type pinned may use: all 15 GPU-seconds are on a fastest type.
    # Equal-share speeds (one V100, one K80): pinned 0.1 (K80 only), free (1 + 0.1) / 2 = 0.55;
    # pinned ran at 0.1 (ratio 1), free at 1 (ratio 1 / 0.55).
    summary = log.summary(jobs, cluster, speed)
    assert summary == {
        "best_type_share": 1.0,
        "min_equal_share_ratio": pytest.approx(1.0),
        "below_half_equal_share": 0.0,
    }
    # The same run of an unpinned job: its 10 s on the K80 are not on its fastest type (5 of 15
    # GPU-seconds are), and it ran at 0.1 / 0.55 = 0.18 of its equal share: 1 job of 2 below half.
    unpinned = Job(spec=job("pinned", "fussy"), executed_s=10.0)
    assert log.summary([unpinned, jobs[1]], cluster, speed) == {
        "best_type_share": pytest.approx(5 / 15),
        "min_equal_share_ratio": pytest.approx(0.1 / 0.55),
        "below_half_equal_share": 0.5,
    }
    assert set(TypeLog().summary(jobs, cluster, speed).values()) == {None}
