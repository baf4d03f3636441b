"""Predicting when a training job converges from the losses it reported so far.

Optimus (Peng et al., EuroSys'18, section 3.1) models the training loss after k steps as

    l(k) = 1 / (b0 * k + b1) + b2,        b0, b1, b2 >= 0,

fits the coefficients online by non-negative least squares to the (step, loss) points observed so
far, and reads the number of steps to convergence off the fitted curve. Here a curve has converged
once its excess loss over the asymptote, l(k) - b2, has fallen to `fraction` of its value at step
0, 1 / b1; that is at step k* = b1 * (1 / fraction - 1) / b0. This criterion does not depend on
the unit of the loss or of the steps, so one fraction serves every job.

Pure numerics: no clock, no I/O, no randomness.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


#: A curve has converged when its excess loss is down to 5 % of the excess at step 0.
DEFAULT_CONVERGE_FRACTION = 0.05
#: Fewer points than this leave the three coefficients undetermined.
MIN_POINTS = 3

Sample = tuple[float, float]  # (step, loss)


@dataclass(slots=True, frozen=True)
class Progress:
    """What a job reported: its current step count and its (step, loss) samples, oldest first
    (what a shell's `Services.observe` answers for a job; Optimus fits its curve to them)."""

    steps_done: float = 0.0
    samples: Sequence[Sample] = ()


@dataclass(slots=True, frozen=True)
class Remaining:
    """A policy's estimate of a job's remaining work, as it stands in the policy's own state
    (`Policy.remaining`): for the shells to show, never an input to a decision."""

    remaining_s: float  # ideal seconds of work left
    source: str  # where the estimate came from, e.g. "fit" or "prior" (optimus)
    basis: str  # the same, in words


class EstimateError(ValueError):
    """Malformed progress samples (the message names the sample and the field)."""


@dataclass(slots=True, frozen=True)
class LossCurve:
    b0: float
    b1: float
    b2: float

    def loss(self, step: float) -> float:
        return 1.0 / (self.b0 * step + self.b1) + self.b2

    def converged_step(self, fraction: float = DEFAULT_CONVERGE_FRACTION) -> float:
        """The step at which the excess loss is `fraction` of its initial value (inf if never)."""
        if not 0.0 < fraction < 1.0:
            raise EstimateError(f"converge fraction: must be between 0 and 1, got {fraction}")
        if self.b0 <= 0.0:
            return math.inf
        return self.b1 * (1.0 / fraction - 1.0) / self.b0

    @classmethod
    def converging_at(
        cls, step: float, initial_excess: float, asymptote: float, fraction: float
    ) -> LossCurve:
        """The curve whose loss starts `initial_excess` above `asymptote` and converges at `step`."""
        b1 = 1.0 / initial_excess
        return cls(b1 * (1.0 / fraction - 1.0) / step, b1, asymptote)


def as_arrays(samples: Sequence[Sample]) -> tuple[np.ndarray, np.ndarray]:
    """Steps and losses as arrays; refuses samples that are not (step, loss) pairs of finite
    numbers with step >= 0, naming the first bad one."""
    import numpy as np

    if len(samples) == 0:
        return np.zeros(0), np.zeros(0)
    try:
        table = np.array(samples, dtype=float).reshape(len(samples), -1)
        good = table.shape[1] == 2 and bool(np.isfinite(table).all() and (table[:, 0] >= 0).all())
    except (TypeError, ValueError):
        good = False
    if not good:
        _explain(samples)
    return table[:, 0], table[:, 1]


def _explain(samples: Sequence[Sample]) -> None:
    for position, sample in enumerate(samples):
        if not isinstance(sample, tuple | list) or len(sample) != 2:
            raise EstimateError(f"sample {position}: expected a (step, loss) pair, got {sample!r}")
        for field, value in zip(("step", "loss"), sample, strict=True):
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not number or not math.isfinite(value):
                raise EstimateError(
                    f"sample {position}: {field}: must be a finite number, got {value!r}"
                )
        if sample[0] < 0:
            raise EstimateError(f"sample {position}: step: must not be negative, got {sample[0]!r}")
    raise EstimateError("samples: expected (step, loss) pairs")


def thin(samples: Sequence[Sample], max_points: int) -> list[Sample]:
    """At most `max_points` samples evenly spaced by position, keeping the first and the last."""
    count = len(samples)
    if count <= max_points:
        return list(samples)
    if max_points < 2:
        return [samples[count - 1]]
    return [samples[round(i * (count - 1) / (max_points - 1))] for i in range(max_points)]


def fit_loss_curve(samples: Sequence[Sample]) -> LossCurve | None:
    """The curve of least squared error in loss, with non-negative coefficients; None when the
    points cannot pin one down (fewer than three distinct steps, a loss <= 0, flat or rising
    losses, or a curvature at the edge of the search range)."""
    import numpy as np

    steps, losses = as_arrays(samples)
    if np.unique(steps).size < MIN_POINTS or losses.min() <= 0.0 or np.ptp(losses) == 0.0:
        return None
    # Scale steps and losses to at most 1, so one search range and tolerance suit every job.
    step_scale, loss_scale = float(steps.max()), float(losses.max())
    x, y = steps / step_scale, losses / loss_scale
    # Written as y = a / (1 + r x) + c, the model is linear in (a, c) once the curvature r is
    # fixed: solve those by NNLS in closed form and search r alone (variable projection).
    log_r = _search_curvature(x, y)
    if log_r <= LOG_R_MIN + 1e-6 or log_r >= LOG_R_MAX - 1e-6:
        return None
    a, c = (float(v[0]) for v in _projected(np.array([log_r]), x, y)[:2])
    if a <= 0.0:
        return None
    r = 10.0**log_r
    # loss = loss_scale * (a / (1 + r k / step_scale) + c) = 1 / (b0 k + b1) + b2
    return LossCurve(r / (a * loss_scale * step_scale), 1.0 / (a * loss_scale), c * loss_scale)


#: The curvature r = b0 / b1 in scaled steps is searched over 10^-4 .. 10^5 (a job whose points
#: show no curvature, or only the asymptote, is left to the prior): a grid of 0.1 in log10 r,
#: then zooms of 16x around the best point, down to a step of about 1e-7.
LOG_R_MIN, LOG_R_MAX, GRID_POINTS, ZOOMS = -4.0, 5.0, 91, 5
#: Points of each zoom's grid, end points included.
ZOOM_POINTS = 33


def _search_curvature(x: np.ndarray, y: np.ndarray) -> float:
    import numpy as np

    zoom = np.linspace(0.0, 1.0, ZOOM_POINTS)
    grid = np.linspace(LOG_R_MIN, LOG_R_MAX, GRID_POINTS)
    for _ in range(ZOOMS + 1):
        best = int(np.argmin(_projected(grid, x, y)[2]))
        low, high = grid[max(best - 1, 0)], grid[min(best + 1, grid.size - 1)]
        grid = low + (high - low) * zoom
    return float(grid[zoom.size // 2])


def _projected(
    log_r: np.ndarray, x: np.ndarray, y: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each curvature 10^log_r, the best a >= 0, c >= 0 in y ~ a g + c with g = 1/(1 + r x),
    and its squared error (from sums, so that one evaluation is a handful of array operations)."""
    import numpy as np

    g = 1.0 / (1.0 + np.power(10.0, log_r)[:, None] * x[None, :])
    n, sy, syy = float(y.size), float(y.sum()), float(y @ y)
    sg, sgg, sgy = g.sum(axis=1), np.einsum("ij,ij->i", g, g), g @ y
    spread = n * sgg - sg * sg
    a = np.divide(n * sgy - sg * sy, spread, out=np.zeros_like(sg), where=spread > 0)
    c = (sy - a * sg) / n
    # Clamping: with c < 0 the best is c = 0 and a the slope through the origin (> 0 as g, y > 0);
    # with a < 0 it is a = 0 and c the mean loss.
    a = np.where(c < 0, sgy / sgg, np.maximum(a, 0.0))
    c = np.where(c < 0, 0.0, np.where(a > 0, c, sy / n))
    error = syy + a * a * sgg + n * c * c - 2 * a * sgy - 2 * c * sy + 2 * a * c * sg
    return a, c, error
