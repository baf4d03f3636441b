"""Optimus's estimate of remaining time, used as a shortest-remaining-time order (no oracle).

Optimus (Peng et al., EuroSys'18, section 3) predicts how many steps a job still needs by fitting
its training-loss curve online (`corral.core.estimate`) and measures its speed online; remaining
time = (predicted steps - steps done) / speed. This policy orders jobs by that estimate, in ideal
seconds of work, and preempts like srtf; it never reads `JobSpec.duration_s` or `total_steps`.

Progress reaches the policy through `observe(job, now) -> Progress`, a callable the shell gives it:
the live manager backs it with the metrics a job reports, the simulator with a loss-curve model
(`corral.sim.progress`). Speed is steps done per ideal second of work done (the core's own
`work_done_at`, which already accounts for placement slowdowns and restore stalls).

Without a fit (fewer than three points, or points that do not pin a converging curve down) the
estimate is a prior learnt online from the jobs that finished: a job that has done `w` seconds of
work is expected to reach the median length of the finished jobs longer than `w`. Before any job
has finished, that is `prior_s`; a job longer than every finished one is expected to run as long
again as it has (2 w).

Keys follow the contract of `base.py`: the estimate of a job's total work is refreshed only when
the scheduler (re)indexes the job (`stored_key`: when it is queued, started, or at a refit instant
announced by `key_changes_at`), so between those instants the key is srtf's with the estimate in
place of the length. A running job is refit after max(`refit_min_s`, `refit_growth` x its run time
so far), so a job is fit O(log length) times.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sortedcontainers import SortedList

from corral.core.estimate import (
    DEFAULT_CONVERGE_FRACTION,
    MIN_POINTS,
    EstimateError,
    Progress,
    Remaining,
    fit_loss_curve,
    thin,
)
from corral.core.job import Job, JobStatus
from corral.core.plugin import Observe, Services, needs
from corral.core.policy.base import Key, Policy, tie_break
from corral.core.policy.optimus_options import DEFAULT_PRIOR_S as DEFAULT_PRIOR_S
from corral.core.policy.optimus_options import OptimusOptions as OptimusOptions


@dataclass(slots=True)
class OptimusState:
    """Per job: the latest estimate of its length (refit at announced instants)."""

    estimate: Estimate | None = None


def no_progress(job: Job, now: float) -> Progress:
    return Progress()


@dataclass(slots=True, frozen=True)
class Estimate:
    total_work_s: float
    source: str  # "fit" or "prior"
    points: int
    fit_key: tuple[int, float]  # (samples, steps done) it was computed from
    converged_step: float | None = None  # the fit's: the step its curve converges at


class Optimus(Policy):
    name = "optimus"
    summary = "Optimus: shortest remaining time, the time estimated from each job's loss curve"
    Options = OptimusOptions
    preemptive = True
    stored_is_key = False

    @classmethod
    def from_options(cls, options: Any, services: Services) -> Policy:
        needs(
            services.observe, f"policy {cls.name}", "progress reports from the jobs (loss curves)"
        )
        return cls(
            services.observe,
            converge_fraction=options.converge_fraction,
            prior_s=options.prior_s,
            max_points=options.max_points,
            refit_min_s=options.refit_min_s,
            refit_growth=options.refit_growth,
        )

    def __init__(
        self,
        observe: Observe | None = None,
        *,
        converge_fraction: float = DEFAULT_CONVERGE_FRACTION,
        prior_s: float = DEFAULT_PRIOR_S,
        max_points: int = 64,
        refit_min_s: float = 300.0,
        refit_growth: float = 0.5,
    ) -> None:
        if not 0.0 < converge_fraction < 1.0:
            raise ValueError("the convergence fraction must be between 0 and 1")
        if prior_s <= 0 or refit_min_s <= 0 or refit_growth < 0 or max_points < MIN_POINTS:
            raise ValueError(
                f"optimus: prior_s and refit_min_s must be positive, refit_growth >= 0, "
                f"max_points >= {MIN_POINTS}"
            )
        self.observe = observe or no_progress
        self.converge_fraction = converge_fraction
        self.prior_s = prior_s
        self.max_points = max_points
        self.refit_min_s = refit_min_s
        self.refit_growth = refit_growth
        self.finished_lengths: SortedList = SortedList()
        self.fits = 0
        # Running jobs to check for success now and then; the lengths they end with feed the prior.
        self._watch: dict[str, Job] = {}
        self._calls_since_sweep = 0

    # -- the estimate ---------------------------------------------------------------------------

    def prior_total_s(self, work_done_s: float) -> float:
        """Median length of the finished jobs longer than `work_done_s` (see the module doc)."""
        lengths = self.finished_lengths
        start = lengths.bisect_right(work_done_s)
        longer = len(lengths) - start
        if longer:
            middle = start + (longer - 1) // 2
            return (
                float(lengths[middle])
                if longer % 2
                else (float(lengths[middle]) + float(lengths[middle + 1])) / 2
            )
        if not lengths and work_done_s < self.prior_s:
            return self.prior_s
        return 2.0 * work_done_s

    def estimate(self, job: Job, now: float) -> Estimate:
        """The job's total work (ideal seconds) as far as its progress and the prior tell."""
        done = job.work_done_at(now)
        progress = self.observe(job, now)
        fit_key = (len(progress.samples), progress.steps_done)
        cached = job.record(OptimusState).estimate
        if cached is not None and cached.fit_key == fit_key and cached.source == "fit":
            return cached  # nothing new reported since the last fit
        if len(progress.samples) >= MIN_POINTS and progress.steps_done > 0 and done > 0:
            try:
                curve = fit_loss_curve(thin(progress.samples, self.max_points))
            except EstimateError as error:
                raise EstimateError(f"job {job.id}: progress {error}") from None
            self.fits += 1
            if curve is not None:
                steps_per_s = progress.steps_done / done
                converged = curve.converged_step(self.converge_fraction)
                total_steps = max(converged, progress.steps_done)
                return Estimate(
                    total_steps / steps_per_s, "fit", len(progress.samples), fit_key, converged
                )
        return Estimate(self.prior_total_s(done), "prior", len(progress.samples), fit_key)

    def _refresh(self, job: Job, now: float) -> Estimate:
        estimate = self.estimate(job, now)
        job.record(OptimusState).estimate = estimate
        return estimate

    def _current(self, job: Job, now: float) -> Estimate:
        cached = job.record(OptimusState).estimate
        return cached if cached is not None else self._refresh(job, now)

    def remaining_s(self, job: Job, now: float) -> float:
        """Estimated ideal seconds of work left."""
        return max(0.0, self._current(job, now).total_work_s - job.work_done_at(now))

    # -- the policy contract --------------------------------------------------------------------

    def key(self, job: Job, now: float) -> Key:
        return (self.remaining_s(job, now), *tie_break(job))

    def stored_key(self, job: Job, now: float) -> Key:
        self._learn_from_finished()
        self._refresh(job, now)
        if job.status is JobStatus.RUNNING:
            self._watch[job.id] = job
            # Projected finish instant: stays put while the job runs (as srtf's does).
            stall = max(0.0, job.stall_until - now)
            return (
                now + stall + self.remaining_s(job, now) / max(job.speed, 1e-12),
                *tie_break(job),
            )
        return self.key(job, now)

    def key_changes_at(self, job: Job, now: float) -> float:
        if job.status is not JobStatus.RUNNING:
            return float("inf")
        return now + max(self.refit_min_s, self.refit_growth * job.executed_at(now))

    def describe_key(self, job: Job, now: float) -> str:
        estimate = self._current(job, now)
        basis = (
            f"loss-curve fit of {estimate.points} points"
            if estimate.source == "fit"
            else "prior: median length of finished jobs"
        )
        return f"estimated remaining {self.remaining_s(job, now):.0f}s of work ({basis})"

    def remaining(self, job: Job, now: float) -> Remaining | None:
        """The estimate the job is keyed by now (the one of its latest refresh), unchanged."""
        state = job.peek(OptimusState)
        estimate = state.estimate if state is not None else None
        if estimate is None:
            return None
        done = job.work_done_at(now)
        if estimate.source == "fit":
            basis = f"loss-curve fit of {estimate.points} reported losses"
            if estimate.converged_step is not None:
                basis += f", converging at step {estimate.converged_step:.0f}"
        else:
            finished = len(self.finished_lengths)
            basis = (
                f"prior: learnt from the lengths of {finished} finished jobs"
                if finished
                else f"prior: no job has finished yet (prior_s {self.prior_s:g} s)"
            )
            if estimate.points:
                basis += f" ({estimate.points} reported losses, no converging fit)"
        return Remaining(max(0.0, estimate.total_work_s - done), estimate.source, basis)

    def _learn_from_finished(self) -> None:
        """Record the lengths of watched jobs that succeeded since the last look. Looking costs
        one pass over the watched jobs, so it is done once per as many calls: O(1) amortized."""
        self._calls_since_sweep += 1
        if self._calls_since_sweep < len(self._watch):
            return
        self._calls_since_sweep = 0
        for job_id, job in list(self._watch.items()):
            if job.status is JobStatus.RUNNING:
                continue
            del self._watch[job_id]  # finished, or waiting again (watched again when it runs)
            if job.status is JobStatus.SUCCEEDED and job.work_done_s > 0:
                self.finished_lengths.add(job.work_done_s)
