"""A seeded synthetic model of training progress: what a simulated job reports to `optimus`.

Each job gets a hidden loss curve of Optimus's form, l(k) = 1 / (b0 k + b1) + b2, drawn from the
seed and the job's id: a loss that starts `initial_excess` above its asymptote `b2` (both drawn
uniformly from `EXCESS_RANGE` and `ASYMPTOTE_RANGE`), with b0 set so that the curve converges (its
excess down to `converge_fraction` of the initial one, the criterion of `corral.core.estimate`)
exactly at the job's true number of steps. Steps are the trace's `total_steps` when it has them,
else one per ideal second of work.

The job logs its loss every `sample_every_s` ideal seconds of work (every N steps, N fixed per
job), with multiplicative log-normal noise of standard deviation `noise`, up to the work it has
done so far (`Job.work_done_at`); a retry after a failure, which lost work, logs again from there.
Only this model reads the truth (`duration_s`, `total_steps`); the policy sees its samples.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, overload

from corral.core.estimate import DEFAULT_CONVERGE_FRACTION, LossCurve, Progress
from corral.core.job import Job, JobSpec

EXCESS_RANGE = (0.5, 3.0)
ASYMPTOTE_RANGE = (0.05, 1.0)
_MASK = (1 << 64) - 1


def _mix(value: int) -> int:
    """SplitMix64's finaliser: a well-spread 64-bit hash, so that sample i's noise can be drawn
    on its own (any sample, in any order, always the same)."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK
    return value ^ (value >> 31)


def _standard_normal(key: int, index: int) -> float:
    first = _mix(key ^ _mix(2 * index))
    second = _mix(key ^ _mix(2 * index + 1))
    u1 = ((first >> 11) + 0.5) / float(1 << 53)  # in (0, 1): log is finite
    u2 = (second >> 11) / float(1 << 53)
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


@dataclass(slots=True, frozen=True)
class HiddenCurve:
    curve: LossCurve
    total_steps: float
    steps_per_s: float  # steps per ideal second of work
    sample_every_steps: float
    noise_key: int


class LoggedLosses(Sequence[tuple[float, float]]):
    """The samples a job logged so far, computed on demand (a long job logs many thousands)."""

    def __init__(self, hidden: HiddenCurve, count: int, noise: float) -> None:
        self.hidden = hidden
        self.count = count
        self.noise = noise

    def __len__(self) -> int:
        return self.count

    @overload
    def __getitem__(self, index: int) -> tuple[float, float]: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[tuple[float, float]]: ...
    def __getitem__(
        self, index: int | slice
    ) -> tuple[float, float] | Sequence[tuple[float, float]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.count))]
        if index < 0:
            index += self.count
        if not 0 <= index < self.count:
            raise IndexError(index)
        hidden = self.hidden
        step = (index + 1) * hidden.sample_every_steps
        factor = math.exp(self.noise * _standard_normal(hidden.noise_key, index))
        return (step, hidden.curve.loss(step) * factor)

    def __iter__(self) -> Iterator[tuple[float, float]]:
        return (self[i] for i in range(self.count))


class LossCurveModel:
    """`observe` for `optimus` in the simulator: `model(job, now) -> Progress`."""

    def __init__(
        self,
        seed: int = 0,
        *,
        sample_every_s: float = 60.0,
        noise: float = 0.02,
        converge_fraction: float = DEFAULT_CONVERGE_FRACTION,
    ) -> None:
        if sample_every_s <= 0 or noise < 0:
            raise ValueError("progress model: sample_every_s must be positive, noise >= 0")
        self.seed = seed
        self.sample_every_s = sample_every_s
        self.noise = noise
        self.converge_fraction = converge_fraction
        self._hidden: dict[str, HiddenCurve | None] = {}

    def hidden(self, spec: JobSpec) -> HiddenCurve | None:
        """The job's true curve (None for a job without a length: it reports nothing)."""
        if spec.id in self._hidden:
            return self._hidden[spec.id]
        hidden = None
        if spec.duration_s is not None and spec.duration_s > 0:
            import numpy as np

            job_key = zlib.crc32(spec.id.encode())
            rng = np.random.default_rng([self.seed, job_key])
            excess = float(rng.uniform(*EXCESS_RANGE))
            asymptote = float(rng.uniform(*ASYMPTOTE_RANGE))
            steps = spec.total_steps if spec.total_steps else spec.duration_s
            steps_per_s = steps / spec.duration_s
            hidden = HiddenCurve(
                LossCurve.converging_at(steps, excess, asymptote, self.converge_fraction),
                steps,
                steps_per_s,
                max(1.0, round(self.sample_every_s * steps_per_s)),
                _mix((self.seed << 32) ^ job_key),
            )
        self._hidden[spec.id] = hidden
        return hidden

    def __call__(self, job: Job, now: float) -> Progress:
        hidden = self.hidden(job.spec)
        if hidden is None:
            return Progress()
        steps_done = min(hidden.total_steps, job.work_done_at(now) * hidden.steps_per_s)
        count = int(steps_done / hidden.sample_every_steps + 1e-9)
        return Progress(steps_done, LoggedLosses(hidden, count, self.noise))


class Estimated(Protocol):
    """An estimate of a job's total work: from a fit of its losses ("fit") or a "prior"."""

    @property
    def total_work_s(self) -> float: ...

    @property
    def source(self) -> str: ...


class Estimator(Protocol):
    """A policy that estimates a job's length from its progress (optimus, built by name)."""

    def estimate(self, job: Job, now: float) -> Estimated: ...


def estimation_errors(
    specs: Sequence[JobSpec],
    model: LossCurveModel,
    policy: Estimator,
    fractions: Sequence[float] = (0.25, 0.5, 0.75),
) -> dict[float, tuple[list[float], int]]:
    """Relative error |estimated - true| / true of each job's remaining work once it has done
    each fraction of its work, and how many jobs fell back to the prior there (too few points,
    or no converging fit). The policy estimates from the model's samples alone."""
    result: dict[float, tuple[list[float], int]] = {}
    for fraction in fractions:
        errors: list[float] = []
        prior = 0
        for spec in specs:
            if spec.duration_s is None or spec.duration_s <= 0:
                continue
            job = Job(spec=spec, work_done_s=fraction * spec.duration_s)
            estimate = policy.estimate(job, 0.0)
            if estimate.source != "fit":
                prior += 1
                continue
            true_left = (1.0 - fraction) * spec.duration_s
            left = max(0.0, estimate.total_work_s - job.work_done_s)
            errors.append(abs(left - true_left) / true_left)
        result[fraction] = (errors, prior)
    return result
