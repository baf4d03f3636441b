"""The framework: one config builds every scheduler; plugins declare options; bad combinations
and values are refused in one line; fair share remembers decayed usage; hived holds GPUs out."""

from __future__ import annotations

import pytest

from corral.core import Cluster, JobSpec, Preempt, Scheduler, Start
from corral.core.admission import ADMISSIONS
from corral.core.admission.fairshare import FairShareAdmission
from corral.core.admission.hived import HivedScheduler
from corral.core.admission.quota import QuotaAdmission
from corral.core.config import parse_cluster_config
from corral.core.elastic import ElasticScheduler
from corral.core.framework import (
    SchedulerConfig,
    build_scheduler,
    check_config,
    config_from_mapping,
    sections,
)
from corral.core.options import NoOptions, OptionError
from corral.core.placement import make_placement
from corral.core.plugin import PluginError, Services
from corral.core.policy import make_policy

VCS = {
    "cell_types": {"NODE": {"child": "V100", "count": 4, "node": True}},
    "physical_cells": [{"type": "NODE", "count": 2}],
    "virtual_clusters": {"a": {"NODE": 1}, "b": {"NODE": 1}},
}


def services(**kw: object) -> Services:
    parsed = parse_cluster_config(VCS)
    return Services(
        parsed.cluster,
        vc_cells=parsed.virtual_clusters,
        vc_quota={"a": 4, "b": 4},
        **kw,  # type: ignore[arg-type]
    )


def test_the_defaults_are_one_set_and_round_trip_through_a_mapping():
    config = SchedulerConfig()
    assert (config.core.policy, config.core.placement, config.core.admission) == (
        "las",
        "relax",
        ("auto",),
    )
    assert config.section("relax").after_s == 600.0
    assert config.section("quota").oversubscribe and config.section("quota").lend_last
    again = config_from_mapping(config.to_mapping())
    assert again == config
    # Only what the chosen plugins read is shown.
    shown = config.to_mapping(only_used=True)
    assert {"las", "relax", "retry"} <= set(shown) and "gittins" not in shown


def test_auto_admission_follows_the_policy_then_the_vcs():
    config = SchedulerConfig()
    assert config.admission_for(services().vc_cells) == "quota"
    alone = Services(Cluster.shorthand(2, 4))
    assert config.admission_for(alone.vc_cells) == "none"
    assert config.with_policy("elasticflow").admission_for(services().vc_cells) == "elasticflow"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"relax": {"after_s": -1}}, "scheduler.relax.after_s: must be >= 0, got -1"),
        (
            {"las": {"thresholds_gpu_s": [10, 5]}},
            "scheduler.las: thresholds_gpu_s must be strictly",
        ),
        ({"las": {"thresholds": [1]}}, "scheduler.las.thresholds: unknown option"),
        ({"policy": "lottery"}, "unknown policy 'lottery'"),
        ({"stages": ["defrag"]}, "unknown stage 'defrag'"),
        ({"quota": {"lend_last": "maybe"}}, "scheduler.quota.lend_last: must be true or false"),
        ({"timeslice": {"quantum_s": "nan"}}, "scheduler.timeslice.quantum_s: must be a finite"),
        (
            {"retry": {"fast_fail_repeats": 1.5}},
            "scheduler.retry.fast_fail_repeats: must be an int",
        ),
        ({"colour": 1}, "scheduler.colour: unknown key"),
        ({"relax": [1, 2]}, "scheduler.relax: must be a mapping"),
    ],
)
def test_a_bad_value_is_refused_in_one_line_naming_it(values, message):
    with pytest.raises(OptionError) as caught:
        config_from_mapping(values)
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"admission": "quota", "stages": ["packing"]},
            "admission quota does not run with packing",
        ),
        (
            {"admission": "hived", "stages": ["migration"]},
            "admission hived does not run with migration",
        ),
        ({"policy": "elasticflow", "admission": "quota"}, "runs only inside admission elasticflow"),
        ({"policy": "las", "admission": "elasticflow"}, "needs policy elasticflow"),
        ({"admission": "hived", "placement": "hetero"}, "placement hetero does not run with"),
    ],
)
def test_a_combination_that_cannot_run_is_refused_before_anything_runs(values, message):
    with pytest.raises(PluginError, match=message):
        check_config(config_from_mapping(values))


def test_hetero_runs_with_hived_when_it_does_not_lend():
    check_config(
        config_from_mapping({"admission": "hived", "placement": "hetero", "hived": {"lend": False}})
    )


def test_a_plugin_missing_what_its_shell_cannot_give_refuses_to_build():
    with pytest.raises(PluginError, match="policy sjf: needs every job's length"):
        build_scheduler(config_from_mapping({"policy": "sjf"}), services())
    with pytest.raises(PluginError, match="admission elasticflow: needs a throughput table"):
        build_scheduler(config_from_mapping({"policy": "elasticflow"}), services())
    with pytest.raises(PluginError, match="stage packing: needs co-location"):
        build_scheduler(
            config_from_mapping({"admission": "none", "stages": ["packing"]}), services()
        )


def test_each_admission_builds_its_scheduler_with_the_options_given():
    built = build_scheduler(
        config_from_mapping({"policy": "fifo", "admission": "hived"}), services()
    )
    assert isinstance(built, HivedScheduler) and built.spill
    quiet = build_scheduler(
        config_from_mapping({"policy": "fifo", "admission": "hived", "hived": {"lend": False}}),
        services(),
    )
    assert isinstance(quiet, HivedScheduler) and not quiet.spill
    quota = build_scheduler(config_from_mapping({"policy": "fifo"}), services())
    assert isinstance(quota, Scheduler) and quota.admission.name == "quota"
    (admission,) = quota.admission.members
    assert isinstance(admission, QuotaAdmission) and admission.lend_last
    elastic = build_scheduler(
        config_from_mapping({"policy": "elasticflow", "elasticflow": {"migrate": False}}),
        services(throughput=lambda job, gpus: float(gpus)),
    )
    assert isinstance(elastic, ElasticScheduler) and elastic.migration is None
    with_options = {name for name, scheme in ADMISSIONS.items() if scheme.Options is not NoOptions}
    assert {"retry", "las", "relax", "packing", *with_options} <= set(sections())


@pytest.mark.parametrize("name", sorted(ADMISSIONS))
def test_every_registered_admission_builds_from_its_defaults_or_refuses_in_one_line(name: str):
    # Whatever is registered (one module and one entry), the default config of each builds, or
    # says in one line what the shell lacks.
    policy = "elasticflow" if name == "elasticflow" else "fifo"
    config = config_from_mapping({"policy": policy, "admission": name})
    try:
        built = build_scheduler(config, services(throughput=lambda job, gpus: float(gpus)))
    except PluginError as error:
        assert "\n" not in str(error) and str(error)
        return
    spec = JobSpec(id="j", submit_time=0.0, gpus=1, vc="a", duration_s=10.0)
    assert built.refusal(spec) is None
    built.submit(spec, 0.0)
    assert [a.job_id for a in built.decide(0.0).actions] == ["j"]


def test_options_reach_the_plugins():
    built = build_scheduler(
        config_from_mapping(
            {
                "policy": "las",
                "admission": "none",
                "placement": "relax",
                "las": {"thresholds_gpu_s": [3250, 7200, 18000]},
                "relax": {"after_s": 60},
                "retry": {"backoff_s": 7},
                "restore_s": 0,
            }
        ),
        services(),
    )
    assert isinstance(built, Scheduler)
    assert built.policy.thresholds == [3250.0, 7200.0, 18000.0]  # type: ignore[attr-defined]
    assert built.placement.relax_after_s == 60.0  # type: ignore[attr-defined]
    assert built.restore_s == 0.0 and built.retry.options.backoff_s == 7.0


# -- fair share with decayed usage --------------------------------------------------------------


def one_gpu(job_id: str, vc: str, submit: float) -> JobSpec:
    return JobSpec(id=job_id, submit_time=submit, gpus=1, vc=vc, duration_s=1e9)


@pytest.mark.parametrize(("half_life", "b_gets"), [(0.0, 4), (1000.0, 6)])
def test_fair_share_gives_less_to_the_vc_that_used_more_recently(half_life, b_gets):
    # 8 GPUs, weights 1:1. a runs 8 one-GPU jobs from t=0; b arrives at t=1000 with 8.
    # Without memory b's share is 4. With a half-life of 1000 s, at t=1000 a's decayed usage is
    # 8 x 1000/ln2 x (1 - 1/2) GPU-s and b's is 0: normalized usage 1 and 0, normalized shares
    # 1/2 each, so factors 2^(-1/0.5) = 1/4 and 2^0 = 1: b's share is 8 x 1/(1 + 1/4) = 6.4 GPUs,
    # and b reclaims 6 of a's GPUs (a 7th would put b at 7 > 6.4).
    s = Scheduler(
        Cluster.shorthand(1, 8),
        make_policy("fifo"),
        make_placement("consolidate"),
        admission=FairShareAdmission({"a": 1.0, "b": 1.0}, 8, half_life_s=half_life),
    )
    for i in range(8):
        s.submit(one_gpu(f"a{i}", "a", 0.0), 0.0)
    assert len(s.decide(0.0).actions) == 8
    for i in range(8):
        s.submit(one_gpu(f"b{i}", "b", 1000.0), 1000.0)
    actions = s.decide(1000.0).actions
    assert sum(isinstance(a, Preempt) for a in actions) == b_gets
    assert sum(isinstance(a, Start) for a in actions) == b_gets
    (admission,) = s.admission.members
    assert isinstance(admission, FairShareAdmission)
    if half_life:
        assert admission.factor("a") == pytest.approx(0.25)
        assert admission.share("b") == pytest.approx(6.4)


def test_fair_share_weights_are_its_own_option():
    config = config_from_mapping(
        {"policy": "fifo", "admission": "fairshare", "fairshare": {"weights": ["a=3", "b=1"]}}
    )
    built = build_scheduler(config, services())
    assert isinstance(built, Scheduler)
    (admission,) = built.admission.members
    assert isinstance(admission, FairShareAdmission) and admission.weights == {"a": 3.0, "b": 1.0}
    with pytest.raises(OptionError, match="weights: 'a=-1' is not VC=WEIGHT"):
        config_from_mapping({"fairshare": {"weights": ["a=-1"]}})
    with pytest.raises(PluginError, match="unknown VC 'c'"):
        build_scheduler(
            config_from_mapping({"admission": "fairshare", "fairshare": {"weights": ["c=1"]}}),
            services(),
        )


# -- hived holds GPUs out of allocation ------------------------------------------------------


def test_hived_takes_gpus_offline_and_brings_them_back():
    parsed = parse_cluster_config(VCS)
    s = HivedScheduler(
        parsed.cluster, parsed.virtual_clusters, make_policy("fifo"), make_placement("consolidate")
    )
    cluster = parsed.cluster
    s.submit(JobSpec(id="a0", submit_time=0, gpus=4, vc="a", duration_s=10.0), 0)
    started = {a.job_id: a.gpus for a in s.decide(0).actions if isinstance(a, Start)}
    node_of_a = cluster.gpu_node[started["a0"][0]]
    other = 1 - node_of_a
    # One GPU of the node b would bind is held out (processes that would not end there).
    held = cluster.node_gpus[other][0]
    s.take_offline([held])
    assert not cluster.gpu_free[held]
    s.submit(JobSpec(id="b0", submit_time=1, gpus=4, vc="b", duration_s=10.0), 1)
    assert not [a for a in s.decide(1).actions if isinstance(a, Start)]
    s.take_offline([held])  # again: idempotent
    s.bring_online([held])
    assert cluster.gpu_free[held]
    back = {a.job_id: a.gpus for a in s.decide(2).actions if isinstance(a, Start)}
    assert set(back) == {"b0"} and held in back["b0"]
