"""The `__init__`s written out for the compiled build (docs/simulator.md, "Constructors without
interpreted code") take the dataclasses' fields with their defaults, and `Placed` and `NotPlaced`
read, compare and hash as the frozen dataclasses they replace."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from corral.core.actions import Decision, Preempt, Start
from corral.core.job import Job, JobSpec
from corral.core.placement.base import NotPlaced, Placed


@pytest.mark.parametrize("cls", [JobSpec, Job, Start, Preempt, Decision])
def test_a_written_init_takes_every_field_with_its_default(cls: type) -> None:
    # A field added to the class but not to its `__init__` would be left unset.
    if not inspect.isfunction(cls.__init__):
        pytest.skip("compiled: mypyc's __init__ shows no signature")
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    fields = [f for f in dataclasses.fields(cls) if f.init]
    assert [p.name for p in params] == [f.name for f in fields]
    for param, field in zip(params, fields, strict=True):
        if (cls, field.name) == (Decision, "respeeds"):  # None: a new empty list
            assert param.default is None
        elif field.default is dataclasses.MISSING:
            assert param.default is inspect.Parameter.empty
        else:
            assert param.default == field.default


def test_a_spec_a_job_and_the_actions_keep_their_fields_and_stay_frozen() -> None:
    spec = JobSpec("j", 5.0, 4, cpu_milli=2, deadline=9.0)
    assert (spec.id, spec.submit_time, spec.gpus, spec.cpu_milli, spec.plain) == (
        "j",
        5.0,
        4,
        2,
        False,  # a CPU request: not plain
    )
    moved = spec.moved(1.0, 5.0)
    assert moved == dataclasses.replace(spec, submit_time=1.0, deadline=5.0)
    assert JobSpec("k", 0.0, 1).plain
    job = Job(spec, seq=7)
    assert (job.id, job.seq, job.pending_why, job.node) == ("j", 7, "not yet considered", -1)
    start = Start("j", (1, 2), resumed=True)
    assert repr(start) == (
        "Start(job_id='j', gpus=(1, 2), relaxed=False, resumed=True, milli=1000, node=-1, "
        "precheck=False)"
    )
    assert Decision([start], None).respeeds == []
    for frozen in (spec, start, Preempt("j", (1,), "k")):
        with pytest.raises(AttributeError):  # FrozenInstanceError is one
            frozen.gpus = (3,)  # type: ignore[misc]


def test_placed_and_not_placed_read_compare_and_hash_as_the_dataclasses_did() -> None:
    # A frozen dataclass's repr names each field; its hash is the hash of the fields' tuple.
    placed = Placed((0, 1), True)
    assert repr(placed) == "Placed(gpus=(0, 1), relaxed=True, milli=1000, node=-1)"
    assert hash(placed) == hash(((0, 1), True, 1000, -1))
    assert placed == Placed((0, 1), True)
    assert placed != Placed((0, 1))
    assert placed != ((0, 1), True, 1000, -1)
    not_placed = NotPlaced(("{} free", 3))
    assert repr(not_placed) == "NotPlaced(why=('{} free', 3))"
    assert hash(not_placed) == hash((("{} free", 3),))
    assert not_placed == NotPlaced(("{} free", 3))
    assert not_placed.reason == "3 free"
