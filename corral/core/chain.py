"""Several admissions consulted as one: the scheduler always holds a chain, possibly empty.

The chain consults, for each hook, only the admissions that have an opinion on it (those built
on `corral.core.admission.base.Admission` list theirs in `opinions`; any other is asked
everything), so an empty chain, or one whose admissions only count and check, costs the round
nothing beyond what they do. Verdicts combine as a conjunction: a job may start only if every
admission lets it (the first refusal is the reason, naming the admission when there are several),
a victim may be preempted only if every admission that picks victims lets it, and the bound on
a job's size is the smallest any admission sets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from corral.core.protocol import ADMISSION_HOOKS, Admission

if TYPE_CHECKING:
    from corral.core.job import Job, JobSpec


def opinions(admission: Admission) -> frozenset[str]:
    """The hooks the admission has an opinion on (all of them, if it does not say)."""
    declared = getattr(admission, "opinions", None)
    return frozenset(ADMISSION_HOOKS) if declared is None else frozenset(declared)


class AdmissionChain:
    """The admissions in front of one scheduler, in order."""

    def __init__(self, admissions: Iterable[Admission] = ()) -> None:
        self.members = tuple(admissions)
        names = [admission.name for admission in self.members]
        if len(set(names)) != len(names):
            raise ValueError(f"admission: {', '.join(names)}: an admission is chained twice")
        self.name = "+".join(names) or "none"
        self.volatile = any(admission.volatile for admission in self.members)
        self.picks_victims = any(admission.picks_victims for admission in self.members)
        self.counts_gpus = any(admission.counts_gpus for admission in self.members)
        self._with = {
            hook: tuple(a for a in self.members if hook in opinions(a)) for hook in ADMISSION_HOOKS
        }
        self._named = len(self.members) > 1

    def having(self, hook: str) -> bool:
        """Does any admission have an opinion on this hook?"""
        return bool(self._with[hook])

    def hooks(self, hook: str) -> tuple[Callable[..., Any], ...]:
        """The bound hooks of the admissions that have an opinion on it, in order (for the
        scheduler's hot paths: calling each of none costs nothing)."""
        return tuple(getattr(admission, hook) for admission in self._with[hook])

    def _verdict(self, admission: Admission, reason: str) -> str:
        return f"admission {admission.name}: {reason}" if self._named else reason

    def refusal(self, spec: JobSpec) -> str | None:
        for admission in self._with["refusal"]:
            reason = admission.refusal(spec)
            if reason is not None:
                return self._verdict(admission, reason)
        return None

    def capacity(self, spec: JobSpec) -> int | None:
        bounds = [a.capacity(spec) for a in self._with["capacity"]]
        return min((bound for bound in bounds if bound is not None), default=None)

    def begin_round(self, now: float) -> None:
        for admission in self._with["begin_round"]:
            admission.begin_round(now)

    def walks(self) -> Iterator[None]:
        for admission in self._with["walks"]:
            yield from admission.walks()

    def check(self, job: Job) -> str | None:
        for admission in self._with["check"]:
            reason = admission.check(job)
            if reason is not None:
                return self._verdict(admission, reason)
        return None

    def queue(self, job: Job) -> str | None:
        for admission in self._with["queue"]:
            queue = admission.queue(job)
            if queue is not None:
                return queue
        return None

    def may_preempt(self, victim: Job, job: Job) -> bool:
        return all(a.may_preempt(victim, job) for a in self._with["may_preempt"])

    def can_reclaim(self, job: Job) -> bool:
        return any(a.can_reclaim(job) for a in self._with["can_reclaim"])

    def reclaim(self, job: Job, running: Iterable[Job]) -> Iterator[Job]:
        reclaimers = self._with["reclaim"]
        if len(reclaimers) == 1:
            return reclaimers[0].reclaim(job, running)
        return self._reclaim_each(job, list(running))

    def _reclaim_each(self, job: Job, running: list[Job]) -> Iterator[Job]:
        for admission in self._with["reclaim"]:
            if admission.can_reclaim(job):
                yield from admission.reclaim(job, running)

    def someone_over_share(self) -> bool:
        return any(a.someone_over_share() for a in self._with["someone_over_share"])

    def describe(self, job: Job) -> str | None:
        notes = [a.describe(job) for a in self._with["describe"]]
        return "; ".join(note for note in notes if note) or None

    def on_start(self, job: Job, now: float) -> None:
        for admission in self._with["on_start"]:
            admission.on_start(job, now)

    def on_stop(self, job: Job, now: float) -> None:
        for admission in self._with["on_stop"]:
            admission.on_stop(job, now)

    def on_queue(self, job: Job, delta: int) -> None:
        for admission in self._with["on_queue"]:
            admission.on_queue(job, delta)

    def counters(self) -> dict[str, int]:
        counters: dict[str, int] = {}
        for admission in self._with["counters"]:
            counters.update(admission.counters())
        return counters


def as_chain(admission: Admission | Iterable[Admission] | None) -> AdmissionChain:
    """A chain of one admission, of several, or of none."""
    if isinstance(admission, AdmissionChain):
        return admission
    if admission is None:
        return AdmissionChain()
    if isinstance(admission, Iterable):
        return AdmissionChain(admission)
    return AdmissionChain((admission,))
