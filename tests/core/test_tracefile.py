"""corral's own trace format (corral.core.tracefile): records that give back the JobSpec and the
NodeDef they were written from, and refusals that name the field."""

from __future__ import annotations

import json
import re

import pytest

from corral.core.cluster import NodeDef
from corral.core.job import Elastic, JobSpec, Priority
from corral.core.nodes import NodeChange
from corral.core.tracefile import (
    RecordError,
    header_record,
    job_record,
    kind_of,
    node_change_record,
    node_record,
    read_header,
    read_job,
    read_node,
    read_node_change,
)

FULL = JobSpec(
    id="17",
    submit_time=12.5,
    gpus=4,
    user="alice",
    vc="vision",
    model="resnet50",
    gpu_types=frozenset({"v100", "a100"}),
    duration_s=340.25,
    total_steps=5000.0,
    spread_slowdown=1.25,
    priority=Priority.OPPORTUNISTIC,
    max_retries=2,
    deadline=900.0,
    elastic=Elastic(2, 8, 4),
    gpus_per_worker=2,
    checkpoint_every_s=60.0,
)


def through_json(record: dict[str, object]) -> dict[str, object]:
    return json.loads(json.dumps(record))


def test_every_field_of_a_job_and_a_node_comes_back() -> None:
    record = through_json(job_record(FULL, status="SUCCEEDED", name="train"))
    assert kind_of(record) == "job"
    assert record["gpu_types"] == ["a100", "v100"] and record["status"] == "SUCCEEDED"
    assert read_job(record) == FULL
    share = JobSpec("s", 0.0, 1, gpu_milli=250, cpu_milli=4000, memory_mib=1024)
    assert read_job(through_json(job_record(share))) == share
    # Only what a job needs; the rest defaults as in JobSpec.
    assert read_job({"kind": "job", "id": "x", "submit_time": 0, "gpus": 2}) == JobSpec("x", 0.0, 2)
    node = NodeDef("n1", 8, "a100", "r2", gpus_per_switch=4, cpu_milli=64000, memory_mib=512000)
    assert read_node(through_json(node_record(node))) == node
    assert read_header(through_json(header_record(1.5e9, throughputs="t.json"))) == (
        1.5e9,
        "t.json",
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"gpus": "two"}, "gpus: must be an integer >= 0, got 'two'"),
        ({"gpus": True}, "gpus: must be an integer >= 0, got True"),
        ({"submit_time": None}, "submit_time: missing"),
        ({"duration_s": 0}, "duration_s: must be a positive number, got 0"),
        ({"spread_slowdown": 0.5}, "spread_slowdown: must be a number >= 1, got 0.5"),
        ({"gpus_per_worker": 3}, "gpus_per_worker: must divide gpus (4), got 3"),
        ({"gpu_types": "v100"}, "gpu_types: must be null or a list of GPU types"),
        ({"priority": "high"}, "priority: must be guaranteed or opportunistic, got 'high'"),
        ({"elastic": {"min_gpus": 2}}, "elastic: must be null or {min_gpus, max_gpus, base_gpus}"),
        (
            {"elastic": {"min_gpus": 0, "max_gpus": 8, "base_gpus": 4}},
            "elastic.min_gpus: must be a positive integer, got 0",
        ),
        ({"gpu_milli": 250}, "gpus: a share of a GPU (gpu_milli 250) needs gpus 1, got 4"),
        ({"queue": "q1"}, "queue: unknown field (known: id, submit_time, gpus,"),
        ({"id": ""}, "id: must be a non-empty string, got ''"),
    ],
)
def test_a_bad_job_names_its_field(change: dict[str, object], message: str) -> None:
    record = job_record(FULL) | change
    with pytest.raises(RecordError, match="^" + re.escape(message)):
        read_job(record)


def test_a_bad_node_or_header_names_its_field() -> None:
    with pytest.raises(RecordError, match=r"^gpus_per_switch: must be at most gpus \(4\), got 8$"):
        read_node({"kind": "node", "name": "n", "gpus": 4, "gpus_per_switch": 8})
    with pytest.raises(RecordError, match="^name: missing$"):
        read_node({"kind": "node", "gpus": 4})
    with pytest.raises(RecordError, match="^version: this corral reads version 1, got 2$"):
        read_header({"kind": "trace", "version": 2})
    with pytest.raises(
        RecordError, match="^kind: must be trace, node, job, node_change or reservation, got 'pod'$"
    ):
        kind_of({"kind": "pod"})


def test_a_node_change_round_trips_and_a_bad_one_names_its_field() -> None:
    change = NodeChange(95.0, "a1", True, "swap a fan", preempt=True)
    record = node_change_record(change)
    assert record == {
        "kind": "node_change",
        "at": 95.0,
        "node": "a1",
        "state": "draining",
        "reason": "swap a fan",
        "preempt": True,
    }
    assert kind_of(record) == "node_change" and read_node_change(record) == change
    resumed = node_change_record(NodeChange(99.0, "a1", False))
    assert read_node_change(resumed) == NodeChange(99.0, "a1", False)
    with pytest.raises(
        RecordError,
        match="^state: must be one of draining, resumed, unhealthy, healthy, joined, left, offline, online, got 'down'$",
    ):
        read_node_change(record | {"state": "down"})
    with pytest.raises(RecordError, match="^preempt: must be true or false, got 1$"):
        read_node_change(record | {"preempt": 1})
    with pytest.raises(RecordError, match="^at: missing$"):
        read_node_change({k: v for k, v in record.items() if k != "at"})
    with pytest.raises(RecordError, match="^when: unknown field"):
        read_node_change(record | {"when": 1})
