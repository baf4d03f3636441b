"""The compiled build (setup.py): a wheel built where a C compiler is present holds compiled
modules, without being asked to, and they decide exactly as the Python sources do.

Builds the wheel from a copy of this tree (CORRAL_COMPILE unset: the default) with mypyc (about a
minute), unpacks it into a temporary directory and runs the same small simulations with it and
with the sources, each in a process of its own; compares every decision, the rounds and each
job's end, and a copied cluster."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.building import compiler_and_headers, source_copy

REPO = Path(__file__).resolve().parents[2]

#: Run in a child process: each policy and placement on a synthetic overloaded trace (jobs arrive
#: faster than the cluster serves them, so las and gittins preempt); prints whether the core is
#: compiled and, per run, its decisions, rounds, preemptions and each job's end.
SCRIPT = r"""
import json, random, sys
import corral.core.scheduler
from corral.core import Cluster, JobSpec, Scheduler
from corral.core.compiled import compiled_core
from corral.core.placement import make_placement
from corral.core.policy import make_policy
from corral.sim.engine import Simulation
from corral.sim.traces.base import _moved

def trace(jobs, seed):
    rng = random.Random(seed)
    clock = 0.0
    for i in range(jobs):
        clock += rng.expovariate(1 / 60.0)
        yield JobSpec(
            id=f"j{i:04d}",
            submit_time=round(clock, 3),
            gpus=rng.choice((1, 1, 1, 2, 4, 8, 8, 16)),
            duration_s=round(rng.lognormvariate(7.0, 1.5), 3),
        )

runs = {}
for policy, placement in (("las", "relax"), ("gittins", "consolidate"), ("fifo", "yarn"),
                          ("srtf", "any")):
    options = {}
    if policy == "gittins":
        options["service_samples_gpu_s"] = [s.gpus * s.duration_s for s in trace(500, 9)]
    scheduler = Scheduler(Cluster.shorthand(8, 8, racks=2), make_policy(policy, **options),
                          make_placement(placement), restore_s=30.0)
    result = Simulation(list(trace(300, 1)), scheduler, record_decisions=True).run()
    runs[f"{policy}+{placement}"] = {
        "decisions": [[now, repr(action)] for now, action in result.decisions],
        "rounds": result.rounds,
        "preemptions": result.preemptions,
        "ends": sorted([job.id, job.finished_at] for job in result.jobs),
    }
import copy
cluster = Cluster.shorthand(2, 4)
cluster.allocate([1, 2])
twin = copy.deepcopy(cluster)  # the live manager copies its cluster (Cluster.__deepcopy__)
twin.release([1])
# a trace's move of a job to its submit time (`JobSpec.moved`, natively built when compiled)
moved = _moved(JobSpec(id="m", submit_time=10.0, gpus=2, duration_s=5.0, deadline=25.0), 40.0)
# what `corral simulate --workers` sends back from a worker: the run's result, pickled
import pickle
back = pickle.loads(pickle.dumps(result))
print(json.dumps({
    "pickled": {
        "ends": sorted([job.id, job.finished_at] for job in back.jobs),
        "specs": [job.spec == kept.spec for job, kept in zip(back.jobs, result.jobs)],
        "decisions": [[now, repr(action)] for now, action in back.decisions],
        "rounds": back.rounds,
    },
    "moved": [moved.id, moved.submit_time, moved.deadline, moved.gpus],
    "copy": [list(cluster.gpu_free), list(twin.gpu_free), twin.free_gpus],
    "compiled": compiled_core(),
    "scheduler": corral.core.scheduler.__file__,
    "runs": runs,
}))
"""


@pytest.fixture(scope="module")
def compiled_site() -> Iterator[Path]:
    """A directory holding the compiled wheel of this tree, unpacked."""
    if not compiler_and_headers():
        pytest.skip("no C compiler or Python headers: the build here is pure Python")
    work = Path(tempfile.mkdtemp(prefix="corral-compiled-"))
    try:
        source = source_copy(work / "src")
        built = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
            + ["--wheel-dir", str(work / "wheel"), str(source)],
            env={name: value for name, value in os.environ.items() if name != "CORRAL_COMPILE"},
            capture_output=True,
            text=True,
        )
        assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
        (wheel,) = (work / "wheel").glob("corral-*.whl")
        site = work / "site"
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)
        yield site
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _simulate(path: Path) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=path,  # the first entry of sys.path: its corral is the one imported
        env={**os.environ, "PYTHONPATH": str(path)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout)
    return result


@pytest.fixture(scope="module")
def both(compiled_site: Path) -> tuple[dict[str, object], dict[str, object]]:
    """The script's output with the compiled build and with the sources."""
    return _simulate(compiled_site), _simulate(REPO)


def test_the_compiled_build_decides_as_the_sources_do(
    compiled_site: Path, both: tuple[dict[str, object], dict[str, object]]
) -> None:
    compiled, pure = both
    assert compiled["compiled"] is True, compiled["scheduler"]
    assert str(compiled["scheduler"]).startswith(str(compiled_site))
    assert pure["compiled"] is False, pure["scheduler"]
    assert compiled["moved"] == pure["moved"] == ["m", 40.0, 55.0, 2]
    assert compiled["copy"] == pure["copy"] == [[1, 0, 0, 1] + [1] * 4, [1, 1, 0, 1] + [1] * 4, 7]
    runs = pure["runs"]
    assert isinstance(runs, dict)
    assert runs["las+relax"]["preemptions"] > 0 and runs["gittins+consolidate"]["preemptions"] > 0
    for name, run in runs.items():
        assert compiled["runs"][name] == run, name  # type: ignore[index]


def test_a_compiled_result_travels_by_pickle(
    both: tuple[dict[str, object], dict[str, object]],
) -> None:
    """`corral simulate --workers` sends each run's result (jobs, specs, decisions) back from
    its worker by pickle: the compiled classes must come back whole, as the Python ones do."""
    compiled, pure = both
    last = pure["runs"]["srtf+any"]  # type: ignore[index]
    for side in (compiled, pure):
        back = side["pickled"]
        assert back["ends"] == last["ends"] and back["rounds"] == last["rounds"]  # type: ignore[index]
        assert back["decisions"] == last["decisions"]  # type: ignore[index]
        assert back["specs"] == [True] * 300  # type: ignore[index]
