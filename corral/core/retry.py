"""What to do after a failed attempt: retry after a backoff, or give up. Pure: no I/O, no clock.

The scheduler records each failure of a job (`Failure`) and asks its `RetryRule` for a `Verdict`;
the live manager and the simulator both go through it, so a simulation replays the backoff and
the user-error rule the live system applies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from corral.core.options import option


@dataclass(frozen=True, slots=True)
class RetryOptions:
    """Retry backoff and the user-error rule.

    Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training Workloads"
    (USENIX ATC 2019), studied the failures of Microsoft's Philly cluster: many are user errors in
    the code or the configuration that show up soon after a job starts, the same way every time,
    and retrying them only wastes GPUs. So the same failure, each within `fast_fail_s` of the
    attempt's start, `fast_fail_repeats` + 1 times in a row, ends the job whatever its retries.
    """

    backoff_s: float = option(
        5.0, help="hold before the first retry, doubled for each next (s)", low=0
    )
    backoff_max_s: float = option(300.0, help="longest hold before a retry (s)", low=0)
    fast_fail_s: float = option(
        60.0, help="a failure this soon after the attempt's start counts as fast (s)", low=0
    )
    fast_fail_repeats: int = option(
        2, help="repeats of the same fast failure tolerated; one more ends the job", low=0
    )


@dataclass(frozen=True, slots=True)
class Failure:
    """One failed attempt: what it looked like (`signature`: alike failures compare equal), how
    long it ran, and whether the infrastructure (a node, the supervisor) rather than the job
    failed."""

    signature: str
    ran_s: float
    infrastructure: bool = False


@dataclass(frozen=True, slots=True)
class FailureReport:
    """What a shell reports about a failed attempt (`failed(job_id, now, report)`).

    `signature`: alike failures share it (default: `reason`); `ran_s`: how long the attempt's
    processes ran, when the shell knows it better than the core (default: since the start the
    core decided); `retry_after_s` replaces the rule's backoff; `give_up` ends the job now with
    `reason` (the shell judged it)."""

    reason: str
    infrastructure: bool = False
    signature: str | None = None
    ran_s: float | None = None
    retry_after_s: float | None = None
    give_up: bool = False

    @staticmethod
    def of(report: FailureReport | str) -> FailureReport:
        return report if isinstance(report, FailureReport) else FailureReport(report)


@dataclass(frozen=True, slots=True)
class Verdict:
    """`give_up`: end the job now, with `reason`; else retry, held `retry_after_s` seconds. For a
    retry, `reason` is the failure's own detail."""

    give_up: bool
    retry_after_s: float
    reason: str


class RetryRule:
    """The backoff and the user-error rule of `RetryOptions`, over a job's failure history.

    Every failure enters the history, infrastructure ones too: a supervisor that dies at once,
    again and again, is no passing fault of a machine and must not be retried forever."""

    def __init__(self, options: RetryOptions | None = None) -> None:
        self.options = options or RetryOptions()

    def backoff(self, failures: int) -> float:
        """Hold before the retry that follows the `failures`-th failure (from 1):
        backoff_s x 2^(failures-1), at most backoff_max_s."""
        options = self.options
        if failures < 1:
            return 0.0
        # 2.0 ** n overflows past n = 1023: the cap is reached long before.
        exponent = min(failures - 1, 1000)
        return float(min(options.backoff_s * 2.0**exponent, options.backoff_max_s))

    def repeated_fast_failure(self, history: Sequence[Failure]) -> bool:
        """True when the latest `fast_fail_repeats` + 1 failures were all fast and alike."""
        if not history:
            return False
        latest = history[-1].signature
        run = 0
        for failure in reversed(history):
            if failure.ran_s > self.options.fast_fail_s or failure.signature != latest:
                break
            run += 1
        return run > self.options.fast_fail_repeats

    def judge(self, history: Sequence[Failure], detail: str) -> Verdict:
        """The verdict after the latest failure of `history` (described by `detail`)."""
        backoff = self.backoff(len(history))
        if not self.repeated_fast_failure(history):
            return Verdict(give_up=False, retry_after_s=backoff, reason=detail)
        options = self.options
        kind = "lost" if history[-1].infrastructure else "user error"
        reason = (
            f"{kind}: the same failure {options.fast_fail_repeats + 1} times in a row, "
            f"each within {options.fast_fail_s:g} s ({detail})"
        )
        return Verdict(give_up=True, retry_after_s=backoff, reason=reason)


__all__ = ["Failure", "RetryOptions", "RetryRule", "Verdict"]
