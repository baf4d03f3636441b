"""Print a hash of every decision (start and preemption, with its instant) of many simulations, to
check that a change meant to be decision-neutral (a refactoring, a speed-up) is: run it before and
after the change and compare, or compare with the reference kept beside this script
(`--check`, which prints the lines that differ and exits 1 if any does).

Two parts:

* classic: policies las, gittins and fifo x placements any, consolidate, relax and yarn x load
  0.6 and 1.2; 4,000 jobs of benchmarks/sim_preemption_heavy.py's Philly-like workload (seed 3;
  gittins learns from 2,000 jobs of seed 9) on 40 nodes x 8 GPUs in 5 racks, restore cost 30 s,
  each a `Scheduler` built directly.
* framework: every registered policy, placement, admission scheme and round stage, and every
  option of theirs (and of the core and the retry rule) that changes decisions set to a value
  other than its default, each run through the simulator's own assembly (`corral simulate`'s
  `corral.sim.runner`, the plugin framework) on small cuts of the shared data: Gavel's
  Philly-derived trace (one VC on 6 x 8 GPUs; three VCs under a cluster config of VCs; the
  heterogeneous cluster of docs/examples/hetero-gavel.yaml) and Alibaba's openb (jobs taking
  shares of GPUs). Each line hashes the decisions and every job's end (status and instant).

`--list` prints the runs' names; `--only SUBSTRING` runs those whose name contains it. The shared
data (../shared/data) is found as the simulator finds it: beside the working directory's project
or beside this repository. About two minutes of CPU, run in `--jobs` processes (2).

Run: .venv/bin/python scripts/decision_hashes.py [--check] > hashes.txt
"""

from __future__ import annotations

import argparse
import hashlib
import io
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from rich.console import Console  # noqa: E402
from sim_preemption_heavy import workload  # noqa: E402

from corral.core import Cluster, Scheduler  # noqa: E402
from corral.core.framework import config_from_mapping, merge  # noqa: E402
from corral.core.placement import make_placement  # noqa: E402
from corral.core.policy import make_policy  # noqa: E402
from corral.core.presets import TIRESIAS  # noqa: E402
from corral.sim.engine import Simulation  # noqa: E402
from corral.sim.result import SimResult  # noqa: E402
from corral.sim.runner import RunSettings, shared_data_file, simulate_results  # noqa: E402

EXPECTED = HERE / "decision_hashes.expected"


def digest(result: SimResult) -> str:
    ends = [(job.id, job.status.value, job.finished_at) for job in result.jobs]
    return hashlib.sha1(repr((result.decisions, ends)).encode()).hexdigest()[:12]


def classic() -> Iterator[tuple[str, str]]:
    for policy in ("las", "gittins", "fifo"):
        for placement in ("relax", "consolidate", "any", "yarn"):
            for load in (0.6, 1.2):
                name = f"{policy} {placement} {load}"
                yield name, name


def run_classic(name: str) -> str:
    policy, placement, load_text = name.split()
    load = float(load_text)
    cluster = Cluster.shorthand(40, 8, racks=5)
    shape = dict(load=load, gpus=cluster.total_gpus, diurnal=0.9, cap_s=48 * 3600.0)
    options: dict[str, object] = {}
    if policy == "gittins":
        history = workload(2000, seed=9, **shape)  # type: ignore[arg-type]
        options["service_samples_gpu_s"] = [s.gpus * (s.duration_s or 0) for s in history]
    jobs = list(workload(4000, seed=3, **shape))  # type: ignore[arg-type]
    core = Scheduler(
        cluster, make_policy(policy, **options), make_placement(placement), restore_s=30.0
    )
    result = Simulation(jobs, core, record_decisions=True).run()
    digest = hashlib.sha1(repr(result.decisions).encode()).hexdigest()[:12]
    return f"{len(result.decisions)} decisions, {result.preemptions} preemptions, {digest}"


# -- the framework's runs ----------------------------------------------------------------------

#: The traces cut from the shared data: (gavel VC file, first lines kept).
ONE_VC = ("6214e9", 300)
SMALL = ("6214e9", 120)
THREE_VCS = (("6214e9", 120), ("11cb48", 120), ("ee9e8c", 120))
HETERO_VC = ("b436b2", 250)
#: openb: every Nth node and pod of the gpushare40 variant.
OPENB_EVERY = (10, 8)


@dataclass(frozen=True, slots=True)
class Run:
    name: str
    trace: str  # "one", "small", "short", "vcs", "tree", "hetero", "openb"
    policy: str = "las"
    scheduler: dict[str, object] = field(default_factory=dict)
    settings: dict[str, object] = field(default_factory=dict)


def framework_runs() -> list[Run]:
    runs: list[Run] = []

    def add(name: str, trace: str = "one", policy: str = "las", **kw: object) -> None:
        scheduler = dict(kw.pop("scheduler", {}))  # type: ignore[call-overload]
        settings = dict(kw.pop("settings", {}))  # type: ignore[call-overload]
        assert not kw, kw
        runs.append(Run(name, trace, policy, scheduler, settings))

    # Every policy (admission none, placement relax), then each option of each.
    for policy in ("fifo", "sjf", "srtf", "las", "gittins", "edf"):
        add(f"policy {policy}", policy=policy)
    add("policy timeslice", "short", "timeslice")
    add("policy fifo backfill", policy="fifo", scheduler={"backfill": True})
    add(
        "policy fifo backfill easy",
        policy="fifo",
        scheduler={"backfill": "easy"},
        settings={"time_limit_factor": 1.5},
    )
    add("las thresholds", scheduler={"las": {"thresholds_gpu_s": [600, 6000, 60000]}})
    add("las starvation", scheduler={"las": {"starvation_factor": 2.0}})
    add("las within queue", scheduler={"las": {"preempt_within_queue": True}})
    add("las started order", scheduler={"las": {"queue_order": "started"}})
    add("las demote at rounds", scheduler={"las": {"demote_at_rounds": True}})
    add("las victims in-order", scheduler={"victims": "in-order"})
    add("las restore 0", scheduler={"restore_s": 0.0})
    add("las preempt exempt 600", scheduler={"preempt_exempt_s": 600.0})
    add(
        "las victims in-order preempt exempt 600",
        scheduler={"victims": "in-order", "preempt_exempt_s": 600.0},
    )
    add("gittins thresholds", "one", "gittins", scheduler={"gittins": {"thresholds_gpu_s": [900]}})
    add("gittins quantiles", "one", "gittins", scheduler={"gittins": {"quantiles": 4}})
    add(
        "gittins queues",
        "one",
        "gittins",
        scheduler={"gittins": {"queues": True, "thresholds_gpu_s": [900, 9000]}},
    )
    add("gittins delta", "one", "gittins", scheduler={"gittins": {"delta_gpu_s": 3250.0}})
    add(
        "gittins tiresias",
        "one",
        "gittins",
        scheduler={"gittins": {"formula": "tiresias", "delta_gpu_s": 3250.0}},
    )
    add("gittins demote", "one", "gittins", scheduler={"gittins": {"demote_at_rounds": True}})
    add("gittins victims in-order", "one", "gittins", scheduler={"victims": "in-order"})
    add("gittins preempt exempt 600", "one", "gittins", scheduler={"preempt_exempt_s": 600.0})
    for key, value in (
        ("converge_fraction", 0.2),
        ("max_points", 4),
        ("refit_min_s", 30.0),
    ):
        add(f"optimus {key}", "short", "optimus", scheduler={"optimus": {key: value}})
    # refit_growth decides only once a job ran refit_min_s / refit_growth (beyond 600 s).
    add(
        "optimus refit_growth",
        "short",
        "optimus",
        scheduler={"optimus": {"refit_min_s": 30.0, "refit_growth": 3.0}},
    )
    add("policy optimus short", "short", "optimus")
    add("timeslice quantum", "short", "timeslice", scheduler={"timeslice": {"quantum_s": 120.0}})
    add("elasticflow", "small", "elasticflow")
    add(
        "elasticflow no migrate",
        "small",
        "elasticflow",
        scheduler={"elasticflow": {"migrate": False}},
    )
    # Every placement of whole GPUs, and its options.
    for placement in ("consolidate", "profile", "any", "yarn"):  # relax: the runs above
        for policy in ("las", "fifo"):
            add(
                f"placement {placement} {policy}", policy=policy, scheduler={"placement": placement}
            )
    add("relax after", scheduler={"placement": "relax", "relax": {"after_s": 60.0}})
    add(
        "profile sensitive",
        scheduler={"placement": "profile", "profile": {"sensitive_above": 1.02}},
    )
    for policy in ("las", "fifo"):
        add(f"placement hetero {policy}", "hetero", policy, scheduler={"placement": "hetero"})
    hetero = {"placement": "hetero"}
    add("hetero fairness", "hetero", scheduler=hetero | {"hetero": {"fairness": 0.8}})
    add("hetero max jobs", "hetero", scheduler=hetero | {"hetero": {"max_jobs": 2}})
    add("hetero relax after", "hetero", scheduler=hetero | {"hetero": {"relax_after_s": 30.0}})
    cache = {"cache_gb_per_node": 20.0, "cache_policy": "silod"}
    add("placement cache-aware", scheduler={"placement": "cache-aware"}, settings=cache)
    add(
        "cache lru consolidate",
        scheduler={"placement": "consolidate"},
        settings={"cache_gb_per_node": 20.0},
    )
    # Placements of shares of GPUs (openb), and their options.
    for placement in ("fgd", "best-fit", "random-fit", "gpu-packing", "gpu-packing-cpu"):
        add(f"placement {placement}", "openb", "fifo", scheduler={"placement": placement})
    add("fgd coverage", "openb", "fifo", scheduler={"placement": "fgd", "fgd": {"coverage": 0.5}})
    add(
        "random-fit seed",
        "openb",
        "fifo",
        scheduler={"placement": "random-fit", "random-fit": {"seed": 7}},
    )
    # Every admission over three VCs, and its options; opportunistic jobs with each that has them.
    for admission in ("none", "quota", "fairshare", "hived"):
        for policy in ("fifo", "las"):
            add(
                f"admission {admission} {policy}",
                "vcs",
                policy,
                scheduler={"placement": "consolidate", "admission": admission},
            )
    for admission in ("quota", "fairshare", "hived"):
        add(
            f"admission {admission} opportunistic",
            "vcs",
            "las",
            scheduler={"placement": "consolidate", "admission": admission},
            settings={"opportunistic_share": 0.3},
        )
    for section, key, value in (
        ("quota", "oversubscribe", False),
        ("quota", "lend_last", False),
        ("fairshare", "weights", ["6214e9=3", "11cb48=1", "ee9e8c=1"]),
        ("fairshare", "half_life_s", 0.0),
        ("hived", "lend", False),
    ):
        for policy in ("fifo", "las"):
            add(
                f"{section} {key} {policy}",
                "vcs",
                policy,
                scheduler={"placement": "consolidate", "admission": section, section: {key: value}},
            )
    add(
        "quota no oversubscribe opportunistic",
        "vcs",
        "las",
        scheduler={
            "placement": "consolidate",
            "admission": "quota",
            "quota": {"oversubscribe": False},
        },
        settings={"opportunistic_share": 0.3},
    )
    add(
        "admission quota migration",
        "vcs",
        "las",
        scheduler={"placement": "consolidate", "admission": "quota", "stages": ["migration"]},
    )
    hetero_migration = {"placement": "consolidate", "stages": ["migration"]}
    add("stages migration hetero srtf", "hetero", "srtf", scheduler=hetero_migration)
    add(
        "migration max_plans_per_round",
        "hetero",
        "srtf",
        scheduler=hetero_migration | {"migration": {"max_plans_per_round": 1}},
    )
    # Every round stage, and its options (packing's `unmeasured` decides only live: the
    # simulator's pair table is complete, a pair it lacks never packs).
    base = {"placement": "consolidate"}
    for stages in (["packing"], ["migration"], ["packing", "migration"]):
        for policy in ("las", "fifo"):
            add(
                f"stages {'+'.join(stages)} {policy}",
                policy=policy,
                scheduler=base | {"stages": stages},
            )
    for key, value in (("threshold", 1.3), ("max_tries_per_round", 1)):
        add(f"packing {key}", scheduler=base | {"stages": ["packing"], "packing": {key: value}})
    for key, value in (("max_moves", 1), ("max_nodes", 1)):
        for policy in ("las", "fifo"):
            add(
                f"migration {key} {policy}",
                policy=policy,
                scheduler=base | {"stages": ["migration"], "migration": {key: value}},
            )
    # The tiresias preset (the Tiresias simulator's rules: in-order victims, its queues).
    for policy in ("las", "gittins"):
        add(
            f"preset tiresias {policy}",
            policy=policy,
            scheduler=merge(TIRESIAS.scheduler, TIRESIAS.by_policy[policy]),
            settings={"spread_slowdown": False, "gittins_history": "tiresias/yarn-gput1000.csv"},
        )
    # Pre-runs and the retry rule, under Philly's failure classes.
    philly = {"failure_model": "philly", "checkpoint_every_s": 3600.0}
    add("failures philly", settings=philly)
    add("precheck", scheduler={"precheck_s": 300.0}, settings=philly)
    add("precheck fifo", policy="fifo", scheduler={"precheck_s": 300.0}, settings=philly)
    add(
        "precheck quota",
        "vcs",
        "las",
        scheduler={"precheck_s": 300.0, "admission": "quota"},
        settings=philly,
    )
    add(
        "precheck hived",
        "vcs",
        "las",
        scheduler={"precheck_s": 300.0, "admission": "hived"},
        settings=philly,
    )
    for key, value in (
        ("backoff_s", 60.0),
        ("backoff_max_s", 6.0),
        ("fast_fail_s", 600.0),
        ("fast_fail_repeats", 0),
    ):
        add(f"retry {key}", scheduler={"retry": {key: value}}, settings=philly)
    # Hierarchical queues: the three VCs, two of them under a department (quota, weights,
    # limits at each level), lending across and, without oversubscription, only within.
    for policy in ("las", "fifo"):
        add(f"queues quota {policy}", "tree", policy, scheduler={"admission": "quota"})
    add(
        "queues quota no oversubscribe",
        "tree",
        "las",
        scheduler={"admission": "quota", "quota": {"oversubscribe": False}},
    )
    return runs


def cut(source: Path, target: Path, keep: int, every: int = 1) -> None:
    lines = source.read_text(encoding="utf-8").splitlines(keepends=True)
    if every > 1:  # a CSV: keep the header
        lines = [lines[0], *lines[1::every]]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("".join(lines[:keep]), encoding="utf-8")


def prepare_traces(data: Path, tmp: Path) -> dict[str, dict[str, object]]:
    """Each trace's `RunSettings` arguments, its files written under `tmp`."""
    gavel = data / "gavel-msr"
    table = (gavel / "simulation_throughputs.json").read_text(encoding="utf-8")
    traces: dict[str, dict[str, object]] = {}
    for name, files in (
        ("one", (ONE_VC,)),
        ("small", (SMALL,)),
        ("vcs", THREE_VCS),
        ("hetero", (HETERO_VC,)),
    ):
        root = tmp / name
        for vc, keep in files:
            cut(gavel / "seed0" / f"{vc}.trace", root / "seed0" / f"{vc}.trace", keep)
        (root / "simulation_throughputs.json").write_text(table, encoding="utf-8")
        traces[name] = {"trace": f"gavel:{root / 'seed0'}"}
    traces["one"] |= {"nodes": 6, "gpus_per_node": 8, "racks": 2, "arrival_scale": 0.5}
    traces["small"] |= {"nodes": 3, "gpus_per_node": 8, "arrival_scale": 0.5}
    tiresias = data / "tiresias" / "60_job.csv"
    traces["short"] = {
        "trace": f"tiresias:{tiresias}",
        "nodes": 1,
        "gpus_per_node": 8,
        "arrival_scale": 0.3,
    }
    vcs = {
        "cell_types": {
            "V100-NODE": {"child": "V100", "count": 8, "node": True},
            "V100-RACK": {"child": "V100-NODE", "count": 2},
        },
        "physical_cells": [{"type": "V100-RACK", "count": 3}],
        "virtual_clusters": {
            "6214e9": {"V100-NODE": 2},
            "11cb48": {"V100-NODE": 1},
            "ee9e8c": {"V100-RACK": 1},
        },
    }
    config = tmp / "vcs.yaml"
    config.write_text(yaml.safe_dump(vcs), encoding="utf-8")
    traces["vcs"] |= {"config": config, "arrival_scale": 0.3}
    tree = vcs | {
        "virtual_clusters": {
            "6214e9": {"cells": {"V100-NODE": 2}, "parent": "research"},
            "11cb48": {"cells": {"V100-NODE": 1}, "parent": "research", "weight": 3, "limit": 20},
            "ee9e8c": {"cells": {"V100-RACK": 1}, "limit": 32},
        },
        "departments": {"research": {"quota": 28, "weight": 2, "limit": 40}},
    }
    config = tmp / "tree.yaml"
    config.write_text(yaml.safe_dump(tree), encoding="utf-8")
    traces["tree"] = traces["vcs"] | {"config": config}
    traces["hetero"] |= {
        "config": ROOT / "docs" / "examples" / "hetero-gavel.yaml",
        "arrival_scale": 0.5,
        "skip_oversized": True,
    }
    openb = data / "alibaba-openb"
    nodes, pods = tmp / "openb-nodes.csv", tmp / "openb-pods.csv"
    cut(openb / "openb_node_list_gpu_node.csv", nodes, 10**9, OPENB_EVERY[0])
    cut(openb / "openb_pod_list_gpushare40.csv", pods, 10**9, OPENB_EVERY[1])
    traces["openb"] = {"trace": f"openb:{nodes},{pods}"}
    traces["data"] = {"path": str(data)}
    return traces


def run_framework(run: Run, traces: dict[str, dict[str, object]]) -> str:
    extra = dict(run.settings)
    if "gittins_history" in extra:  # in the shared data directory
        extra["gittins_history"] = Path(str(traces["data"]["path"])) / str(extra["gittins_history"])
    settings = RunSettings(
        **traces[run.trace],  # type: ignore[arg-type]
        policies=[run.policy],
        scheduler=config_from_mapping(run.scheduler),
        decisions=True,
        **extra,  # type: ignore[arg-type]
    )
    (result,) = simulate_results(settings, Console(file=io.StringIO()))
    ended = sum(1 for job in result.jobs if job.finished_at is not None)
    return (
        f"{len(result.decisions)} decisions, {result.preemptions} preemptions, "
        f"{ended} ended, {digest(result)}"
    )


def compute(name: str, run: Run | None, traces: dict[str, dict[str, object]]) -> tuple[str, float]:
    """One run's line (in a worker process) and the CPU seconds it took."""
    started = time.process_time()
    value = run_classic(name) if run is None else run_framework(run, traces)
    return value, time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help=f"compare with {EXPECTED.name}")
    parser.add_argument("--list", action="store_true", help="print the runs' names only")
    parser.add_argument("--only", default="", help="run only the runs whose name contains this")
    parser.add_argument("--data", type=Path, help="the shared data directory")
    parser.add_argument("--times", action="store_true", help="print each run's CPU seconds too")
    parser.add_argument("--jobs", type=int, default=2, help="runs side by side (processes)")
    args = parser.parse_args()
    names = [name for name, _ in classic()] + [f"fw {run.name}" for run in framework_runs()]
    if len(set(names)) != len(names):
        raise SystemExit("two runs of one name")
    if args.list:
        print("\n".join(names))
        return
    data = args.data
    if data is None:
        found = shared_data_file("gavel-msr/simulation_throughputs.json")
        if found is None:
            raise SystemExit("the shared data (../shared/data) is not found; pass --data")
        data = found.parent.parent
    expected: dict[str, str] = {}
    if args.check:
        for line in EXPECTED.read_text(encoding="utf-8").splitlines():
            name, _, value = line.partition(": ")
            expected[name] = value
    differ = 0

    def report(name: str, value: str, seconds: float) -> None:
        nonlocal differ
        if args.times:
            value = f"{value} [{seconds:.2f} s]"
        if not args.check:
            print(f"{name}: {value}", flush=True)
        elif expected.get(name) != value:
            differ += 1
            print(f"DIFFERS {name}: {value} (expected {expected.get(name)})", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        traces = prepare_traces(data, Path(tmp))
        tasks: list[tuple[str, Run | None]] = [
            (name, None) for name, _ in classic() if args.only in name
        ]
        tasks += [
            (f"fw {run.name}", run) for run in framework_runs() if args.only in f"fw {run.name}"
        ]
        with ProcessPoolExecutor(max(1, args.jobs)) as pool:
            futures = [pool.submit(compute, name, run, traces) for name, run in tasks]
            for (name, _), future in zip(tasks, futures, strict=True):
                report(name, *future.result())
    if args.check:
        print(f"{differ} of the runs differ from {EXPECTED.name}")
        sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
