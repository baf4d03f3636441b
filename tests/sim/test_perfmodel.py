"""The performance model: Gavel throughputs, spread slowdowns, GPU-type speed, placement speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.core.cluster import Cluster, NodeDef
from corral.core.job import Job, JobSpec
from corral.sim.perfmodel import (
    DEFAULT_SPREAD_SLOWDOWNS,
    PerfModel,
    PerfModelError,
    load_slowdowns,
)

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
RESNET = "ResNet-18 (batch size 16)"


def key(model: str, gpus: int) -> str:
    return str((model, gpus))


def write_table(path: Path) -> Path:
    """A small table in Gavel's format, with packing entries beside "null" as the real one has."""
    v100 = {
        key(RESNET, 1): 30.0,
        key(RESNET, 2): 50.0,
        key(RESNET, 4): 80.0,
        key(RESNET, 8): 120.0,
        key("A3C", 1): 10.0,
    }
    table = {
        "v100": {k: {"null": v, key(RESNET, 1): [v, 1.0]} for k, v in v100.items()},
        "v100_unconsolidated": {
            key(RESNET, 1): {"null": 30.0},
            key(RESNET, 2): {"null": 25.0},  # spread: half the speed
            key(RESNET, 4): {"null": 100.0},  # spread faster than consolidated: clamped to 1.0
            key(RESNET, 8): {"null": 40.0},
            key("A3C", 1): {"null": 10.0},
        },
        "k80": {
            key(RESNET, 1): {"null": 6.0},
            key(RESNET, 2): {"null": 0.0},  # did not run at this size: treated as unmeasured
            key(RESNET, 4): {"null": 16.0},
        },
    }
    file = path / "simulation_throughputs.json"
    file.write_text(json.dumps(table))
    return file


@pytest.fixture
def perf(tmp_path: Path) -> PerfModel:
    return PerfModel.from_gavel_table(write_table(tmp_path))


def test_measured_throughputs_are_read_from_null_entries(perf):
    assert perf.throughput(RESNET, 1, "v100") == 30.0
    assert perf.throughput(RESNET, 8, "v100") == 120.0
    assert perf.throughput(RESNET, 2, "V100", consolidated=False) == 25.0
    assert perf.throughput("unknown", 1, "v100") is None
    assert perf.throughput(RESNET, 1, "a100") is None


def test_missing_counts_scale_linearly_from_the_largest_measured_count_below(perf):
    assert perf.throughput(RESNET, 3, "v100") == pytest.approx(50.0 * 3 / 2)
    assert perf.throughput(RESNET, 16, "v100") == pytest.approx(120.0 * 2)
    assert perf.throughput(RESNET, 12, "v100", consolidated=False) == pytest.approx(40.0 * 12 / 8)
    assert perf.throughput("A3C", 4, "v100") == pytest.approx(40.0)
    # k80 at 2 GPUs is 0 in the table: scaled from 1 GPU instead.
    assert perf.throughput(RESNET, 2, "k80") == pytest.approx(12.0)


def test_spread_throughput_falls_back_to_consolidated_when_not_measured_spread(perf):
    # A3C was measured spread only at 1 GPU (meaningless for spreading): use the consolidated.
    assert perf.throughput("A3C", 4, "v100", consolidated=False) == pytest.approx(40.0)
    assert perf.throughput(RESNET, 4, "k80", consolidated=False) == 16.0


def test_duration_is_steps_over_throughput(perf):
    assert perf.duration_s(RESNET, 900, 1, "v100") == pytest.approx(30.0)
    assert perf.duration_s(RESNET, 900, 2, "v100", consolidated=False) == pytest.approx(36.0)
    with pytest.raises(PerfModelError, match="no throughput for 'nope'"):
        perf.duration_s("nope", 10, 1, "v100")


def test_spread_slowdown_from_the_table(perf):
    assert perf.spread_slowdown(RESNET, 1) == 1.0
    assert perf.spread_slowdown(RESNET, 2) == pytest.approx(2.0)
    assert perf.spread_slowdown(RESNET, 4) == 1.0  # spread measured faster: clamped
    assert perf.spread_slowdown(RESNET, 8) == pytest.approx(3.0)
    assert perf.spread_slowdown(RESNET, 16) == pytest.approx(3.0)  # both scaled from 8
    assert perf.spread_slowdown("A3C", 8) == 1.0
    assert perf.spread_slowdown(RESNET, 4, "k80") == 1.0  # no k80 spread table


def test_type_speed_is_a_throughput_ratio(perf):
    assert perf.type_speed(RESNET, 1, "k80", "v100") == pytest.approx(0.2)
    assert perf.type_speed(RESNET, 4, "k80", "v100") == pytest.approx(0.2)
    assert perf.type_speed(RESNET, 1, "a100", "v100") == 1.0
    assert perf.type_speed("nope", 1, "k80", "v100") == 1.0


def test_default_slowdowns_for_duration_traces():
    perf = PerfModel.default_for_durations()
    assert not perf.has_throughputs
    assert perf.spread_slowdown("vgg19", 8) == DEFAULT_SPREAD_SLOWDOWNS["vgg"]
    assert perf.spread_slowdown("AlexNet", 2) == DEFAULT_SPREAD_SLOWDOWNS["alexnet"]
    assert perf.spread_slowdown("resnet152", 4) == DEFAULT_SPREAD_SLOWDOWNS["resnet"]
    assert perf.spread_slowdown("vgg19", 1) == 1.0
    assert perf.spread_slowdown("bert", 8) == 1.0
    assert perf.spread_slowdown("", 8) == 1.0
    # VGG and AlexNet (large skewed tensors) are the sensitive ones, ResNet/Inception barely.
    assert min(perf.slowdown_for("vgg16"), perf.slowdown_for("alexnet")) > max(
        perf.slowdown_for("resnet50"),
        perf.slowdown_for("inception3"),
        perf.slowdown_for("googlenet"),
    )


def test_overrides_merge_and_the_longest_prefix_wins():
    perf = PerfModel.default_for_durations().with_overrides({"VGG16": 3.0, "bert": 1.25})
    assert perf.spread_slowdown("vgg16", 8) == 3.0
    assert perf.spread_slowdown("vgg19", 8) == DEFAULT_SPREAD_SLOWDOWNS["vgg"]
    assert perf.spread_slowdown("bert-large", 8) == 1.25
    assert PerfModel.default_for_durations().spread_slowdown("vgg16", 8) != 3.0  # a copy
    with pytest.raises(PerfModelError, match="must be a number >= 1"):
        perf.with_overrides({"vgg": 0.5})


def test_load_slowdowns_reads_yaml_and_json(tmp_path):
    yaml_file = tmp_path / "slow.yaml"
    yaml_file.write_text("vgg: 2\nResNet: 1.2\n")
    assert load_slowdowns(yaml_file) == {"vgg": 2.0, "resnet": 1.2}
    json_file = tmp_path / "slow.json"
    json_file.write_text('{"alexnet": 1.7}')
    assert load_slowdowns(json_file) == {"alexnet": 1.7}


@pytest.mark.parametrize("content", ["vgg: 0.5\n", "vgg: fast\n", "vgg: .nan\n", "vgg: true\n"])
def test_load_slowdowns_refuses_bad_values_in_one_line(tmp_path, content):
    file = tmp_path / "slow.yaml"
    file.write_text(content)
    with pytest.raises(PerfModelError) as error:
        load_slowdowns(file)
    message = str(error.value)
    assert message.startswith(f"{file}: vgg: must be a number >= 1")
    assert "\n" not in message


def test_load_slowdowns_file_errors(tmp_path):
    with pytest.raises(PerfModelError, match="not found"):
        load_slowdowns(tmp_path / "missing.yaml")
    listing = tmp_path / "list.yaml"
    listing.write_text("- vgg\n")
    with pytest.raises(PerfModelError, match="expected a mapping"):
        load_slowdowns(listing)
    broken = tmp_path / "broken.yaml"
    broken.write_text("vgg: [1,\n")
    with pytest.raises(PerfModelError) as error:
        load_slowdowns(broken)
    assert "\n" not in str(error.value)


def test_table_errors_are_one_line(tmp_path):
    with pytest.raises(PerfModelError, match="not found"):
        PerfModel.from_gavel_table(tmp_path / "none.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(PerfModelError) as error:
        PerfModel.from_gavel_table(bad)
    assert str(error.value).startswith(f"{bad}: cannot read") and "\n" not in str(error.value)
    bad.write_text(json.dumps({"v100": {"ResNet": {"null": 1.0}}}))
    with pytest.raises(PerfModelError, match="bad key 'ResNet'"):
        PerfModel.from_gavel_table(bad)
    bad.write_text(json.dumps({"v100": {key(RESNET, 1): {"null": -1}}}))
    with pytest.raises(PerfModelError, match="non-negative"):
        PerfModel.from_gavel_table(bad)


# -- speed on a placement ---------------------------------------------------------------------


def job(model: str = "", gpus: int = 4, slowdown: float = 1.0) -> Job:
    return Job(
        spec=JobSpec(
            id="j",
            submit_time=0,
            gpus=gpus,
            model=model,
            duration_s=100.0,
            spread_slowdown=slowdown,
        )
    )


def test_speed_of_duration_jobs_depends_only_on_spreading():
    cluster = Cluster.shorthand(2, 4)
    speed = PerfModel.default_for_durations().speed_model(cluster)
    one_node = tuple(cluster.node_gpus[0])
    two_nodes = (
        cluster.node_gpus[0][0],
        cluster.node_gpus[0][1],
        cluster.node_gpus[1][0],
        cluster.node_gpus[1][1],
    )
    assert speed(job("vgg19", slowdown=1.6), one_node) == 1.0
    assert speed(job("vgg19", slowdown=1.6), two_nodes) == pytest.approx(1 / 1.6)
    assert speed(job("", slowdown=1.0), two_nodes) == 1.0


def test_speed_of_gavel_jobs_uses_the_table_on_the_gpu_type_they_landed_on(perf):
    cluster = Cluster.from_nodes(
        [
            NodeDef("v0", 2, "v100"),
            NodeDef("v1", 2, "v100"),
            NodeDef("k0", 2, "k80"),
        ]
    )
    speed = perf.speed_model(cluster)
    v0, v1, k0 = cluster.node_gpus
    gavel = job(RESNET, gpus=2, slowdown=perf.spread_slowdown(RESNET, 2))
    assert speed(gavel, tuple(v0)) == 1.0
    assert speed(gavel, (v0[0], v1[0])) == pytest.approx(0.5)  # v100 spread: 25 vs 50 steps/s
    assert speed(gavel, tuple(k0)) == pytest.approx(12.0 / 50.0)  # k80: 2 x 6 (scaled) vs 50
    # A gang on mixed types runs at its slowest worker's pace (spread across nodes too).
    assert speed(gavel, (v0[0], k0[0])) == pytest.approx(12.0 / 50.0)
    assert speed(gavel, (k0[0], v0[0])) == pytest.approx(12.0 / 50.0)  # the slow one first
    assert speed(gavel, (v1[0], v0[1])) == pytest.approx(0.5)  # asked again: the same


# -- the real table, read-only ------------------------------------------------------------------


def real_table() -> Path:
    path = SHARED_DATA / "gavel-msr" / "simulation_throughputs.json"
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path


def test_real_table_duration_of_resnet18():
    path = real_table()
    raw = json.loads(path.read_text())
    alone = raw["v100"][key(RESNET, 1)]["null"]
    perf = PerfModel.from_gavel_table(path)
    assert perf.duration_s(RESNET, 1000, 1, "v100") == pytest.approx(1000 / alone)
    assert alone == pytest.approx(32.353, abs=1e-3)
    eight = raw["v100"][key(RESNET, 8)]["null"]
    assert perf.duration_s(RESNET, 1000, 16, "v100") == pytest.approx(1000 / (eight * 2))


def test_real_table_spread_slowdowns():
    path = real_table()
    raw = json.loads(path.read_text())
    perf = PerfModel.from_gavel_table(path)
    model = "LM (batch size 20)"
    together = raw["v100"][key(model, 8)]["null"]
    apart = raw["v100_unconsolidated"][key(model, 8)]["null"]
    assert perf.spread_slowdown(model, 8) == pytest.approx(together / apart)
    assert perf.spread_slowdown(model, 8) > 2
    assert perf.spread_slowdown("A3C", 8) == 1.0
