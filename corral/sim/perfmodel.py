"""How fast a job runs where it is placed: measured throughputs, spread slowdowns, GPU-type speed.

Two sources of knowledge, used side by side:

* Gavel's measured throughput table (steps/s of each model at 1, 2, 4 and 8 GPUs on k80, p100 and
  v100, consolidated on one server or spread over several). Traces that give training steps (the
  Gavel/MSR trace) turn steps into seconds with it.
* For traces that only give a run time (Philly, Tiresias, Helios, Alibaba), a small table of how
  much slower a model runs when its GPUs span several nodes, keyed by model-name prefix.

Work in the simulator is counted in "ideal seconds": one second running consolidated on the job's
reference GPU type. `speed_model` turns a placement into ideal seconds per wall second.
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Callable, Mapping
from functools import lru_cache
from pathlib import Path

from corral.core.cluster import Cluster
from corral.core.job import Job
from corral.core.profiles import Profiles, ProfilesError


class PerfModelError(ValueError):
    """A throughput table or slowdown file that cannot be used (message is one line)."""


# Spread slowdowns for duration-based traces, keyed by lowercase model-name prefix (the names used
# in Tiresias's 60_job.csv: vgg11/16/19, alexnet, resnet50/101/152, inception3/4, googlenet).
#
# Why these numbers: the Tiresias paper (Gu et al., NSDI'19, section 3.3, "Placement") found that
# what makes a model sensitive to consolidation is a large, skewed tensor: with parameter-server
# training, the server holding that tensor becomes the bottleneck once traffic crosses the network.
# The VGG family and AlexNet have one (their first fully connected layer: 392 MB for VGG, 144 MB for
# AlexNet, per the tensor sizes in the Tiresias simulator's models.py), and suffered when spread;
# ResNet and Inception tensors are all under ~10 MB and were barely affected. The values themselves
# are coarse choices of ours in that spirit, not measurements: override them with
# `PerfModel.with_overrides` (e.g. from a file read by `load_slowdowns`) when you have profiles.
DEFAULT_SPREAD_SLOWDOWNS: dict[str, float] = {
    "vgg": 1.6,
    "alexnet": 1.5,
    "resnet": 1.1,
    "inception": 1.1,
    "googlenet": 1.1,
}

# The GPU type whose consolidated run time a Gavel job's `duration_s` is expressed in.
GAVEL_REFERENCE_TYPE = "v100"

# _Curve: one model on one GPU type, the (gpu count, steps/s) pairs measured, sorted by count.
_Curve = tuple[tuple[int, float], ...]


class PerfModel:
    """Throughputs (optional) plus the spread slowdowns of duration-based jobs.

    Assumptions, all documented here because they shape simulated run times:

    * Throughput at a GPU count the table lacks (more than 8 GPUs, odd counts like 3 or 12, or
      models measured only on 1 GPU such as A3C, CycleGAN and Recommendation) scales linearly from
      the largest measured count n' <= n: thr(n) = thr(n') * n / n'. This is optimistic (perfect
      scaling beyond what was measured) but keeps every trace job runnable.
    * Zero throughputs in the table (a model that did not fit on that GPU at that size) are treated
      as not measured, so the rule above applies to them too; otherwise the job would never end.
    * A spread ("unconsolidated") throughput is used only when the table measured that model spread
      at more than one GPU; otherwise the consolidated one stands in (no spread penalty known).
    """

    def __init__(
        self,
        throughputs: Mapping[str, Mapping[str, _Curve]] | None = None,
        spread_throughputs: Mapping[str, Mapping[str, _Curve]] | None = None,
        slowdowns: Mapping[str, float] | None = None,
        source: str = "",
    ) -> None:
        self._consolidated = {t: dict(m) for t, m in (throughputs or {}).items()}
        self._spread = {t: dict(m) for t, m in (spread_throughputs or {}).items()}
        self.slowdowns: dict[str, float] = dict(
            DEFAULT_SPREAD_SLOWDOWNS if slowdowns is None else slowdowns
        )
        # Longest prefix first, so "resnet152" could be given its own value beside "resnet".
        self._prefixes = sorted(self.slowdowns, key=len, reverse=True)
        self.source = source

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def from_gavel_table(
        cls, path: str | Path, slowdowns: Mapping[str, float] | None = None
    ) -> PerfModel:
        """Load Gavel's simulation_throughputs.json (see the data README for the format)."""
        path = Path(path)
        raw = read_throughput_table(path)
        consolidated: dict[str, dict[str, _Curve]] = {}
        spread: dict[str, dict[str, _Curve]] = {}
        for type_key, entries in raw.items():
            gpu_type, _, suffix = str(type_key).partition("_")
            if suffix not in ("", "unconsolidated"):
                raise PerfModelError(
                    f"{path}: {type_key}: unknown table (expected <type> or <type>_unconsolidated)"
                )
            if not isinstance(entries, dict):
                raise PerfModelError(f"{path}: {type_key}: expected an object")
            target = spread if suffix else consolidated
            target[gpu_type.lower()] = _parse_curves(path, type_key, entries)
        return cls(consolidated, spread, slowdowns, source=str(path))

    @classmethod
    def default_for_durations(cls) -> PerfModel:
        """No throughput table; spread slowdowns from DEFAULT_SPREAD_SLOWDOWNS."""
        return cls(slowdowns=DEFAULT_SPREAD_SLOWDOWNS, source="default slowdowns")

    def with_overrides(self, mapping: Mapping[str, float]) -> PerfModel:
        """A copy whose slowdown table has `mapping` merged in (keys are lowercased prefixes)."""
        merged = dict(self.slowdowns)
        for key, value in mapping.items():
            merged[str(key).lower()] = _check_slowdown(value, f"slowdown for {key!r}")
        return PerfModel(self._consolidated, self._spread, merged, source=self.source)

    # -- queries --------------------------------------------------------------------------------

    @property
    def has_throughputs(self) -> bool:
        return bool(self._consolidated)

    def with_slowdowns(self, slowdowns: Mapping[str, float]) -> PerfModel:
        """A copy whose slowdown table is replaced by `slowdowns` (already validated)."""
        return PerfModel(self._consolidated, self._spread, slowdowns, source=self.source)

    def knows(self, model: str, gpu_type: str = GAVEL_REFERENCE_TYPE) -> bool:
        """True when the throughput table has this model on this GPU type."""
        return model in self._consolidated.get(gpu_type.lower(), {})

    def throughput(
        self, model: str, gpus: int, gpu_type: str, consolidated: bool = True
    ) -> float | None:
        """Steps per second of `model` on `gpus` GPUs of `gpu_type`; None when not in the table."""
        gpu_type = gpu_type.lower()
        if not consolidated and gpus > 1:
            curve = self._spread.get(gpu_type, {}).get(model)
            if curve is not None and any(n > 1 for n, _ in curve):
                value = _scaled(curve, gpus)
                if value is not None:
                    return value
        curve = self._consolidated.get(gpu_type, {}).get(model)
        return None if curve is None else _scaled(curve, gpus)

    def duration_s(
        self, model: str, steps: float, gpus: int, gpu_type: str, consolidated: bool = True
    ) -> float:
        """Seconds to run `steps` training steps; PerfModelError when the table lacks the model."""
        value = self.throughput(model, gpus, gpu_type, consolidated)
        if value is None:
            raise PerfModelError(
                f"no throughput for {model!r} on {gpus} x {gpu_type}"
                + (f" in {self.source}" if self.source else "")
            )
        return steps / value

    def spread_slowdown(self, model: str, gpus: int, gpu_type: str = GAVEL_REFERENCE_TYPE) -> float:
        """How many times slower the job runs spread over nodes than on one node (>= 1.0).

        From the throughput table when it has the model, else from the prefix table (1.0 for an
        unknown model). A 1-GPU job cannot be spread: always 1.0.
        """
        if gpus <= 1:
            return 1.0
        if self.knows(model, gpu_type):
            together = self.throughput(model, gpus, gpu_type, consolidated=True)
            apart = self.throughput(model, gpus, gpu_type, consolidated=False)
            if together is None or apart is None:
                return 1.0
            return max(1.0, together / apart)
        return self.slowdown_for(model)

    def slowdown_for(self, model: str) -> float:
        """The prefix table's value for a model name (case-insensitive), 1.0 when none matches."""
        name = model.lower()
        for prefix in self._prefixes:
            if name.startswith(prefix):
                return self.slowdowns[prefix]
        return 1.0

    def type_speed(self, model: str, gpus: int, gpu_type: str, reference_type: str) -> float:
        """Throughput on `gpu_type` relative to `reference_type` (1.0 when either is unknown)."""
        here = self.throughput(model, gpus, gpu_type)
        there = self.throughput(model, gpus, reference_type)
        if here is None or there is None or there <= 0:
            return 1.0
        return here / there

    def speed_model(self, cluster: Cluster) -> Callable[[Job, tuple[int, ...]], float]:
        """A function giving a job's speed (ideal seconds per wall second) on a set of GPUs.

        * Spread over more than one node: divide by the spread slowdown. For a job the throughput
          table knows (a Gavel job), the slowdown is the table's on the GPU type it landed on;
          otherwise it is `job.spec.spread_slowdown`, fixed when the trace was read.
        * GPU type: a Gavel job's duration is in consolidated seconds on v100, so it is multiplied
          by `type_speed(model, n, type, "v100")`. A gang on mixed types runs at the pace of its
          slowest worker. For duration-based jobs the type factor is 1.0: their traces give run
          times on whatever the original cluster had, with no per-type measurement to scale by.
        """
        gpu_node = cluster.gpu_node
        gpu_cells = cluster.gpus

        @lru_cache(maxsize=4096)
        def table_speed(model: str, gpus: int, gpu_type: str, spread: bool) -> float:
            speed = self.type_speed(model, gpus, gpu_type, GAVEL_REFERENCE_TYPE)
            if spread:
                measured_on = gpu_type if self.knows(model, gpu_type) else GAVEL_REFERENCE_TYPE
                speed /= self.spread_slowdown(model, gpus, measured_on)
            return speed

        # Whether the table knows each model (it never changes), asked at every start.
        known: dict[str, bool] = {}

        def speed(job: Job, gpus: tuple[int, ...]) -> float:
            if not gpus:
                return 1.0
            first = gpus[0]
            node = gpu_node[first]
            spread = False
            for gpu in gpus:
                if gpu_node[gpu] != node:
                    spread = True
                    break
            model = job.spec.model
            if model:
                knows = known.get(model)
                if knows is None:
                    knows = known[model] = self.knows(model)
                if knows:
                    gpu_type = gpu_cells[first].gpu_type
                    for gpu in gpus:
                        if gpu_cells[gpu].gpu_type != gpu_type:  # mixed: the slowest type's
                            types = {gpu_cells[g].gpu_type for g in gpus}
                            return min(table_speed(model, len(gpus), t, spread) for t in types)
                    return table_speed(model, len(gpus), gpu_type, spread)
            return 1.0 / job.spec.spread_slowdown if spread else 1.0

        return speed


def read_throughput_table(path: Path) -> dict[str, object]:
    """The raw JSON object of Gavel's simulation_throughputs.json, or a one-line error."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise PerfModelError(f"{path}: throughput table not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PerfModelError(f"{path}: cannot read throughput table: {_one_line(exc)}") from None
    if not isinstance(raw, dict):
        raise PerfModelError(f"{path}: expected a JSON object of GPU types at the top level")
    return raw


def load_throughputs(path: str | Path) -> Profiles:
    """A table of measured throughputs in Gavel's format (`corral export-trace` writes one from
    the live manager's profiles) as the `Profiles` the live manager measured: the simulator then
    gives its jobs the speeds `Profiles.speed_model` gave them live. PerfModelError on one line
    naming the file and the entry."""
    path = Path(path)
    raw = read_throughput_table(path)
    try:
        return Profiles.from_gavel(raw)
    except ProfilesError as exc:
        raise PerfModelError(f"{path}: {exc}") from None


def load_slowdowns(path: str | Path) -> dict[str, float]:
    """Read `{model_prefix: slowdown}` from a YAML or JSON file; each value a number >= 1."""
    import yaml  # (here: a run without a slowdown file never loads it, some 10 ms)

    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise PerfModelError(f"{path}: slowdown file not found") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise PerfModelError(f"{path}: cannot read slowdown file: {_one_line(exc)}") from None
    if not isinstance(raw, dict):
        raise PerfModelError(f"{path}: expected a mapping of model-name prefix to slowdown")
    result: dict[str, float] = {}
    for key, value in raw.items():
        try:
            result[str(key).lower()] = _check_slowdown(value, str(key))
        except PerfModelError as exc:
            raise PerfModelError(f"{path}: {exc}") from None
    return result


# -- helpers ------------------------------------------------------------------------------------


def _parse_curves(path: Path, type_key: str, entries: dict[str, object]) -> dict[str, _Curve]:
    points: dict[str, list[tuple[int, float]]] = {}
    for key, entry in entries.items():
        try:
            job_type, scale = ast.literal_eval(key)
        except (ValueError, SyntaxError, TypeError):
            raise PerfModelError(
                f"{path}: {type_key}: bad key {key!r} (expected \"('<job_type>', <gpus>)\")"
            ) from None
        alone = entry.get("null") if isinstance(entry, dict) else None
        if (
            not isinstance(job_type, str)
            or isinstance(scale, bool)
            or not isinstance(scale, int)
            or scale <= 0
            or isinstance(alone, bool)
            or not isinstance(alone, (int, float))
            or not math.isfinite(alone)
            or alone < 0
        ):
            raise PerfModelError(
                f"{path}: {type_key}: {key}: expected a positive GPU count and a "
                'non-negative "null" throughput'
            )
        if alone > 0:  # zero = did not run at that size; treated as unmeasured (see PerfModel)
            points.setdefault(job_type, []).append((scale, float(alone)))
    return {model: tuple(sorted(curve)) for model, curve in points.items()}


def _scaled(curve: _Curve, gpus: int) -> float | None:
    """Throughput at `gpus`, scaled linearly from the largest measured count not above it."""
    best: tuple[int, float] | None = None
    for n, value in curve:
        if n > gpus:
            break
        best = (n, value)
    if best is None:
        return None
    n, value = best
    return value if n == gpus else value * gpus / n


def _check_slowdown(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PerfModelError(f"{name}: must be a number >= 1, got {value!r}")
    if not math.isfinite(value) or value < 1:
        raise PerfModelError(f"{name}: must be a number >= 1, got {value!r}")
    return float(value)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
