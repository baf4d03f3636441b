"""Measured throughputs (corral.core.profiles): what the plugins read from a cluster's history."""

from __future__ import annotations

import json
import re

import pytest

from corral.core import Cluster, Job, JobSpec, NodeDef
from corral.core.profiles import Measure, Profiles, ProfilesError, Shape
from corral.sim.colocation import load_pair_table
from corral.sim.perfmodel import PerfModel


def job(model: str, gpus: int = 1, spread_slowdown: float = 1.0, vc: str = "default") -> Job:
    return Job(JobSpec("j", 0.0, gpus, model=model, spread_slowdown=spread_slowdown, vc=vc))


def cluster() -> Cluster:
    # GPUs 0-3 on v1 (v100), 4-7 on v2 (v100), 8-9 on k (k80).
    return Cluster.from_nodes(
        [NodeDef("v1", 4, "v100"), NodeDef("v2", 4, "v100"), NodeDef("k", 2, "k80")]
    )


def test_add_takes_the_mean_weighted_by_measured_seconds():
    profiles = Profiles()
    shape = Shape("resnet", "v100", 1)
    profiles.add(shape, 10.0, 30.0, new_run=True)
    measure = profiles.add(shape, 20.0, 10.0, new_run=True)
    # (10 x 30 + 20 x 10) / 40 = 12.5 steps/s over 40 s, two runs.
    assert measure is not None
    assert measure.steps_per_s == pytest.approx(12.5)
    assert (measure.seconds, measure.runs) == (40.0, 2)
    # A fold within the same run does not count a run; nonsense is ignored.
    profiles.add(shape, 12.5, 10.0)
    assert profiles.get(shape).runs == 2  # type: ignore[union-attr]
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        assert profiles.add(shape, bad, 10.0) is None
    assert profiles.add(shape, 5.0, 0.0) is None
    assert profiles.get(shape).steps_per_s == pytest.approx(12.5)  # type: ignore[union-attr]


def test_an_unmeasured_count_scales_from_the_largest_measured_count_below():
    profiles = Profiles()
    profiles.add(Shape("bert", "v100", 1), 4.0, 60.0)
    profiles.add(Shape("bert", "v100", 2), 7.0, 60.0)
    assert profiles.rate("bert", "v100", 2) == 7.0
    assert profiles.rate("bert", "v100", 3) == pytest.approx(10.5)  # 7 x 3/2
    assert profiles.rate("bert", "k80", 1) is None
    assert profiles.rate("gpt", "v100", 1) is None


def test_speed_is_relative_to_the_fastest_measured_type_at_that_count():
    profiles = Profiles()
    profiles.add(Shape("resnet", "v100", 1), 10.0, 60.0)
    profiles.add(Shape("resnet", "k80", 1), 2.5, 60.0)
    speed = profiles.speed_model(cluster())
    assert speed(job("resnet"), (0,)) == pytest.approx(1.0)
    assert speed(job("resnet"), (8,)) == pytest.approx(0.25)
    # A model measured nowhere runs at 1.0 (what the manager assumed before measuring).
    assert speed(job("unknown"), (8,)) == 1.0


def test_a_type_never_seen_for_a_model_is_ranked_by_the_other_models_ratio():
    # resnet runs at 1/4 and vgg at 1/16 of their v100 speed on a k80: the geometric mean is
    # 1/8. bert, measured on v100 only, is expected at 1/8 on the k80; lm, measured on the k80
    # only, 8 times faster on a v100.
    profiles = Profiles()
    profiles.add(Shape("resnet", "v100", 1), 10.0, 60.0)
    profiles.add(Shape("resnet", "k80", 1), 2.5, 60.0)
    profiles.add(Shape("vgg", "v100", 1), 16.0, 60.0)
    profiles.add(Shape("vgg", "k80", 1), 1.0, 60.0)
    profiles.add(Shape("bert", "v100", 1), 3.0, 60.0)
    profiles.add(Shape("lm", "k80", 1), 0.5, 60.0)
    assert profiles.type_ratio("k80", "v100") == pytest.approx(0.125)
    assert profiles.type_ratio("v100", "k80") == pytest.approx(8.0)
    assert profiles.type_ratio("k80", "a100") is None
    speed = profiles.speed_model(cluster())
    assert speed(job("bert"), (8,)) == pytest.approx(0.125)
    assert speed(job("bert"), (0,)) == pytest.approx(1.0)
    assert speed(job("lm"), (0,)) == pytest.approx(1.0)
    assert speed(job("lm"), (8,)) == pytest.approx(0.125)


def test_spread_slowdown_is_learned_from_spread_and_packed_runs():
    profiles = Profiles()
    profiles.add(Shape("vgg", "v100", 8, nodes=1), 8.0, 60.0)
    profiles.add(Shape("vgg", "v100", 8, nodes=2), 5.0, 60.0)
    assert profiles.spread_slowdown("vgg", 8) == pytest.approx(1.6)
    assert profiles.spread_slowdown("vgg", 4) is None
    # Spread faster than packed (noise) is no slowdown.
    profiles.add(Shape("lm", "v100", 4, nodes=1), 4.0, 60.0)
    profiles.add(Shape("lm", "v100", 4, nodes=2), 5.0, 60.0)
    assert profiles.spread_slowdown("lm", 4) == 1.0


def test_a_spread_placement_runs_at_its_measured_spread_rate():
    profiles = Profiles()
    profiles.add(Shape("vgg", "v100", 8, nodes=1), 8.0, 60.0)
    profiles.add(Shape("vgg", "v100", 8, nodes=2), 5.0, 60.0)
    big = Cluster.from_nodes([NodeDef(f"n{i}", 8, "v100") for i in range(2)])
    speed = profiles.speed_model(big)
    assert speed(job("vgg", 8), tuple(range(8))) == pytest.approx(1.0)
    spread = (0, 1, 2, 3, 8, 9, 10, 11)
    assert speed(job("vgg", 8), spread) == pytest.approx(5.0 / 8.0)


def test_throughput_is_elasticflows_scaling_curve_with_perfect_scaling_unmeasured():
    profiles = Profiles()
    profiles.add(Shape("bert", "v100", 1), 4.0, 60.0)
    profiles.add(Shape("bert", "v100", 4), 12.0, 60.0)
    assert profiles.throughput(job("bert"), 1) == 4.0
    assert profiles.throughput(job("bert"), 2) == pytest.approx(8.0)  # scaled from 1
    assert profiles.throughput(job("bert"), 4) == 12.0
    assert profiles.throughput(job("gpt"), 4) == 4.0  # nothing measured: perfect scaling


def test_gavel_table_round_trip(tmp_path):
    profiles = Profiles()
    profiles.add(Shape("resnet", "v100", 1), 10.0, 60.0)
    profiles.add(Shape("resnet", "v100", 2), 18.0, 60.0)
    profiles.add(Shape("resnet", "k80", 1), 2.5, 60.0)
    profiles.add(Shape("resnet", "v100", 2, nodes=2), 12.0, 60.0)
    profiles.add(Shape("resnet", "v100", 1, colocated="lm"), 6.0, 60.0)
    profiles.add(Shape("lm", "v100", 1, colocated="resnet"), 3.0, 60.0)
    table = profiles.to_gavel()
    assert table["v100"]["('resnet', 1)"] == {"null": 10.0, "('lm', 1)": [6.0, 3.0]}
    assert table["v100_unconsolidated"]["('resnet', 2)"] == {"null": 12.0}
    path = tmp_path / "throughputs.json"
    path.write_text(json.dumps(table))
    perf = PerfModel.from_gavel_table(path)
    assert perf.throughput("resnet", 2, "v100") == 18.0
    assert perf.throughput("resnet", 1, "k80") == 2.5


def test_pair_speeds_are_each_models_rate_sharing_over_its_rate_alone(tmp_path):
    # resnet: 10 steps/s alone on one v100, 6 beside lm; lm: 4 alone, 3 beside resnet. So the
    # pair runs at 0.6 and 0.75 of alone (1.35 together); the same as the simulator reads from
    # the Gavel table these measurements are written as.
    profiles = Profiles()
    profiles.add(Shape("resnet", "v100", 1), 10.0, 60.0)
    profiles.add(Shape("resnet", "v100", 1, colocated="lm"), 6.0, 60.0)
    profiles.add(Shape("lm", "v100", 1, colocated="resnet"), 3.0, 60.0)
    # lm never ran alone: the pair is not known yet (the packing stage's prior decides).
    guest, host = job("lm"), job("resnet")
    assert profiles.pair_speeds(guest, host, "v100") is None
    profiles.add(Shape("lm", "v100", 1), 4.0, 60.0)
    assert profiles.pair_speeds(guest, host, "v100") == pytest.approx((0.75, 0.6))
    assert profiles.pair_speeds(host, guest, "v100") == pytest.approx((0.6, 0.75))
    assert profiles.pair_speeds(guest, host, "k80") is None
    assert profiles.pair_speeds(job("lm", 2), job("resnet", 2), "v100") is None
    # Measurements of a job sharing its GPUs never count as its speed alone.
    assert profiles.rate("resnet", "v100", 1) == 10.0
    assert profiles.best_rate("lm") == 4.0
    path = tmp_path / "throughputs.json"
    path.write_text(json.dumps(profiles.to_gavel()))
    assert load_pair_table(path)(guest, host, "v100") == pytest.approx((0.75, 0.6))


def test_from_gavel_reads_back_what_to_gavel_wrote_and_gives_the_same_speeds():
    profiles = Profiles()
    profiles.add(Shape("resnet", "v100", 1), 10.0, 60.0)
    profiles.add(Shape("resnet", "v100", 4), 36.0, 60.0)
    profiles.add(Shape("resnet", "k80", 1), 2.5, 60.0)
    profiles.add(Shape("bert", "v100", 4, nodes=2), 12.0, 60.0)
    profiles.add(Shape("bert", "v100", 4), 20.0, 60.0)
    profiles.add(Shape("resnet", "v100", 1, colocated="lm"), 6.0, 60.0)
    profiles.add(Shape("lm", "v100", 1, colocated="resnet"), 3.0, 60.0)
    back = Profiles.from_gavel(json.loads(json.dumps(profiles.to_gavel())))
    # Every shape and rate, a spread one as 2 nodes (as it was); a pair's partner without a solo
    # rate ("null": 0) is not invented.
    assert {s: m.steps_per_s for s, m in back.items()} == {
        s: m.steps_per_s for s, m in profiles.items()
    }
    speed, again = profiles.speed_model(cluster()), back.speed_model(cluster())
    for model, gpus in [
        ("resnet", (0,)),
        ("resnet", (8,)),
        ("resnet", (0, 1, 2, 3)),
        ("bert", (0, 1, 4, 5)),
    ]:
        assert again(job(model, len(gpus)), gpus) == speed(job(model, len(gpus)), gpus)
    # Gavel's own zeros (a model that did not run at that size) are no measurement.
    table = {"K80": {"('a3c', 1)": {"null": 0.0}, "('a3c', 2)": {"null": 3.0}}}
    assert [(s.gpu_type, s.gpus) for s, _ in Profiles.from_gavel(table).items()] == [("k80", 2)]


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ([1], "expected an object of GPU types at the top level"),
        ({"@vcs": []}, "@vcs: expected an object of VCs' tables"),
        ({"@vcs": {"": {}}}, "@vcs: '': a VC's name must not be empty"),
        ({"@vcs": {"nlp": 1}}, "@vcs: nlp: expected an object of GPU types"),
        ({"@vcs": {"nlp": {"v100": {"bert": {}}}}}, "@vcs: nlp: v100: bert: bad key"),
        ({"@shared": "bert"}, "@shared: expected a list of model names"),
        ({"@shared": [""]}, "@shared: expected a list of model names"),
        ({"@tenants": {}}, "@tenants: unknown key (corral's own are @vcs and @shared)"),
        ({"v100": []}, "v100: expected an object of '(model, gpus)' keys"),
        ({"v100": {"resnet": {"null": 1.0}}}, "v100: resnet: bad key"),
        ({"v100": {"('resnet', 0)": {"null": 1.0}}}, "the GPU count must be positive"),
        ({"v100": {"('resnet', 1)": {"null": -1}}}, "null: steps/s must be a finite number >= 0"),
        ({"v100": {"('resnet', 1)": {"null": 1, "('lm', 1)": 2}}}, "expected [own, partner's]"),
        ({"v100": {"('resnet', 1)": 5}}, 'expected an object with "null"'),
    ],
)
def test_from_gavel_names_the_bad_entry(table, message):
    with pytest.raises(ProfilesError, match=re.escape(message)):
        Profiles.from_gavel(table)


def test_a_speed_model_answers_from_what_was_measured_by_the_time_it_is_asked():
    # The model keeps its answers between measurements: one that arrives later is seen at once.
    profiles = Profiles()
    profiles.add(Shape("resnet", "v100", 1), 10.0, 60.0)
    speed = profiles.speed_model(cluster())
    assert speed(job("resnet"), (8,)) == 1.0  # k80 unknown, no other model: as the best
    profiles.add(Shape("resnet", "k80", 1), 2.5, 60.0)
    assert speed(job("resnet"), (8,)) == pytest.approx(0.25)
    profiles.add(Shape("resnet", "k80", 1), 7.5, 60.0)  # (2.5 + 7.5) / 2 = 5 steps/s
    assert speed(job("resnet"), (8,)) == pytest.approx(0.5)
    # The job's own spread slowdown is part of the question.
    spread = (0, 4)  # v1 and v2
    assert speed(job("resnet", 2, spread_slowdown=2.0), spread) == pytest.approx(0.5)
    assert speed(job("resnet", 2, spread_slowdown=4.0), spread) == pytest.approx(0.25)


# -- per VC: one tenant's measurements are not another's ---------------------------------------


def tenants() -> Profiles:
    """vision's job claimed bert ran at 1000 steps/s on a v100 (30 s); nlp measured 4 (60 s) there
    and 2 on a k80 (60 s); a trace's table (no VC) has resnet at 10 on a v100 and 2.5 on a k80."""
    profiles = Profiles()
    profiles.add(Shape("bert", "v100", 1, vc="vision"), 1000.0, 30.0, new_run=True)
    profiles.add(Shape("bert", "v100", 1, vc="nlp"), 4.0, 60.0, new_run=True)
    profiles.add(Shape("bert", "k80", 1, vc="nlp"), 2.0, 60.0, new_run=True)
    profiles.add(Shape("resnet", "v100", 1), 10.0, 60.0)
    profiles.add(Shape("resnet", "k80", 1), 2.5, 60.0)
    return profiles


def test_each_vc_reads_its_own_measurements_then_those_of_no_vc():
    profiles = tenants()
    assert profiles.rate("bert", "v100", 1, vc="nlp") == 4.0
    assert profiles.rate("bert", "v100", 1, vc="vision") == 1000.0
    # A VC that measured nothing of bert reads nobody else's: the model is unknown to it.
    assert profiles.rate("bert", "v100", 1, vc="cv") is None
    assert not profiles.knows("bert", vc="cv") and profiles.knows("bert", vc="nlp")
    assert profiles.best_rate("bert", vc="nlp") == 4.0  # sjf's lengths: not vision's 1000
    assert profiles.throughput(job("bert", vc="nlp"), 2) == 8.0  # 4 x 2 (scaled from 1)
    assert profiles.throughput(job("bert", vc="cv"), 2) == 2.0  # unmeasured: perfect scaling
    # The measurements of no VC (a trace's, or stored before VCs): every VC reads them.
    for vc in ("nlp", "vision", "cv", ""):
        assert profiles.rate("resnet", "k80", 1, vc=vc) == 2.5
    # The speed model: nlp's bert on a k80 runs at half its v100 speed (2 of 4); vision's, never
    # measured there, at the prior of the models vision reads: resnet's 1/4 (the trace's), not
    # nlp's bert; cv's, unmeasured, at 1.0.
    speed = profiles.speed_model(cluster())
    assert speed(job("bert", vc="nlp"), (8,)) == pytest.approx(0.5)
    assert speed(job("bert", vc="vision"), (8,)) == pytest.approx(0.25)
    assert speed(job("bert", vc="cv"), (8,)) == 1.0
    assert profiles.type_rates("bert", 1, ["v100", "k80"], vc="vision") == pytest.approx(
        {"v100": 1000.0, "k80": 250.0}
    )


def test_a_shared_model_is_read_pooled_by_the_vcs_that_did_not_measure_it():
    profiles = tenants()
    assert profiles.share("bert") and not profiles.share("bert")
    assert profiles.shared == {"bert"}
    # cv measured nothing: it reads vision's and nlp's, the median of the two, (1000 + 4) / 2 =
    # 502 steps/s (each VC one voice, however long it ran), over 90 s in two runs.
    pooled = profiles.view("cv").get(Shape("bert", "v100", 1))
    assert pooled == Measure(502.0, 90.0, 2)
    assert profiles.rate("bert", "k80", 1, vc="cv") == 2.0  # only nlp measured it there
    # Its own measurement comes first: nlp still reads 4, vision 1000.
    assert profiles.rate("bert", "v100", 1, vc="nlp") == 4.0
    assert profiles.rate("bert", "v100", 1, vc="vision") == 1000.0
    # vision, which measured no k80: nlp's 2 steps/s there now.
    assert profiles.rate("bert", "k80", 1, vc="vision") == 2.0
    # A third VC's measurement: the median of 1000, 4 and 5 is 5; vision's claim no longer
    # counts for more than one voice.
    profiles.add(Shape("bert", "v100", 1, vc="speech"), 5.0, 10.0)
    assert profiles.rate("bert", "v100", 1, vc="cv") == 5.0
    # Unmarked: back to each VC's own.
    speed = profiles.speed_model(cluster())
    assert speed(job("bert", vc="cv"), (8,)) == pytest.approx(2.0 / 5.0)
    assert profiles.share("bert", False)
    assert speed(job("bert", vc="cv"), (8,)) == 1.0  # the memo forgot with the mark
    assert profiles.rate("bert", "v100", 1, vc="cv") is None


def test_a_pair_is_judged_from_each_jobs_own_vc():
    # resnet (vision) shares a v100 with lm (nlp): each one's relative speed comes from its own
    # VC's measurements: resnet 6 of 10 (0.6), lm 3 of 4 (0.75). nlp's measurements of resnet
    # (made up to be different) and vision's of lm do not enter.
    profiles = Profiles()
    profiles.add(Shape("resnet", "v100", 1, vc="vision"), 10.0, 60.0)
    profiles.add(Shape("resnet", "v100", 1, colocated="lm", vc="vision"), 6.0, 60.0)
    profiles.add(Shape("lm", "v100", 1, vc="nlp"), 4.0, 60.0)
    profiles.add(Shape("lm", "v100", 1, colocated="resnet", vc="nlp"), 3.0, 60.0)
    profiles.add(Shape("resnet", "v100", 1, vc="nlp"), 100.0, 60.0)
    profiles.add(Shape("resnet", "v100", 1, colocated="lm", vc="nlp"), 1.0, 60.0)
    guest, host = job("lm", vc="nlp"), job("resnet", vc="vision")
    assert profiles.pair_speeds(guest, host, "v100") == pytest.approx((0.75, 0.6))
    assert profiles.pair_speeds(host, guest, "v100") == pytest.approx((0.6, 0.75))
    # Both in nlp: nlp's resnet runs at 1 of 100 beside lm.
    assert profiles.pair_speeds(guest, job("resnet", vc="nlp"), "v100") == pytest.approx(
        (0.75, 0.01)
    )


def test_withdraw_takes_back_what_add_folded_in():
    profiles = Profiles()
    shape = Shape("resnet", "v100", 1, vc="nlp")
    profiles.add(shape, 10.0, 30.0, new_run=True)
    profiles.add(shape, 20.0, 10.0, samples_per_s=640.0, new_run=True)
    assert profiles.get(shape) == Measure(12.5, 40.0, 2, 640.0)
    # Without the second run: 10 steps/s over 30 s, one run, (640 x 40 - 640 x 10) / 30.
    assert profiles.withdraw(shape, 20.0, 10.0, samples_per_s=640.0, run=True) == Measure(
        10.0, 30.0, 1, pytest.approx(640.0)
    )
    assert profiles.view("nlp").get(Shape("resnet", "v100", 1)) == profiles.get(shape)
    # Without the first too: nothing is left of the shape.
    assert profiles.withdraw(shape, 10.0, 30.0, run=True) is None
    assert profiles.get(shape) is None and len(profiles) == 0
    assert profiles.rate("resnet", "v100", 1, vc="nlp") is None
    assert profiles.withdraw(shape, 10.0, 30.0) is None  # nothing there: nothing to take


def test_the_gavel_table_keeps_each_vcs_measurements_and_the_shared_models():
    profiles = tenants()
    profiles.add(Shape("bert", "v100", 1, colocated="resnet", vc="nlp"), 2.0, 60.0)
    profiles.add(Shape("resnet", "v100", 1, colocated="bert", vc="nlp"), 5.0, 60.0)
    profiles.share("bert")
    table = json.loads(json.dumps(profiles.to_gavel()))
    assert table == {
        "v100": {"('resnet', 1)": {"null": 10.0}},
        "k80": {"('resnet', 1)": {"null": 2.5}},
        "@vcs": {
            "nlp": {
                "v100": {
                    "('bert', 1)": {"null": 4.0, "('resnet', 1)": [2.0, 5.0]},
                    "('resnet', 1)": {"null": 0.0, "('bert', 1)": [5.0, 2.0]},
                },
                "k80": {"('bert', 1)": {"null": 2.0}},
            },
            "vision": {"v100": {"('bert', 1)": {"null": 1000.0}}},
        },
        "@shared": ["bert"],
    }
    back = Profiles.from_gavel(table)
    assert back.shared == {"bert"}
    assert {s: m.steps_per_s for s, m in back.items()} == {
        s: m.steps_per_s for s, m in profiles.items()
    }
    speed, again = profiles.speed_model(cluster()), back.speed_model(cluster())
    for model in ("bert", "resnet"):
        for vc in ("nlp", "vision", "cv"):
            for gpus in [(0,), (8,)]:
                assert again(job(model, vc=vc), gpus) == speed(job(model, vc=vc), gpus)
    # A table without VCs has neither key: Gavel's format as it was.
    assert set(Profiles.from_gavel({"v100": {"('a', 1)": {"null": 1.0}}}).to_gavel()) == {"v100"}
