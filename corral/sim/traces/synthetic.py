"""A Philly-like workload generator: `synthetic:jobs=1000,load=0.9,gpus=512`.

* Job sizes follow the GPU-count mix of the Philly-derived Gavel/MSR trace (below).
* Run times follow Philly's: by default drawn from the empirical quantile table of
  `corral.sim.traces.philly_runtimes`, fitted by `scripts/fit_philly_runtimes.py` to the 83,152
  positive run times of `philly_runtime.csv` (alibaba/clusterdata,
  cluster-trace-gpu-v2020/analysis/philly_runtime.csv), the jobs of Microsoft's Philly cluster of
  Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training Workloads",
  USENIX ATC 2019: inverse-transform sampling, log(run time) linear between the table's
  quantiles (mean 14,739 s against the data's 14,614 s, median 1,187 s against 1,186 s, the two
  CDFs at most 0.8 % apart), so no data file is needed. With `runtimes=PATH` (a CSV with a
  `runtime` column, such as that file) they are drawn with replacement from the file's positive
  values instead. Either way independently of the size (the file does not pair run times with
  GPU counts).
* Arrivals are Poisson with rate lambda = load * gpus / mean(gpus_per_job * runtime), so that the
  GPU-seconds offered per second are `load` times a cluster of `gpus` GPUs. The mean is taken over
  the generated jobs themselves, not the whole population: Philly run times are heavy-tailed (mean
  about 4 h, median 20 min, longest 53 days), and a rate set from the population mean would let a
  1,000-job trace's offered load swing by tens of percent from the `load` asked for.

Keys: jobs (default 1000), load (0.8), gpus (512), seed (the `seed` argument), max_gpus (sizes
above it are cut down to it; default no cap), runtimes (path of a runtime CSV with a `runtime`
column; default the fitted table), models (`none`, the default: no model, spread slowdown 1.0; or `mix`: each job trains one
of the ten models of Tiresias's 60_job.csv, uniformly, so that the `profile` placement has
placement-sensitive jobs to tell apart). Everything is drawn from one numpy Generator seeded by
`seed`, in a fixed order (sizes, run times, gaps, models): the same keys give the same trace.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral.core.job import JobSpec
from corral.core.text import count_noun
from corral.sim.perfmodel import PerfModel
from corral.sim.traces.base import (
    Trace,
    TraceError,
    TraceFormat,
    csv_records,
    default_perf,
    integer,
    number,
)
from corral.sim.traces.philly_runtimes import PHILLY_RUNTIME_QUANTILES

if TYPE_CHECKING:
    import numpy as np

# Number of jobs of each GPU count in the Gavel/MSR Philly-derived workload
# (stanford-futuredata/gavel, scheduler/traces/msr/seed=0/*.trace, column 7 "scale_factor"),
# counted over its 15,264 jobs: 68.66% use 1 GPU, 3.03% 2, 13.39% 4, 12.55% 8, 1.67% 16, 0.60% 32,
# and the rest (7, 12, 20, 24, 64 GPUs) together 0.10%.
GAVEL_MSR_GPU_COUNTS: dict[int, int] = {
    1: 10480,
    2: 463,
    4: 2044,
    7: 2,
    8: 1916,
    12: 6,
    16: 255,
    20: 1,
    24: 5,
    32: 91,
    64: 1,
}

# The models of Tiresias's 60_job.csv, each used equally often there.
MIX_MODELS = (
    "alexnet",
    "googlenet",
    "inception3",
    "inception4",
    "resnet50",
    "resnet101",
    "resnet152",
    "vgg11",
    "vgg16",
    "vgg19",
)

RUNTIME_FILE = Path("shared") / "data" / "philly" / "philly_runtime.csv"
KEYS = ("jobs", "load", "gpus", "seed", "max_gpus", "runtimes", "models")


def read(location: str, *, perf: PerfModel | None = None, seed: int = 0, **options: Any) -> Trace:
    import numpy as np

    keys = _parse_keys(location, options)
    where = "synthetic"
    jobs = integer(keys.get("jobs", 1000), where, "jobs", positive=True)
    load = number(keys.get("load", 0.8), where, "load", positive=True)
    cluster_gpus = integer(keys.get("gpus", 512), where, "gpus", positive=True)
    seed = integer(keys.get("seed", seed), where, "seed")
    cap = keys.get("max_gpus")
    max_gpus = integer(cap, where, "max_gpus", positive=True) if cap is not None else None
    models = str(keys.get("models", "none")).lower()
    if models not in ("none", "mix"):
        raise TraceError(f"{where}: models: must be none or mix, got {models!r}")
    perf = default_perf(perf)
    given = keys.get("runtimes")
    runtimes_path = _runtime_path(given) if given is not None else None

    sizes = np.array(sorted(GAVEL_MSR_GPU_COUNTS))
    weights = np.array([GAVEL_MSR_GPU_COUNTS[s] for s in sizes], dtype=float)
    if max_gpus is not None:
        sizes = np.minimum(sizes, max_gpus)
    rng = np.random.default_rng(seed)
    job_gpus = rng.choice(sizes, size=jobs, p=weights / weights.sum())
    if runtimes_path is not None:
        pool = _runtime_pool(str(runtimes_path.resolve()), runtimes_path.stat().st_mtime_ns)
        job_runtimes = rng.choice(pool, size=jobs)
    else:
        job_runtimes = fitted_runtimes(rng, jobs)
    mean_gpu_seconds = float(np.mean(job_gpus * job_runtimes))
    rate = load * cluster_gpus / mean_gpu_seconds
    gaps = rng.exponential(1.0 / rate, size=jobs - 1)
    submits = np.concatenate(([0.0], np.cumsum(gaps)))
    names = rng.choice(len(MIX_MODELS), size=jobs) if models == "mix" else None

    specs: list[JobSpec] = []
    for i in range(jobs):
        gpus = int(job_gpus[i])
        model = MIX_MODELS[int(names[i])] if names is not None else ""
        specs.append(
            JobSpec(
                id=f"syn-{i:06d}",
                submit_time=float(submits[i]),
                gpus=gpus,
                model=model,
                duration_s=float(job_runtimes[i]),
                spread_slowdown=perf.spread_slowdown(model, gpus),
            )
        )
    notes = [
        f"{count_noun(jobs, 'job')}, offered load {load:g} of {count_noun(cluster_gpus, 'GPU')}, "
        "one job every "
        f"{1.0 / rate:.1f}s on average, seed {seed}, run times "
        + (f"from {runtimes_path}" if runtimes_path else "of Philly's (the fitted table)")
    ]
    if max_gpus is not None:
        notes.append(f"job sizes capped at {count_noun(max_gpus, 'GPU')}")
    source = f"synthetic:{location}" if location else "synthetic"
    return Trace(jobs=specs, source=source, notes=notes)


def fitted_runtimes(rng: np.random.Generator, count: int) -> np.ndarray:
    """`count` run times (seconds) from Philly's fitted quantile table: u uniform on [0, 1),
    log(run time) interpolated linearly between the table's (p, log quantile) points."""
    import numpy as np

    probabilities, seconds = _fitted_table()
    return np.exp(np.interp(rng.random(count), probabilities, seconds))


@lru_cache(maxsize=1)
def _fitted_table() -> tuple[np.ndarray, np.ndarray]:
    import numpy as np

    table = np.array(PHILLY_RUNTIME_QUANTILES, dtype=float)
    return table[:, 0], np.log(table[:, 1])


def _parse_keys(location: str, options: dict[str, Any]) -> dict[str, Any]:
    keys: dict[str, Any] = {}
    for part in location.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or not key:
            raise TraceError(f"synthetic: {part!r}: expected KEY=VALUE")
        if key in keys:
            raise TraceError(f"synthetic: {key}: given twice")
        keys[key] = value.strip()
    for key, value in options.items():
        if key in keys:
            raise TraceError(f"synthetic: {key}: given both in the spec and as an option")
        keys[key] = value
    unknown = sorted(set(keys) - set(KEYS))
    if unknown:
        raise TraceError(
            f"synthetic: unknown key(s) {', '.join(unknown)} (known: {', '.join(KEYS)})"
        )
    return keys


def default_runtime_paths() -> list[Path]:
    """Where the shared data's Philly run-time file is looked for (by benchmarks that draw from
    the file itself): beside the working directory's project, then beside this repository."""
    repo_root = Path(__file__).resolve().parents[3]
    return [Path.cwd().parent / RUNTIME_FILE, repo_root.parent / RUNTIME_FILE]


def _runtime_path(given: object) -> Path:
    """The run-time file given (`runtimes=PATH`); None: the shared data's, where it is."""
    if given is not None:
        path = Path(str(given)).expanduser()
        if not path.is_file():
            raise TraceError(f"{given}: no such file (synthetic: runtimes)")
        return path
    candidates = default_runtime_paths()
    for path in candidates:
        if path.is_file():
            return path
    tried = ", ".join(str(p) for p in candidates)
    raise TraceError(f"synthetic: cannot find the Philly run times (tried {tried})")


@lru_cache(maxsize=4)
def _runtime_pool(path: str, mtime_ns: int) -> np.ndarray:
    """The positive run times of the file (zero-length jobs dropped); cached per file version."""
    import numpy as np

    values: list[float] = []
    for line, row in csv_records(Path(path), ("runtime",)):
        raw = row["runtime"]
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise TraceError(f"{path}: line {line}: runtime: must be a number, got {raw!r}")
        if value > 0:
            values.append(value)
    if not values:
        raise TraceError(f"{path}: no positive run times")
    pool = np.array(values)
    pool.flags.writeable = False
    return pool


FORMAT = TraceFormat(
    "synthetic",
    "a Philly-like generator: Gavel-MSR sizes, Philly run times (fitted; no data file), Poisson arrivals at a load",
    "synthetic:jobs=N,load=L,gpus=G",
    read=read,
)
