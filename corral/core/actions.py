"""What the core asks its shell (simulator or live manager) to carry out."""

from __future__ import annotations

from dataclasses import dataclass

from corral.core.compiled import init_fields, rebuilt

#: Sets a field of a frozen dataclass (what its generated `__init__` calls).
_set = object.__setattr__
#: This module is the compiled build's (setup.py): the actions' `__init__` store their fields with
#: mypyc's own attribute stores, which the frozen classes' `__setattr__` does not see (from Python
#: an action stays frozen).
_NATIVE = not __file__.endswith(".py")


# Written out (`init=False`) rather than generated: in the compiled build (setup.py) the
# generated `__init__` stays interpreted, and a round makes a Decision, a start a Start.
@dataclass(slots=True, frozen=True, init=False)
class Start:
    """Run the job on exactly these GPUs. `resumed`: it ran before and restores its checkpoint.

    `milli` below 1000: the job has a share of its one GPU, which other jobs' shares use too (the
    shell still makes that GPU the visible one, `CUDA_VISIBLE_DEVICES`); `node`: the node whose
    CPU and memory it takes, -1 when it asks for none (a job without GPUs runs there).

    `precheck`: this attempt is the job's pre-run (corral.core.precheck): the shell launches ONE
    worker on these GPUs (`gpus_per_worker` of them) with WORLD_SIZE 1, and reports the first
    progress it sees with `progressed`; a pre-run never restores a checkpoint (`resumed` False).
    """

    job_id: str
    gpus: tuple[int, ...]
    relaxed: bool = False
    resumed: bool = False
    milli: int = 1000
    node: int = -1
    precheck: bool = False

    def __init__(
        self,
        job_id: str,
        gpus: tuple[int, ...],
        relaxed: bool = False,
        resumed: bool = False,
        milli: int = 1000,
        node: int = -1,
        precheck: bool = False,
    ) -> None:
        if _NATIVE:  # (see `_NATIVE`)
            self.job_id = job_id  # type: ignore[misc]
            self.gpus = gpus  # type: ignore[misc]
            self.relaxed = relaxed  # type: ignore[misc]
            self.resumed = resumed  # type: ignore[misc]
            self.milli = milli  # type: ignore[misc]
            self.node = node  # type: ignore[misc]
            self.precheck = precheck  # type: ignore[misc]
            return
        _set(self, "job_id", job_id)
        _set(self, "gpus", gpus)
        _set(self, "relaxed", relaxed)
        _set(self, "resumed", resumed)
        _set(self, "milli", milli)
        _set(self, "node", node)
        _set(self, "precheck", precheck)

    def __reduce__(self) -> tuple[object, ...]:
        return rebuilt, (Start, {name: getattr(self, name) for name in _START_ARGS})


#: What `Start.__init__` takes (`__reduce__`).
_START_ARGS = init_fields(Start)


@dataclass(slots=True, frozen=True, init=False)
class Preempt:
    """Stop the job through its checkpoint contract (signal, grace period, kill); it waits again.

    The core already counts its GPUs as free: the shell must not start a job on them before the
    preempted job's processes are gone.

    `by_job_id` names the job it makes room for, or the reason when none does (`PRECHECK_PASSED`,
    "elasticflow resize"). `precheck`: the job's pre-run passed and this stops it: the job waits
    again for its whole gang and starts over (not a preemption: `Job.preemptions` and the
    scheduler's `preemptions` do not count it).

    `kind` says why, in the word the shell records (an event, the attempt's outcome):
    "preempted" (by the waiting job `by_job_id`), "migrated" (moved to make room for
    `by_job_id`, its `Start` elsewhere follows in the same decision) or "unpacked" (a packing
    stage split it from `by_job_id`, whose GPUs they shared, as the pair did not gain).
    """

    job_id: str
    gpus: tuple[int, ...]
    by_job_id: str
    precheck: bool = False
    kind: str = "preempted"

    def __init__(
        self,
        job_id: str,
        gpus: tuple[int, ...],
        by_job_id: str,
        precheck: bool = False,
        kind: str = "preempted",
    ) -> None:
        if _NATIVE:  # (see `_NATIVE`)
            self.job_id = job_id  # type: ignore[misc]
            self.gpus = gpus  # type: ignore[misc]
            self.by_job_id = by_job_id  # type: ignore[misc]
            self.precheck = precheck  # type: ignore[misc]
            self.kind = kind  # type: ignore[misc]
            return
        _set(self, "job_id", job_id)
        _set(self, "gpus", gpus)
        _set(self, "by_job_id", by_job_id)
        _set(self, "precheck", precheck)
        _set(self, "kind", kind)

    def __reduce__(self) -> tuple[object, ...]:
        return rebuilt, (Preempt, {name: getattr(self, name) for name in _PREEMPT_ARGS})


#: What `Preempt.__init__` takes (`__reduce__`).
_PREEMPT_ARGS = init_fields(Preempt)


@dataclass(slots=True, frozen=True)
class Respeed:
    """The running job's speed changed (ideal seconds per wall second) without stopping it, e.g.
    it started or stopped sharing its GPUs. Work done so far is kept (`Job.change_speed`). Not an
    `Action`: there is nothing to carry out; the simulator re-times the job's end."""

    job_id: str
    speed: float


Action = Start | Preempt


@dataclass(slots=True, frozen=True, init=False)
class Decision:
    actions: list[Action]
    #: When the scheduler wants to decide again even if nothing happens (a timer), or None.
    wake_at: float | None
    #: Running jobs whose speed changed since the last decision, with their new speed.
    respeeds: list[Respeed]

    def __init__(
        self, actions: list[Action], wake_at: float | None, respeeds: list[Respeed] | None = None
    ) -> None:
        if _NATIVE:  # (see `_NATIVE`)
            self.actions = actions  # type: ignore[misc]
            self.wake_at = wake_at  # type: ignore[misc]
            self.respeeds = [] if respeeds is None else respeeds  # type: ignore[misc]
            return
        _set(self, "actions", actions)
        _set(self, "wake_at", wake_at)
        _set(self, "respeeds", [] if respeeds is None else respeeds)
