"""Measured throughputs: what a cluster learned about each model on each placement shape.

A deep-learning job repeats the same iteration, so its speed on a placement is a fact one can
measure from its first minutes and reuse (Gavel and AlloX profile each job type on each GPU
type; Tiresias learns which models suffer from being spread over machines; Gandiva measures
jobs sharing a GPU). `Profiles` keeps those measurements, keyed by `Shape` (the model, the GPU
type, the GPU count, the nodes spanned and the model of the job sharing the GPUs, if any), and
answers from them what the scheduler's plugins ask:

* `speed_model(cluster)`: a job's speed on a set of GPUs, in the core's ideal seconds per wall
  second (1.0 on the fastest type measured for its model at that GPU count, consolidated), for
  the `hetero` placement and every start;
* `throughput(job, gpus)`: ElasticFlow's scaling curve (steps/s at a GPU count);
* `spread_slowdown(model, gpus)`: Tiresias's sensitivity (consolidated over spread steps/s);
* `best_rate(model)`: steps/s on the model's best measured shape (a length from `total_steps`);
* `pair_speeds(guest, host, gpu_type)`: Gandiva's co-location speeds, each job's steps/s while the
  two shared their GPUs over its steps/s alone there (the packing stage's table).

Where nothing was measured, a prior stands in (documented on each method): a model never seen
on a GPU type is ranked there by the ratio other models showed between that type and the types it
was measured on (Gavel profiles a new job on each type first; a prior lets the scheduler decide before
that); a count never measured scales linearly from the nearest measured count below it, as the
simulator's Gavel table does. A model measured nowhere runs at speed 1.0 everywhere, which is
what the live manager assumed before it measured anything. A pair is known only once both of its
models were measured alone and sharing (no prior here: the packing stage has its own).

Measurements belong to the VC whose jobs made them (`Shape.vc`; "" for none: a trace's table),
and a job reads its VC's view (`Profiles.view`): its VC's own measurement of a shape, else, for a
model an admin marked shared, the median of every VC's, else the one of no VC. A tenant's reports thus
shape only what its own VC's jobs read.

The live manager fills it from the jobs' progress reports (corral.server.telemetry) and stores
it; `to_gavel` writes it in the format of Gavel's `simulation_throughputs.json` (each VC's
measurements and the shared models under keys of corral's own) and `from_gavel` reads such a
table back, so `corral simulate --throughputs` replays a cluster's history with the speeds this
same class gave the live manager, VC by VC. Pure: no I/O, no clock.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from corral.core.cluster import Cluster
from corral.core.job import Job
from corral.core.plugin import SpeedModel


@dataclass(frozen=True, slots=True, order=True)
class Shape:
    """Where a model ran: its GPU type and count, the nodes it spanned and the model of the job
    that shared its GPUs ("" when none did); and whose measurement it is: the VC whose jobs ran
    it ("" for none: a table from a trace, or measurements stored before they were kept per VC)."""

    model: str
    gpu_type: str
    gpus: int
    nodes: int = 1
    colocated: str = ""
    vc: str = ""

    def describe(self) -> str:
        spread = f" over {self.nodes} nodes" if self.nodes > 1 else ""
        shared = f", sharing with {self.colocated}" if self.colocated else ""
        whose = f" (VC {self.vc})" if self.vc else ""
        return f"{self.model} on {self.gpus} x {self.gpu_type}{spread}{shared}{whose}"


@dataclass(frozen=True, slots=True)
class Measure:
    """Steps (and samples, where reported) per second on one shape, over `seconds` of running in
    `runs` attempts."""

    steps_per_s: float
    seconds: float
    runs: int = 1
    samples_per_s: float | None = None


def _finite_positive(value: float) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def pooled(measures: Iterable[Measure]) -> Measure | None:
    """Several VCs' measurements of one shape as one: the median of their steps/s (and of their
    samples/s, over those that have them), each VC one voice whatever it ran, so that one VC
    alone cannot set what the others read once three or more measured it; seconds and runs
    summed. None for none."""
    found = list(measures)
    if not found:
        return None
    samples = [m.samples_per_s for m in found if m.samples_per_s is not None]
    return Measure(
        _median([m.steps_per_s for m in found]),
        sum(m.seconds for m in found),
        sum(m.runs for m in found),
        _median(samples) if samples else None,
    )


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


class ProfilesError(ValueError):
    """A throughput table `Profiles.from_gavel` cannot read; the message is one line naming the
    entry."""


SPREAD_SUFFIX = "_unconsolidated"
#: The keys of a throughput table that are corral's own, beside Gavel's GPU types: each VC's
#: measurements (a table of the same format per VC) and the models marked shared.
VCS_KEY = "@vcs"
SHARED_KEY = "@shared"


class Profiles:
    """The measured throughputs of a cluster, per VC (see the module's docstring).

    Each measurement belongs to the VC whose jobs made it (`Shape.vc`), and a job reads a view:
    `view(vc)`. A VC's view of a shape is, in this order, its own measurement; for a model marked
    shared (`share`), the median of every other VC's measurements of the shape (`pooled`); the
    measurement that belongs to no VC (""), which counts as one more VC's in a shared pool. So one tenant's reports never change what another
    tenant's jobs read unless the model is shared, and a table without VCs (a trace's: every
    shape's `vc` is "") is read by every job alike, as it was before measurements had VCs."""

    def __init__(
        self, measures: Mapping[Shape, Measure] | None = None, shared: Iterable[str] = ()
    ) -> None:
        self._measures: dict[Shape, Measure] = dict(measures or {})
        self._shared: frozenset[str] = frozenset(shared)
        #: Counts the changes (measurements and shared marks), so that a speed model's memo and
        #: the views know when to forget.
        self.version = 0
        self._views: tuple[int, dict[str, _View]] = (0, {})

    def __len__(self) -> int:
        return len(self._measures)

    def items(self) -> Iterator[tuple[Shape, Measure]]:
        return iter(sorted(self._snapshot()))

    def _snapshot(self) -> tuple[tuple[Shape, Measure], ...]:
        """The measurements as they are now: readers in other threads (the live manager's API)
        iterate a copy taken in one step, never the dict being added to."""
        return tuple(self._measures.items())

    def get(self, shape: Shape) -> Measure | None:
        return self._measures.get(shape)

    @property
    def shared(self) -> frozenset[str]:
        """The models whose measurements every VC reads (an admin marked them shared)."""
        return self._shared

    def share(self, model: str, shared: bool = True) -> bool:
        """Mark `model` shared (every VC reads every VC's measurements of it) or not; returns
        whether that changed anything."""
        if (model in self._shared) == shared:
            return False
        self._shared = self._shared | {model} if shared else self._shared - {model}
        self.version += 1
        return True

    def add(
        self,
        shape: Shape,
        steps_per_s: float,
        seconds: float,
        *,
        samples_per_s: float | None = None,
        new_run: bool = False,
    ) -> Measure | None:
        """Fold a measurement of `seconds` at `steps_per_s` into the shape's: the mean weighted by
        measured seconds. A non-positive or non-finite value is ignored (None)."""
        if not (_finite_positive(steps_per_s) and _finite_positive(seconds)):
            return None
        if samples_per_s is not None and not _finite_positive(samples_per_s):
            samples_per_s = None
        old = self._measures.get(shape)
        if old is None:
            measure = Measure(steps_per_s, seconds, 1, samples_per_s)
        else:
            total = old.seconds + seconds
            rate = (old.steps_per_s * old.seconds + steps_per_s * seconds) / total
            samples = old.samples_per_s
            if samples_per_s is not None:
                samples = (
                    samples_per_s
                    if samples is None
                    else (samples * old.seconds + samples_per_s * seconds) / total
                )
            measure = Measure(rate, total, old.runs + int(new_run), samples)
        self._measures[shape] = measure
        self.version += 1
        return measure

    def withdraw(
        self,
        shape: Shape,
        steps_per_s: float,
        seconds: float,
        *,
        samples_per_s: float | None = None,
        run: bool = False,
    ) -> Measure | None:
        """Take back a measurement that `add` folded in (its attempt's reports were found
        implausible): the shape's measure without it, or None when nothing else was measured
        there (the shape is forgotten). `run`: the measurement counted a run."""
        old = self._measures.get(shape)
        if old is None or not (_finite_positive(steps_per_s) and _finite_positive(seconds)):
            return old
        left = old.seconds - seconds
        rate = (old.steps_per_s * old.seconds - steps_per_s * seconds) / left if left > 0 else 0.0
        if left <= old.seconds * 1e-9 or not _finite_positive(rate):
            del self._measures[shape]
            self.version += 1
            return None
        samples = old.samples_per_s
        if samples is not None and samples_per_s is not None and _finite_positive(samples_per_s):
            samples = (samples * old.seconds - samples_per_s * seconds) / left
            if not _finite_positive(samples):
                samples = None
        measure = Measure(rate, left, max(1, old.runs - int(run)), samples)
        self._measures[shape] = measure
        self.version += 1
        return measure

    def view(self, vc: str = "") -> _View:
        """What a job of VC `vc` reads (see the class's docstring); built once per change."""
        version = self.version
        built, views = self._views
        if built != version:
            views = {}
            self._views = (version, views)
        found = views.get(vc)
        if found is None:
            found = views[vc] = _View(self._view_measures(vc))
        return found

    def _view_measures(self, vc: str) -> dict[Shape, Measure]:
        shared = self._shared
        own: dict[Shape, Measure] = {}
        unattributed: dict[Shape, Measure] = {}
        others: dict[Shape, list[Measure]] = {}
        for shape, measure in sorted(self._snapshot()):
            key = replace(shape, vc="")
            if shape.vc == vc:
                own[key] = measure
                continue
            if shape.model in shared:
                others.setdefault(key, []).append(measure)
            if not shape.vc:
                unattributed[key] = measure
        view = unattributed
        for key, measures in others.items():
            pool = pooled(measures)
            if pool is not None:
                view[key] = pool
        view.update(own)
        return view

    # -- what the plugins ask (as a job of VC `vc` sees the measurements) ----------------------

    def knows(self, model: str, *, vc: str = "") -> bool:
        return self.view(vc).knows(model)

    def rate(
        self, model: str, gpu_type: str, gpus: int, nodes: int = 1, *, vc: str = ""
    ) -> float | None:
        """Measured steps/s of `model` alone on `gpus` GPUs of `gpu_type` over `nodes` nodes;
        a count not measured scales linearly from the largest measured count below it (on the
        same type and spread); None when there is none."""
        return self.view(vc).rate(model, gpu_type, gpus, nodes)

    def type_ratio(self, gpu_type: str, other: str, *, vc: str = "") -> float | None:
        """How fast `gpu_type` is relative to `other`, over the models measured on both: the
        geometric mean of their rate ratios (consolidated, alone, at equal GPU counts); None when
        no model was measured on both."""
        return self.view(vc).type_ratio(gpu_type, other)

    def type_rates(
        self, model: str, gpus: int, types: Iterable[str], *, vc: str = ""
    ) -> dict[str, float]:
        """`model`'s steps/s on `gpus` consolidated GPUs of each type: measured, else estimated
        from the types where it was measured by the ratios other models showed between them
        (`type_ratio`; the geometric mean of the estimates); a type with neither is left out."""
        return self.view(vc).type_rates(model, gpus, types)

    def spread_slowdown(self, model: str, gpus: int, *, vc: str = "") -> float | None:
        """Consolidated over spread steps/s at `gpus` GPUs (Tiresias's sensitivity), on the first
        GPU type where both were measured; None when no type has both."""
        return self.view(vc).spread_slowdown(model, gpus)

    def best_rate(self, model: str, gpus: int | None = None, *, vc: str = "") -> float | None:
        """Steps/s of `model` on its best measured consolidated shape (at `gpus` GPUs if given,
        scaled as `rate` does); None when it was never measured."""
        return self.view(vc).best_rate(model, gpus)

    def throughput(self, job: Job, gpus: int) -> float:
        """ElasticFlow's scaling curve: the job's steps/s on `gpus` consolidated GPUs of its best
        type, as its VC sees them; unmeasured, `gpus` (perfect scaling, as the simulator's table
        assumes above what it measured)."""
        model = job.spec.model
        rate = self.view(job.spec.vc).best_rate(model, gpus) if model else None
        return float(gpus) if rate is None else rate

    def pair(
        self,
        model: str,
        partner: str,
        gpu_type: str,
        gpus: int,
        *,
        vc: str = "",
        partner_vc: str | None = None,
    ) -> tuple[float, float] | None:
        """Gandiva's co-location speeds: `model`'s and `partner`'s steps/s while they shared
        `gpus` GPUs of `gpu_type` on one node, each over its own steps/s alone on that shape, each
        as its own VC sees them (`partner_vc`: the partner's, by default `vc`); None unless all
        four were measured."""
        mine = self.view(vc).relative(model, partner, gpu_type, gpus)
        theirs = self.view(vc if partner_vc is None else partner_vc).relative(
            partner, model, gpu_type, gpus
        )
        return None if mine is None or theirs is None else (mine, theirs)

    def pair_speeds(self, guest: Job, host: Job, gpu_type: str) -> tuple[float, float] | None:
        """`pair` for two jobs of one GPU count (corral.core.colocation.PairSpeeds): the live
        manager's co-location table, following what it measures."""
        if guest.spec.gpus != host.spec.gpus or not guest.spec.model or not host.spec.model:
            return None
        return self.pair(
            guest.spec.model,
            host.spec.model,
            gpu_type,
            guest.spec.gpus,
            vc=guest.spec.vc,
            partner_vc=host.spec.vc,
        )

    def speed_model(self, cluster: Cluster) -> SpeedModel:
        """A job's speed on a set of GPUs (see the module's docstring), from its VC's view. A
        gang on mixed types runs at its slowest type's pace; spread over nodes, at the measured
        spread rate, else at its consolidated one divided by the job's `spread_slowdown`."""
        gpu_node = cluster.gpu_node
        gpu_cells = cluster.gpus
        types = sorted(cluster.gpu_types)

        # Memo of the answers (a round asks for the same shapes again and again), forgotten
        # when a measurement changes the table.
        memo: dict[tuple[str, str, int, int, frozenset[str], float], float] = {}
        memo_version = [self.version]

        def speed(job: Job, gpus: tuple[int, ...]) -> float:
            if memo_version[0] != self.version:
                memo.clear()
                memo_version[0] = self.version
            spec = job.spec
            nodes = len({gpu_node[g] for g in gpus})
            kinds = frozenset(gpu_cells[g].gpu_type for g in gpus)
            key = (spec.vc, spec.model, len(gpus), nodes, kinds, spec.spread_slowdown)
            found = memo.get(key)
            if found is None:
                view = self.view(spec.vc)
                found = memo[key] = view.speed(spec.model, len(gpus), nodes, kinds, key[5], types)
            return found

        return speed

    # -- Gavel's table format ------------------------------------------------------------------

    def to_gavel(self) -> dict[str, Any]:
        """The measurements as Gavel's `simulation_throughputs.json`: `{type: {"('model', n)":
        {"null": steps/s}}}` for consolidated shapes, `type_unconsolidated` for spread ones, and
        a pair's rates under the partner's key (`"('partner', n)": [own, partner's]`, where the
        partner's was measured too). The measurements of no VC are Gavel's sections; each VC's
        are a table of the same format under `"@vcs": {vc: ...}`, and the models marked shared
        are listed under `"@shared"` (neither key when there is nothing to put there)."""
        buckets: dict[str, list[tuple[Shape, Measure]]] = {}
        for shape, measure in self.items():
            buckets.setdefault(shape.vc, []).append((shape, measure))
        table = self._gavel_section(buckets.pop("", []))
        if buckets:
            table[VCS_KEY] = {vc: self._gavel_section(found) for vc, found in buckets.items()}
        if self._shared:
            table[SHARED_KEY] = sorted(self._shared)
        return table

    def _gavel_section(self, measured: list[tuple[Shape, Measure]]) -> dict[str, Any]:
        table: dict[str, dict[str, dict[str, Any]]] = {}
        for shape, measure in measured:
            if shape.nodes > 1 and shape.colocated:
                continue
            section = shape.gpu_type + ("_unconsolidated" if shape.nodes > 1 else "")
            key = str((shape.model, shape.gpus))
            entry = table.setdefault(section, {}).setdefault(key, {})
            if not shape.colocated:
                entry["null"] = measure.steps_per_s
                continue
            other = self._measures.get(
                Shape(shape.colocated, shape.gpu_type, shape.gpus, 1, shape.model, shape.vc)
            )
            entry[str((shape.colocated, shape.gpus))] = [
                measure.steps_per_s,
                other.steps_per_s if other is not None else 0.0,
            ]
        for entries in table.values():  # Gavel's reader needs each entry's solo rate
            for pair in entries.values():
                pair.setdefault("null", 0.0)
        return dict(table)

    @classmethod
    def from_gavel(cls, table: Mapping[str, Any]) -> Profiles:
        """The measurements of a table in Gavel's format (what `to_gavel` writes): `type` holds
        consolidated shapes, `type_unconsolidated` spread ones, each key `"('model', gpus)"`
        with `"null"` (steps/s alone; 0: not measured) and, per partner, `"('partner', n)":
        [own, partner's]` for a pair sharing the GPUs (0: not measured); corral's own keys,
        `"@vcs"` (each VC's measurements, a table of this format per VC) and `"@shared"` (the
        models marked shared), where `to_gavel` wrote them. A table without them (Gavel's own) is
        measurements of no VC, which every job reads.

        Gavel's format does not say over how many nodes a spread shape ran: it is read as 2
        (`to_gavel` writes one spread measurement per model, type and count). Nor does it keep
        how long each shape was measured: `seconds` and `runs` are 1, so that these values
        weigh little once measurements are added to them. ProfilesError names a bad entry."""
        if not isinstance(table, Mapping):
            raise ProfilesError("expected an object of GPU types at the top level")
        measures: dict[Shape, Measure] = {}
        shared: list[str] = []
        gavel: dict[str, Any] = {}
        for section, entries in table.items():
            if section == VCS_KEY:
                if not isinstance(entries, Mapping):
                    raise ProfilesError(f"{VCS_KEY}: expected an object of VCs' tables")
                for vc, vc_table in entries.items():
                    if not isinstance(vc, str) or not vc.strip():
                        raise ProfilesError(f"{VCS_KEY}: {vc!r}: a VC's name must not be empty")
                    if not isinstance(vc_table, Mapping):
                        raise ProfilesError(f"{VCS_KEY}: {vc}: expected an object of GPU types")
                    _read_gavel(vc_table, vc, f"{VCS_KEY}: {vc}: ", measures)
            elif section == SHARED_KEY:
                if not isinstance(entries, list) or not all(
                    isinstance(model, str) and model for model in entries
                ):
                    raise ProfilesError(f"{SHARED_KEY}: expected a list of model names")
                shared = list(entries)
            elif str(section).startswith("@"):
                raise ProfilesError(
                    f"{section}: unknown key (corral's own are {VCS_KEY} and {SHARED_KEY})"
                )
            else:
                gavel[section] = entries
        _read_gavel(gavel, "", "", measures)
        return cls(measures, shared)


def _read_gavel(
    table: Mapping[str, Any], vc: str, where_prefix: str, into: dict[Shape, Measure]
) -> None:
    """One table of Gavel's format (`Profiles.from_gavel`) as the measurements of VC `vc`."""
    for section, entries in table.items():
        spread = str(section).endswith(SPREAD_SUFFIX)
        gpu_type = str(section).removesuffix(SPREAD_SUFFIX).lower()
        if not gpu_type:
            raise ProfilesError(f"{where_prefix}{section!r}: not a GPU type")
        if not isinstance(entries, Mapping):
            raise ProfilesError(
                f"{where_prefix}{section}: expected an object of '(model, gpus)' keys"
            )
        for key, entry in entries.items():
            where = f"{where_prefix}{section}: {key}"
            model, gpus = _gavel_key(key, where)
            if not isinstance(entry, Mapping):
                raise ProfilesError(f'{where}: expected an object with "null"')
            for partner_key, value in entry.items():
                if partner_key == "null":
                    rate = _gavel_rate(value, f"{where}: null")
                    partner = ""
                else:
                    partner, _ = _gavel_key(partner_key, f"{where}: {partner_key}")
                    if spread:
                        raise ProfilesError(f"{where}: {partner_key}: a pair cannot be spread")
                    if not isinstance(value, list | tuple) or len(value) != 2:
                        raise ProfilesError(
                            f"{where}: {partner_key}: expected [own, partner's] steps/s"
                        )
                    rate = _gavel_rate(value[0], f"{where}: {partner_key}")
                    _gavel_rate(value[1], f"{where}: {partner_key}")
                if rate > 0:  # 0: not measured (Gavel's own zeros, or to_gavel's filler)
                    shape = Shape(model, gpu_type, gpus, 2 if spread else 1, partner, vc)
                    into[shape] = Measure(rate, 1.0)


class _View:
    """The measurements one VC's jobs read (`Profiles.view`), keyed by shapes without a VC, and
    what the plugins ask of them. Made once per change of the measurements: never changed."""

    __slots__ = ("_measures", "_by_model")

    def __init__(self, measures: dict[Shape, Measure]) -> None:
        self._measures = measures
        self._by_model: dict[str, list[tuple[Shape, Measure]]] = {}
        for shape, measure in measures.items():
            self._by_model.setdefault(shape.model, []).append((shape, measure))

    def __len__(self) -> int:
        return len(self._measures)

    def items(self) -> Iterator[tuple[Shape, Measure]]:
        return iter(sorted(self._measures.items()))

    def get(self, shape: Shape) -> Measure | None:
        return self._measures.get(shape)

    def knows(self, model: str) -> bool:
        return model in self._by_model

    def rate(self, model: str, gpu_type: str, gpus: int, nodes: int = 1) -> float | None:
        exact = self._measures.get(Shape(model, gpu_type, gpus, nodes))
        if exact is not None:
            return exact.steps_per_s
        below = [
            (shape.gpus, measure.steps_per_s)
            for shape, measure in self._by_model.get(model, ())
            if shape.gpu_type == gpu_type
            and shape.nodes == nodes
            and not shape.colocated
            and shape.gpus < gpus
        ]
        if not below:
            return None
        count, rate = max(below)
        return rate * gpus / count

    def type_ratio(self, gpu_type: str, other: str) -> float | None:
        on: dict[str, dict[tuple[str, int], float]] = {gpu_type: {}, other: {}}
        for shape, measure in self._measures.items():
            if shape.gpu_type in on and shape.nodes == 1 and not shape.colocated:
                on[shape.gpu_type][(shape.model, shape.gpus)] = measure.steps_per_s
        both = on[gpu_type].keys() & on[other].keys()
        if not both:
            return None
        logs = [math.log(on[gpu_type][key] / on[other][key]) for key in both]
        return math.exp(sum(logs) / len(logs))

    def type_rates(self, model: str, gpus: int, types: Iterable[str]) -> dict[str, float]:
        measured = {t: r for t in types if (r := self.rate(model, t, gpus)) is not None}
        rates = dict(measured)
        for gpu_type in types:
            if gpu_type in measured:
                continue
            estimates = [
                rate * ratio
                for other, rate in measured.items()
                if (ratio := self.type_ratio(gpu_type, other)) is not None
            ]
            if estimates:
                rates[gpu_type] = math.exp(sum(map(math.log, estimates)) / len(estimates))
        return rates

    def spread_slowdown(self, model: str, gpus: int) -> float | None:
        spread = sorted(
            (shape, measure)
            for shape, measure in self._by_model.get(model, ())
            if shape.gpus == gpus and shape.nodes > 1 and not shape.colocated
        )
        for shape, measure in spread:
            packed = self.rate(model, shape.gpu_type, gpus, 1)
            apart = measure.steps_per_s
            if packed is not None and apart > 0:
                return max(1.0, packed / apart)
        return None

    def best_rate(self, model: str, gpus: int | None = None) -> float | None:
        rates = [
            self.rate(model, shape.gpu_type, gpus or shape.gpus, 1)
            for shape, _ in self._by_model.get(model, ())
            if shape.nodes == 1 and not shape.colocated
        ]
        known = [rate for rate in rates if rate is not None]
        return max(known) if known else None

    def relative(self, own: str, other: str, gpu_type: str, gpus: int) -> float | None:
        """`own`'s steps/s while sharing `gpus` GPUs of `gpu_type` with `other`, over its steps/s
        alone there; None unless both were measured."""
        together = self._measures.get(Shape(own, gpu_type, gpus, 1, other))
        alone = self._measures.get(Shape(own, gpu_type, gpus, 1))
        if together is None or alone is None:
            return None
        return together.steps_per_s / alone.steps_per_s

    def _on_type(self, model: str, gpu_type: str, count: int, nodes: int) -> float | None:
        rate = self.rate(model, gpu_type, count, nodes)
        if rate is None and nodes > 1:
            alone = self.rate(model, gpu_type, count, 1)
            slowdown = self.spread_slowdown(model, count)
            if alone is not None and slowdown is not None:
                rate = alone / slowdown
        return rate

    def speed(
        self,
        model: str,
        count: int,
        nodes: int,
        kinds: frozenset[str],
        slowdown: float,
        types: list[str],
    ) -> float:
        """`Profiles.speed_model`'s answer for a job of `model` on `count` GPUs of `kinds` over
        `nodes` nodes, on a cluster of GPU `types`."""
        penalty = 1.0 / slowdown if nodes > 1 else 1.0
        if not count or not model or not self.knows(model):
            return penalty
        rates = self.type_rates(model, count, types)
        if not rates:
            return penalty
        best = max(rates.values())
        slowest = math.inf
        for gpu_type in kinds:
            spread = self._on_type(model, gpu_type, count, nodes) if nodes > 1 else None
            if spread is not None:
                slowest = min(slowest, spread / best)
                continue
            alone = rates.get(gpu_type, best)  # nothing known of the type: as the best
            slowest = min(slowest, alone / best * penalty)
        return slowest


def _gavel_key(key: object, where: str) -> tuple[str, int]:
    """`"('model', gpus)"` as (model, gpus)."""
    try:
        model, gpus = ast.literal_eval(str(key))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise ProfilesError(f"{where}: bad key (expected \"('<model>', <gpus>)\")") from None
    if not isinstance(model, str) or isinstance(gpus, bool) or not isinstance(gpus, int):
        raise ProfilesError(f"{where}: bad key (expected \"('<model>', <gpus>)\")")
    if gpus <= 0:
        raise ProfilesError(f"{where}: the GPU count must be positive")
    return model, gpus


def _gavel_rate(value: object, where: str) -> float:
    """A steps/s value of the table: a finite number >= 0."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise ProfilesError(f"{where}: steps/s must be a finite number >= 0, got {value!r}")
    return float(value)
