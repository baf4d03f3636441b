"""The Gavel-MSR data-set table, the IO demand it gives, and `corral simulate` with node caches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from corral.core.framework import STAGES, config_from_mapping
from corral.core.job import JobSpec
from corral.core.stages import Stage
from corral.sim.datasets import DATASETS, data_of, reads_for
from corral.sim.perfmodel import PerfModel
from corral.sim.runner import RunSettings, SimulationError, run_simulations

RESNET = "ResNet-50 (batch size 64)"


def perf() -> PerfModel:
    return PerfModel({"v100": {RESNET: ((1, 4.0), (8, 16.0)), "A3C": ((1, 7.0),)}})


def job(model: str, gpus: int = 1, vc: str = "default") -> JobSpec:
    return JobSpec(id="j", submit_time=0, gpus=gpus, model=model, vc=vc)


def test_job_types_map_to_data_sets():
    assert data_of(RESNET) == ("imagenet", 64, 1)
    assert data_of("LM (batch size 20)") == ("wikitext2", 20, 35)
    assert data_of("CycleGAN") == ("monet2photo", 1, 2)
    assert data_of("A3C") is None  # plays Pong: no data set
    assert data_of("vgg16") is None  # not a Gavel model
    assert data_of("ResNet-50 (batch size x)") is None  # malformed batch: not recognised
    assert {"imagenet", "cifar10", "multi30k", "wikitext2", "ml20m", "monet2photo"} == set(DATASETS)


def test_io_demand_is_the_data_set_over_an_epoch_at_the_tables_throughput():
    reads = reads_for(perf())
    # 1 GPU: 4 steps/s x 64 images = 256 images/s; an image is 140 GB / 1,281,167 = 109.3 KB:
    # 0.027974 GB/s. 8 GPUs: 16 x 64 = 1024 images/s = 0.111896 GB/s, 0.013987 per GPU.
    one = reads(job(RESNET))
    assert one is not None and one.dataset == "imagenet" and one.size_gb == 140.0
    assert one.gb_s_per_gpu == pytest.approx(256 * 140 / 1_281_167)
    assert one.gb_s_per_gpu == pytest.approx(0.027974, abs=1e-6)
    eight = reads(job(RESNET, gpus=8))
    assert eight is not None and eight.gb_s_per_gpu == pytest.approx(0.013987, abs=1e-6)
    assert reads(job("A3C")) is None
    assert reads(job("")) is None
    assert reads(job("LM (batch size 20)")) is None  # a model the table lacks reads nothing


def test_per_vc_scope_gives_each_team_its_own_copy():
    reads = reads_for(perf(), "per-vc")
    first, second = reads(job(RESNET, vc="t1")), reads(job(RESNET, vc="t2"))
    assert first is not None and second is not None
    assert (first.dataset, second.dataset) == ("imagenet@t1", "imagenet@t2")
    assert first.gb_s_per_gpu == second.gb_s_per_gpu


def write_gavel(tmp_path: Path) -> str:
    """Two 1-GPU ResNet-50 jobs of 40,000 steps (10,000 s at 4 steps/s) on one 1-GPU node."""
    table = {"v100": {str((RESNET, 1)): {"null": 4.0}}}
    (tmp_path / "simulation_throughputs.json").write_text(json.dumps(table))
    traces = tmp_path / "traces"
    traces.mkdir(exist_ok=True)
    line = f"{RESNET}\tcd x\t--steps\t1\t40000\t{{at}}\t1\n"
    (traces / "vc.trace").write_text(line.format(at=0) + line.format(at=0))
    return f"gavel:{traces}"


def simulate(
    tmp_path: Path, scheduler: dict[str, object] | None = None, **options: object
) -> dict[str, object]:
    settings = RunSettings(
        trace=write_gavel(tmp_path),
        nodes=1,
        gpus_per_node=1,
        scheduler=config_from_mapping(scheduler),
        **options,  # type: ignore[arg-type]
    )
    (summary,) = run_simulations(
        settings, out=tmp_path / "out", plot=False, console=Console(quiet=True)
    )
    return summary


def test_simulate_with_node_caches_reports_hits_and_speed(tmp_path):
    # One GPU, fifo, 0.1 Gbit/s = 0.0125 GB/s of storage; the jobs read 0.027974 GB/s at full
    # speed, so storage alone allows 0.44684. A 140 GB cache holds all of ImageNet: job 1 runs
    # its first epoch (140 / 0.027974 = 5004.6 ideal s) at 0.44684, a stall of
    # 5004.6 x (1 / 0.44684 - 1) = 6195.4 s, then runs at full speed: ends at 16195.4 s. Job 2
    # finds the cache warm: ends 10,000 s later. Reads: job 1's first epoch misses.
    summary = simulate(
        tmp_path,
        policies=["fifo"],
        scheduler={"placement": "cache-aware"},
        cache_gb_per_node=140.0,
        storage_gbps=0.1,
        cache_policy="silod",
    )
    share = 0.0125 / (4 * 64 * 140 / 1_281_167)
    stall = 140 / (4 * 64 * 140 / 1_281_167) * (1 / share - 1)
    assert stall == pytest.approx(6195.4, abs=0.1)
    assert summary["makespan_s"] == pytest.approx(20000 + stall)
    assert summary["cache_hit_ratio"] == pytest.approx(1 - 5004.6 / 20000, abs=1e-4)
    assert summary["avg_speed"] == pytest.approx(20000 / (20000 + stall))
    assert summary["first_epoch_stall_gpu_h"] == pytest.approx(stall / 3600)
    # Without a cache model the same jobs take 10,000 s each, and the summary has no cache keys.
    plain = simulate(tmp_path, policies=["fifo"])
    assert plain["makespan_s"] == pytest.approx(20000) and "cache_hit_ratio" not in plain


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"scheduler": {"placement": "cache-aware"}},
            "placement cache-aware: needs node data cach",
        ),
        ({"cache_gb_per_node": -1.0}, "--cache-gb-per-node: must not be negative"),
        ({"cache_gb_per_node": 1.0, "storage_gbps": 0.0}, "--storage-gbps: must be positive"),
        ({"cache_gb_per_node": 1.0, "cache_policy": "arc"}, "--cache-policy: unknown 'arc'"),
        ({"cache_gb_per_node": 1.0, "datasets": "team"}, "--datasets: unknown 'team'"),
        (
            {"cache_gb_per_node": 1.0, "scheduler": {"admission": "hived"}},
            "admission hived does not run with cache",
        ),
        (
            {"cache_gb_per_node": 1.0, "scheduler": {"stages": ["packing"]}},
            "^--cache-gb-per-node: not supported with the packing stage \\(it lets jobs share GPUs",
        ),
        (
            {"cache_gb_per_node": 1.0, "private_baseline": True},
            "^--cache-gb-per-node: not supported with --private-baseline$",
        ),
    ],
)
def test_bad_cache_options_are_refused_naming_the_option(tmp_path, options, message):
    with pytest.raises(SimulationError, match=message):
        simulate(tmp_path, **options)


class Cohabit(Stage):
    """A stage of this test's that lets jobs share GPUs (and does nothing else)."""

    name = "cohabit"
    shares_gpus = True


def test_the_cache_is_refused_with_any_stage_that_lets_jobs_share_gpus(tmp_path, monkeypatch):
    monkeypatch.setitem(STAGES, "cohabit", Cohabit)
    with pytest.raises(SimulationError) as refused:
        simulate(tmp_path, {"stages": ["migration", "cohabit"]}, cache_gb_per_node=1.0)
    assert str(refused.value) == (
        "--cache-gb-per-node: not supported with the cohabit stage (it lets jobs share GPUs, "
        "at speeds it sets)"
    )
