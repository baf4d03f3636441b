"""The job spec: every refusal is one line naming the field; valid specs get the documented defaults."""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path

import pytest

from corral.core.job import JobSpec, Priority
from corral.server.spec import (
    JobSpecModel,
    SpecError,
    argv,
    deadline_instant,
    load_job_spec_file,
    parse_job_spec,
    signal_number,
    stored_dict,
    stored_json,
    to_core_spec,
)

BASE = {"name": "train", "gpus": 4, "command": "python train.py"}
NAME_RULE = "name: must be 1-63 characters of letters, digits, '.', '_' and '-'"
GRACE_RULE = "grace_seconds: must be a non-negative number of seconds"
DROP = object()  # an override value that removes the key from BASE
SHARE_RULE = "gpus: must be a positive integer, or a share of one GPU between 0 and 1"
DECIMALS_RULE = "gpus: a share of one GPU has at most 3 decimals (0.001 to 0.999), got "
MEMORY_RULE = "gpu_memory: must be a size such as 8GiB or 512MiB, or a whole number of MiB"


def spec_with(**overrides: object) -> dict[str, object]:
    data = dict(BASE)
    for key, value in overrides.items():
        if value is DROP:
            data.pop(key, None)
        else:
            data[key] = value
    return data


BAD_SPECS = [
    # counts: bool and float are not integers, strings are not coerced
    (spec_with(gpus=0), "gpus: must be a positive integer"),
    (spec_with(gpus=-2), "gpus: must be a positive integer"),
    (spec_with(gpus=True), "gpus: must be a positive integer"),
    (spec_with(gpus=2.0), "gpus: must be a positive integer"),
    (spec_with(gpus="4"), "gpus: must be a positive integer"),
    (spec_with(gpus=None), "gpus: must be a positive integer"),
    (spec_with(gpus=2_000_000), "gpus: must be at most 1000000"),
    (spec_with(workers=0), "workers: must be a positive integer"),
    (spec_with(workers=3), "workers: must divide gpus (3 does not divide 4)"),
    (spec_with(gpus=2, workers=4), "workers: must divide gpus (4 does not divide 2)"),
    (spec_with(max_retries=-1), "max_retries: must be a non-negative integer"),
    (spec_with(max_retries=False), "max_retries: must be a non-negative integer"),
    (spec_with(max_retries=1.5), "max_retries: must be a non-negative integer"),
    # a share of one GPU: below 1, at most 3 decimals, one worker
    (spec_with(gpus=0.0), "gpus: must be a positive integer"),
    (spec_with(gpus=-0.5), "gpus: must be a positive integer"),
    (spec_with(gpus=1.0), "gpus: must be a positive integer"),
    (spec_with(gpus=1.5), SHARE_RULE + " (got 1.5)"),
    (spec_with(gpus=0.0001), DECIMALS_RULE + "0.0001"),
    (spec_with(gpus=0.9999), DECIMALS_RULE + "0.9999"),
    (spec_with(gpus=math.nan), "gpus: must be a positive integer"),
    (spec_with(gpus=0.5, workers=2), "workers: must be 1 for a share of one GPU (gpus 0.5)"),
    (
        spec_with(gpus=0.5, elastic={"min_gpus": 1, "max_gpus": 2}),
        "elastic: a share of one GPU (gpus 0.5) is not resized",
    ),
    # gpu_memory
    (spec_with(gpu_memory="8GB"), MEMORY_RULE + " (got '8GB')"),
    (spec_with(gpu_memory="8"), MEMORY_RULE + " (got '8')"),
    (spec_with(gpu_memory="-1GiB"), MEMORY_RULE + " (got '-1GiB')"),
    (spec_with(gpu_memory="lots"), MEMORY_RULE + " (got 'lots')"),
    (spec_with(gpu_memory=8.5), MEMORY_RULE),
    (spec_with(gpu_memory=True), MEMORY_RULE),
    (spec_with(gpu_memory=[8]), MEMORY_RULE),
    (spec_with(gpu_memory="0.5MiB"), "gpu_memory: must be a whole number of MiB (got '0.5MiB')"),
    (spec_with(gpu_memory=0), "gpu_memory: must be at least 1MiB"),
    (spec_with(gpu_memory="0GiB"), "gpu_memory: must be at least 1MiB"),
    (spec_with(gpu_memory="2TiB"), "gpu_memory: must be at most 1TiB (1048576 MiB)"),
    # memory and cpus: each worker's limits
    (spec_with(memory="16G"), "memory: " + MEMORY_RULE.split(": ", 1)[1] + " (got '16G')"),
    (spec_with(memory=0), "memory: must be at least 1MiB"),
    (spec_with(memory=-5), "memory: must be at least 1MiB"),
    (spec_with(memory=1.5), "memory: " + MEMORY_RULE.split(": ", 1)[1]),
    (spec_with(memory="0.5MiB"), "memory: must be a whole number of MiB (got '0.5MiB')"),
    (spec_with(memory="65TiB"), "memory: must be at most 64TiB (67108864 MiB)"),
    (spec_with(cpus="4"), "cpus: must be a number of CPUs such as 4 or 0.5 (got '4')"),
    (spec_with(cpus=True), "cpus: must be a number of CPUs such as 4 or 0.5 (got True)"),
    (spec_with(cpus=math.inf), "cpus: must be a number of CPUs such as 4 or 0.5 (got inf)"),
    (spec_with(cpus=0), "cpus: must be at least 0.01 (got 0)"),
    (spec_with(cpus=0.005), "cpus: must be at least 0.01 (got 0.005)"),
    (spec_with(cpus=4097), "cpus: must be at most 4096 (got 4097)"),
    (spec_with(cpus=0.1234), "cpus: must have at most 3 decimals (got 0.1234)"),
    # unknown and missing fields
    (spec_with(colour="red"), "colour: unknown field"),
    (spec_with(gpus=DROP, gpu=4), "gpu: unknown field (did you mean 'gpus'?)"),
    (spec_with(command=DROP), "command: field required"),
    (spec_with(gpus=DROP), "gpus: field required"),
    ({}, "name: field required"),
    # several problems: unknown first, then in field order, cross-field checks last
    (spec_with(gpus=0, workers=0), "gpus: must be a positive integer"),
    (spec_with(workers=0, name="a b"), NAME_RULE),
    (spec_with(gpus=0, colour="red"), "colour: unknown field"),
    (
        spec_with(workers=3, signal="SIGFOO"),
        "signal: unknown signal 'SIGFOO'; use e.g. SIGTERM, SIGINT, SIGUSR1",
    ),
    # name
    (spec_with(name="my job"), NAME_RULE),
    (spec_with(name=""), NAME_RULE),
    (spec_with(name="a" * 64), NAME_RULE),
    (spec_with(name="résumé"), NAME_RULE),
    (spec_with(name=7), "name: must be a string"),
    # vc, priority, locality
    (spec_with(vc=""), "vc: must be a non-empty string"),
    (spec_with(vc=["a"]), "vc: must be a non-empty string"),
    (spec_with(priority="high"), "priority: must be guaranteed or opportunistic"),
    (spec_with(priority=1.5), "priority: must be guaranteed or opportunistic"),
    (spec_with(locality="zone"), "locality: must be node, rack or any"),
    # command
    (spec_with(command=""), "command: must not be empty"),
    (spec_with(command="   "), "command: must not be empty"),
    (spec_with(command=[]), "command: must not be empty"),
    (spec_with(command=["python", ["-u"]]), "command.1: must be a string"),
    (spec_with(command=["python", {"a": 1}]), "command.1: must be a string"),
    (spec_with(command=["", "x"]), "command.0: must not be empty (it is the program to run)"),
    (spec_with(command=["a", "b\0c"]), "command.1: must not contain a NUL character"),
    (spec_with(command=5), "command: must be a string (run by /bin/sh -c) or a list of arguments"),
    # env
    (spec_with(env={"FOO": [1]}), "env.FOO: must be a string"),
    (spec_with(env={"OK": "1", "FOO": {"a": 1}}), "env.FOO: must be a string"),
    (spec_with(env={"FOO": None}), "env.FOO: must be a string"),
    (spec_with(env=["A=1"]), "env: must be a mapping of variable names to strings"),
    (
        spec_with(env={"A=B": "x"}),
        "env.A=B: a variable name must not contain '=' or a NUL character",
    ),
    (spec_with(env={1: "x"}), "env: variable names must be non-empty strings (got 1)"),
    # gpu_type
    (spec_with(gpu_type=[]), "gpu_type: must not be an empty list"),
    (spec_with(gpu_type=["a100", 3]), "gpu_type.1: must be a non-empty string"),
    (spec_with(gpu_type=["a100", " "]), "gpu_type.1: must be a non-empty string"),
    (spec_with(gpu_type=""), "gpu_type: must not be empty"),
    (spec_with(gpu_type=5), "gpu_type: must be a GPU type or a list of GPU types"),
    # workdir, signal, grace
    (spec_with(workdir=""), "workdir: must be a non-empty path"),
    (spec_with(workdir=3), "workdir: must be a non-empty path"),
    (
        spec_with(signal="SIGFOO"),
        "signal: unknown signal 'SIGFOO'; use e.g. SIGTERM, SIGINT, SIGUSR1",
    ),
    (spec_with(signal="FOO"), "signal: unknown signal 'FOO'; use e.g. SIGTERM, SIGINT, SIGUSR1"),
    (spec_with(signal=15), "signal: must be a signal name such as SIGTERM"),
    (spec_with(grace_seconds=-1), GRACE_RULE),
    (spec_with(grace_seconds=-0.5), GRACE_RULE),
    (spec_with(grace_seconds="30"), GRACE_RULE),
    (spec_with(grace_seconds=True), GRACE_RULE),
    (spec_with(grace_seconds=math.inf), GRACE_RULE),
    (spec_with(grace_seconds=math.nan), GRACE_RULE),
    # not a mapping at all
    ([BASE], "the job spec must be a mapping of fields"),
    ("name: x", "the job spec must be a mapping of fields"),
    (None, "the job spec must be a mapping of fields"),
    (
        spec_with(priority=3, level=1),
        "priority: an integer priority is the job's level: give priority or level, not both",
    ),
    (spec_with(priority=10**7), "priority: an integer priority must be from -1000000 to 1000000"),
]


@pytest.mark.parametrize(("data", "message"), BAD_SPECS)
def test_each_bad_spec_gets_its_one_line_message(data: object, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_job_spec(data)
    assert str(caught.value) == message


def test_the_source_prefixes_the_message_and_the_parts_are_kept() -> None:
    with pytest.raises(SpecError) as caught:
        parse_job_spec(spec_with(gpus=0), source="job.yaml")
    assert str(caught.value) == "job.yaml: gpus: must be a positive integer"
    assert (caught.value.source, caught.value.field) == ("job.yaml", "gpus")
    assert caught.value.reason == "must be a positive integer"
    with pytest.raises(SpecError, match=r"^job.yaml: the job spec must be a mapping of fields$"):
        parse_job_spec([1], source="job.yaml")


def test_user_text_in_a_message_stays_on_one_line() -> None:
    with pytest.raises(SpecError) as caught:
        parse_job_spec(spec_with(signal="SIG\nFOO"))
    assert "\n" not in str(caught.value)
    assert (
        str(caught.value)
        == "signal: unknown signal 'SIG\\nFOO'; " + "use e.g. SIGTERM, SIGINT, SIGUSR1"
    )


def test_a_minimal_spec_gets_every_default() -> None:
    model = parse_job_spec(BASE)
    assert model.model_dump() == {
        "name": "train",
        "vc": "default",
        "priority": "guaranteed",
        "level": 0,
        "gpus": 4,
        "gpu_memory": None,
        "memory": None,
        "cpus": None,
        "workers": 1,
        "gpu_type": None,
        "locality": "node",
        "command": "python train.py",
        "env": {},
        "launcher": "none",
        "env_from": "none",
        "submitter_env": {},
        "workdir": None,
        "max_retries": 0,
        "signal": "SIGTERM",
        "grace_seconds": 30.0,
        "model": None,
        "total_steps": None,
        "time_limit": None,
        "signal_before_limit": None,
        "progress_timeout": None,
        "deadline": None,
        "elastic": None,
        "precheck": None,
        "dataset": None,
        "array": None,
        "after": [],
    }


@pytest.mark.parametrize(
    ("given", "memory_mib", "cpus"),
    [
        ({"memory": "16GiB", "cpus": 4}, 16384, 4.0),
        ({"memory": "1.5gib", "cpus": 0.5}, 1536, 0.5),
        ({"memory": 512, "cpus": 0.01}, 512, 0.01),
        ({"memory": "64TiB", "cpus": 4096}, 64 << 20, 4096.0),
    ],
)
def test_memory_and_cpus_are_kept_as_mib_and_cpus(
    given: dict[str, object], memory_mib: int, cpus: float
) -> None:
    model = parse_job_spec(spec_with(**given))
    assert (model.memory, model.cpus) == (memory_mib, cpus)
    again = parse_job_spec(json.loads(json.dumps(model.model_dump(mode="json"))))
    assert (again.memory, again.cpus) == (memory_mib, cpus)  # as the store keeps it


TELEMETRY_REFUSALS = [
    (spec_with(time_limit=0), "time_limit: must be a positive number of seconds"),
    (spec_with(time_limit=-5), "time_limit: must be a non-negative number of seconds"),
    (
        spec_with(progress_timeout="1h"),
        "progress_timeout: must be a non-negative number of seconds",
    ),
    (spec_with(total_steps=0), "total_steps: must be a positive integer"),
    (spec_with(total_steps=1.5), "total_steps: must be a positive integer"),
    (spec_with(model=""), "model: must be a non-empty string"),
    (
        spec_with(deadline="next tuesday"),
        "deadline: must be seconds after submission or an ISO 8601 date and time, "
        "e.g. 2026-12-01T18:00:00Z",
    ),
    (spec_with(elastic={"min_gpus": 2}), "elastic.max_gpus: field required"),
    (spec_with(precheck=0), "precheck: must be true, false or a positive number of seconds"),
    (spec_with(precheck="yes"), "precheck: must be true, false or a positive number of seconds"),
    (spec_with(elastic={"min_gpus": 1, "max_gpus": 8, "x": 1}), "elastic.x: unknown field"),
    (
        spec_with(elastic={"min_gpus": 8, "max_gpus": 16}),
        "elastic: must hold gpus (4) between min_gpus (8) and max_gpus (16)",
    ),
    (
        spec_with(workers=2, elastic={"min_gpus": 1, "max_gpus": 8}),
        "elastic: min_gpus and max_gpus must be multiples of one worker's GPUs (2)",
    ),
]


@pytest.mark.parametrize(("data", "message"), TELEMETRY_REFUSALS)
def test_telemetry_fields_are_checked(data: dict, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_job_spec(data)
    assert str(caught.value) == message


def test_telemetry_fields_reach_the_core() -> None:
    model = parse_job_spec(
        spec_with(
            total_steps=1000,
            deadline="2026-12-01T18:00:00+01:00",
            workers=2,
            elastic={"min_gpus": 2, "max_gpus": 8},
            model="bert",
        )
    )
    # 18:00 at +01:00 is 17:00 UTC: 1796144400 seconds after the epoch (`date -d ... +%s`).
    assert deadline_instant(model, 0.0) == 1796144400.0
    # Its length comes from total_steps at its model's measured rate: 1000 / 4 = 250 s.
    spec = to_core_spec(model, "1", 100.0, "ann", rate=4.0, spread_slowdown=1.5)
    assert (spec.model, spec.total_steps, spec.duration_s) == ("bert", 1000, 250.0)
    assert spec.spread_slowdown == 1.5
    assert (spec.elastic.min_gpus, spec.elastic.max_gpus, spec.elastic.base_gpus) == (2, 8, 4)  # type: ignore[union-attr]
    # A time limit is the user's estimate, and wins; a relative deadline counts from submission.
    timed = parse_job_spec(spec_with(time_limit=60, total_steps=1000, deadline=3600))
    spec = to_core_spec(timed, "1", 100.0, "ann", rate=4.0)
    assert (spec.duration_s, spec.deadline, spec.model) == (60.0, 3700.0, "train")


def test_a_full_spec_is_normalised() -> None:
    model = parse_job_spec(
        {
            "name": "bert.large_v2-1",
            "vc": "nlp",
            "priority": "Opportunistic",
            "gpus": 8,
            "workers": 4,
            "gpu_type": ["A100", "h100", "a100"],
            "locality": "RACK",
            "command": ["torchrun", "--nproc", 2, "train.py"],
            "env": {"EPOCHS": 10, "LR": 0.5, "DEBUG": True, "NAME": "x"},
            "workdir": "/data/bert",
            "max_retries": 3,
            "signal": "usr1",
            "grace_seconds": 0,
        }
    )
    assert model.priority == "opportunistic"
    assert model.locality == "rack"
    assert model.gpu_type == ["a100", "h100"]  # lower-cased, duplicates dropped, order kept
    assert model.command == ["torchrun", "--nproc", "2", "train.py"]
    assert model.env == {"EPOCHS": "10", "LR": "0.5", "DEBUG": "true", "NAME": "x"}
    assert model.signal == "SIGUSR1"
    assert model.grace_seconds == 0.0 and isinstance(model.grace_seconds, float)
    assert (model.workers, model.max_retries, model.workdir) == (4, 3, "/data/bert")
    # The dump is plain JSON and parses back to the same model (what the store keeps).
    again = parse_job_spec(json.loads(json.dumps(model.model_dump())))
    assert again == model


EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples" / "jobs").glob("*.yaml"))


@pytest.mark.parametrize(
    "data",
    [
        BASE,
        {
            **BASE,
            "gpus": 2,
            "gpu_type": ["A100", "h100"],
            "env": {"A": "é ☃ \u2028", "B": 'quote " and \\'},
            "command": ["python", "-c", "print('x')"],
            "elastic": {"min_gpus": 2, "max_gpus": 4},
            "array": "0-9%2",
            "after": [3, 1],
            "time_limit": 3600,
            "signal_before_limit": "SIGUSR1@60",
            "deadline": 7200,
            "precheck": True,
            "dataset": {"name": "imagenet", "size_gb": 140.5},
        },
        {**BASE, "gpus": 0.25, "gpu_memory": "8GiB", "priority": "opportunistic"},
    ],
    ids=["minimal", "rich", "share"],
)
def test_the_stored_json_is_the_dump_as_json(data: dict) -> None:
    """What a submission stores is what `json.dumps(model_dump(mode="json"))` writes: the
    committer writes it from the fields' own values, without `model_dump`."""
    model = parse_job_spec(data)
    assert stored_json(model) == json.dumps(model.model_dump(mode="json"))
    # The submitted row's dict is what that JSON reads back: same keys, values and types.
    dumped = stored_dict(model)
    assert dumped == json.loads(stored_json(model))
    assert [type(value) for value in dumped.values()] == [
        type(value) for value in json.loads(stored_json(model)).values()
    ]


@pytest.mark.parametrize("path", EXAMPLES, ids=[path.stem for path in EXAMPLES])
def test_each_example_spec_is_stored_as_its_dump(path: Path) -> None:
    model = load_job_spec_file(path)
    assert stored_json(model) == json.dumps(model.model_dump(mode="json"))


def test_a_single_gpu_type_string_is_lower_cased() -> None:
    assert parse_job_spec(spec_with(gpu_type=" V100 ")).gpu_type == "v100"


def test_the_longest_name_and_a_one_gpu_gang_are_accepted() -> None:
    model = parse_job_spec(spec_with(name="a" * 63, gpus=1, workers=1))
    assert model.name == "a" * 63


def test_to_core_spec_converts_types_and_priority() -> None:
    model = parse_job_spec(
        spec_with(vc="vision", gpu_type=["A100", "V100"], priority="opportunistic", max_retries=2)
    )
    core = to_core_spec(model, job_id="17", submit_time=1000.5, user="alice")
    assert core == JobSpec(
        id="17",
        submit_time=1000.5,
        gpus=4,
        user="alice",
        vc="vision",
        gpu_types=frozenset({"a100", "v100"}),
        priority=Priority.OPPORTUNISTIC,
        max_retries=2,
        gpus_per_worker=4,  # one worker (the default) holds all 4 GPUs
        model="train",  # its measured throughput is kept under its name
    )
    assert core.accepts("a100") and not core.accepts("t4")
    assert to_core_spec(parse_job_spec(spec_with(workers=2)), "3", 0.0, "bob").gpus_per_worker == 2
    assert to_core_spec(parse_job_spec(spec_with(workers=4)), "4", 0.0, "bob").gpus_per_worker == 1
    single = to_core_spec(parse_job_spec(spec_with(gpu_type="T4")), "1", 0.0, "bob")
    assert single.gpu_types == frozenset({"t4"})
    plain = to_core_spec(parse_job_spec(BASE), "2", 0.0, "bob")
    assert plain.gpu_types is None and plain.priority is Priority.GUARANTEED
    assert plain.accepts("anything")


@pytest.mark.parametrize(
    ("fields", "memory", "milli"),
    [
        ({"gpus": 0.5}, {}, 500),  # the share as given; no memory needed
        ({"gpus": 0.5}, {"v100": None}, 500),
        ({"gpus": 0.25, "gpu_memory": "6GiB"}, {"v100": 16384}, 375),  # 6 of 16 GiB
        ({"gpus": 0.5, "gpu_memory": "6GiB"}, {"v100": 16384}, 500),  # the larger of the two
        ({"gpus": 0.001, "gpu_memory": 1}, {"v100": 16384}, 1),  # rounded up to a milli-GPU
        ({"gpus": 0.001, "gpu_memory": 17}, {"v100": 16384}, 2),
        ({"gpus": 0.5, "gpu_memory": "16GiB"}, {"v100": 16384}, 1000),  # all of it: whole
        # the smallest GPU it may run on, of the types it accepts
        ({"gpus": 0.1, "gpu_memory": "8GiB"}, {"v100": 16384, "a100": 81920}, 500),
        (
            {"gpus": 0.1, "gpu_memory": "8GiB", "gpu_type": "a100"},
            {"v100": 16384, "a100": 81920},
            100,
        ),
        ({"gpus": 0.1, "gpu_memory": "8GiB", "gpu_type": "t4"}, {"v100": None}, 100),  # none here
        ({"gpus": 2, "gpu_memory": "8GiB"}, {"v100": 16384}, 1000),  # whole GPUs: only checked
    ],
)
def test_a_share_is_the_larger_of_gpus_and_gpu_memory_over_the_gpus_memory(
    fields: dict[str, object], memory: dict[str, int | None], milli: int
) -> None:
    model = parse_job_spec(spec_with(**fields))
    core = to_core_spec(model, "1", 0.0, "bob", gpu_memory=memory)
    assert core.gpu_milli == milli
    assert core.gpus == (1 if isinstance(fields["gpus"], float) else fields["gpus"])
    assert core.shares_gpu == (milli < 1000)
    assert core.gpus_per_worker == core.gpus


@pytest.mark.parametrize(
    ("fields", "memory", "message"),
    [
        (
            {"gpus": 0.5, "gpu_memory": "8GiB"},
            {},
            "gpu_memory: this manager does not know its GPUs' memory (declare it: corral up "
            "--gpu-memory SIZE)",
        ),
        (
            {"gpus": 1, "gpu_memory": "8GiB"},
            {"gpu": None},
            "gpu_memory: the memory of GPU type gpu is not known here (declare it: corral up "
            "--gpu-memory SIZE)",
        ),
        (
            {"gpus": 0.5, "gpu_memory": "20GiB"},
            {"v100": 16384, "a100": 81920},
            "gpu_memory: asks for 20GiB but a GPU of type v100 has 16GiB",
        ),
        (
            {"gpus": 0.5, "gpu_memory": 1000},
            {"t4": 512},
            "gpu_memory: asks for 1000MiB but a GPU of type t4 has 512MiB",
        ),
    ],
)
def test_gpu_memory_the_manager_cannot_size_is_refused(
    fields: dict[str, object], memory: dict[str, int | None], message: str
) -> None:
    model = parse_job_spec(spec_with(**fields))
    with pytest.raises(SpecError) as caught:
        to_core_spec(model, "1", 0.0, "bob", gpu_memory=memory)
    assert str(caught.value) == message


def test_a_share_and_gpu_memory_are_stored_as_given_and_read_back() -> None:
    model = parse_job_spec(spec_with(gpus=0.25, gpu_memory="1.5GiB"))
    assert (model.gpus, model.gpu_memory) == (0.25, 1536)
    stored = json.loads(json.dumps(model.model_dump(mode="json")))
    assert parse_job_spec(stored) == model  # what recovery reads back
    assert parse_job_spec(spec_with(gpu_memory=" 512 mib ")).gpu_memory == 512
    assert parse_job_spec(spec_with(gpu_memory=2048)).gpu_memory == 2048


def test_signal_number_and_argv() -> None:
    assert signal_number(parse_job_spec(BASE)) == signal.SIGTERM
    assert signal_number(parse_job_spec(spec_with(signal="SIGINT"))) == signal.SIGINT
    assert signal_number(parse_job_spec(spec_with(signal="hup"))) == signal.SIGHUP
    assert argv(parse_job_spec(BASE)) == ["/bin/sh", "-c", "python train.py"]
    listed = parse_job_spec(spec_with(command=["python", "-c", "print(1)"]))
    assert argv(listed) == ["python", "-c", "print(1)"]
    assert argv(listed) is not listed.command  # the caller may extend its copy


def test_the_model_is_extra_forbid_with_a_json_schema() -> None:
    schema = JobSpecModel.model_json_schema()
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["name", "gpus", "command"]
    assert schema["properties"]["priority"]["enum"] == ["guaranteed", "opportunistic"]


# -- files ------------------------------------------------------------------------------------------


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_a_yaml_file_and_a_json_file_load(tmp_path: Path) -> None:
    yaml_file = write(tmp_path, "job.yaml", "name: a\ngpus: 2\ncommand: [sleep, 1]\nenv:\n  N: 3\n")
    model = load_job_spec_file(yaml_file)
    assert (model.name, model.gpus, model.command, model.env) == (
        "a",
        2,
        ["sleep", "1"],
        {"N": "3"},
    )
    json_file = write(tmp_path, "job.json", json.dumps({"name": "b", "gpus": 1, "command": "true"}))
    assert load_job_spec_file(str(json_file)).name == "b"


def test_invalid_yaml_names_the_file_line_and_column(tmp_path: Path) -> None:
    # The flow list opened on line 2 meets the ':' of line 3 ("command" is 7 characters).
    path = write(tmp_path, "job.yaml", "name: a\ngpus: [1\ncommand: x\n")
    with pytest.raises(SpecError) as caught:
        load_job_spec_file(path)
    assert str(caught.value).startswith(f"{path}: line 3, column 8: invalid YAML: ")
    assert "\n" not in str(caught.value)
    indented = write(tmp_path, "indent.yaml", "name: a\n  gpus: 4\n")
    with pytest.raises(SpecError) as caught:
        load_job_spec_file(indented)
    assert str(caught.value) == (
        f"{indented}: line 2, column 7: invalid YAML: mapping values are not allowed here"
    )


def test_a_key_given_twice_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "job.yaml", "name: a\ngpus: 4\ngpus: 2\ncommand: x\n")
    with pytest.raises(SpecError, match=r"line 3, column 1: .*duplicate key 'gpus'"):
        load_job_spec_file(path)


def test_empty_missing_and_unreadable_files(tmp_path: Path) -> None:
    empty = write(tmp_path, "empty.yaml", "\n# nothing but a comment\n")
    with pytest.raises(SpecError) as caught:
        load_job_spec_file(empty)
    assert str(caught.value) == f"{empty}: the file is empty"
    missing = tmp_path / "missing.yaml"
    with pytest.raises(SpecError) as caught:
        load_job_spec_file(missing)
    assert str(caught.value) == f"{missing}: cannot read the file: No such file or directory"
    with pytest.raises(SpecError) as caught:
        load_job_spec_file(tmp_path)
    assert str(caught.value) == f"{tmp_path}: cannot read the file: Is a directory"
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(SpecError) as caught:
        load_job_spec_file(binary)
    assert str(caught.value) == f"{binary}: the file is not UTF-8 text"


def test_a_field_error_in_a_file_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "job.yaml", "name: a\ngpus: 4\nworkers: 3\ncommand: x\n")
    with pytest.raises(SpecError) as caught:
        load_job_spec_file(path)
    assert str(caught.value) == f"{path}: workers: must divide gpus (3 does not divide 4)"
    listed = write(tmp_path, "list.yaml", "- name: a\n")
    with pytest.raises(SpecError) as caught:
        load_job_spec_file(listed)
    assert str(caught.value) == f"{listed}: the job spec must be a mapping of fields"


# -- launcher and env_from --------------------------------------------------------------------

TORCHRUN = {"launcher": "torchrun", "workers": 2}
FROM_SUBMITTER = {"env_from": "submitter"}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"launcher": "mpirun"}, "launcher: must be none or torchrun"),
        ({"launcher": None}, "launcher: must be none or torchrun"),
        (
            TORCHRUN | {"command": "train.py 'unclosed"},
            "command: cannot be split into torchrun's arguments (No closing quotation)",
        ),
        (TORCHRUN | {"command": " "}, "command: must not be empty"),
        ({"env_from": "login"}, "env_from: must be none or submitter"),
        ({"submitter_env": {"A": "1"}}, "submitter_env: is used only with env_from: submitter"),
        (
            FROM_SUBMITTER | {"submitter_env": "PATH=/x"},
            "submitter_env: must be a mapping of variable names to strings",
        ),
        (
            FROM_SUBMITTER | {"submitter_env": {"BASH_FUNC_f%%": "() { :; }"}},
            "submitter_env.BASH_FUNC_f%%: a variable name must be letters, digits and '_', "
            "not starting with a digit",
        ),
        (
            FROM_SUBMITTER | {"submitter_env": {"1PATH": "x"}},
            "submitter_env.1PATH: a variable name must be letters, digits and '_', "
            "not starting with a digit",
        ),
        (
            FROM_SUBMITTER | {"submitter_env": {"CORRAL_TOKEN": "t"}},
            "submitter_env.CORRAL_TOKEN: corral's own variables (its credentials, what it sets "
            "per worker) are never passed",
        ),
        (
            FROM_SUBMITTER | {"submitter_env": {"corral_url": "u"}},
            "submitter_env.corral_url: corral's own variables (its credentials, what it sets "
            "per worker) are never passed",
        ),
        (
            FROM_SUBMITTER | {"submitter_env": {"HOME": "/root"}},
            "submitter_env.HOME: the account the job runs as sets it",
        ),
        (
            FROM_SUBMITTER | {"submitter_env": {"SSH_AUTH_SOCK": "/tmp/agent"}},
            "submitter_env.SSH_AUTH_SOCK: it belongs to the submitter's login session",
        ),
        (
            FROM_SUBMITTER | {"submitter_env": {"AWS_SECRET_ACCESS_KEY": "k"}},
            "submitter_env.AWS_SECRET_ACCESS_KEY: it looks like a secret (put it in env on "
            "purpose if the job needs it)",
        ),
        (
            FROM_SUBMITTER | {"submitter_env": {"A": "x\0y"}},
            "submitter_env.A: must not contain a NUL character",
        ),
        # 64 KiB in all: 65,536 bytes pass, one more is refused
        (
            FROM_SUBMITTER | {"submitter_env": {"A": "x" * 40000, "B": "y" * 25533}},
            "submitter_env: must be at most 65536 bytes in all (got 65537)",
        ),
        (
            FROM_SUBMITTER | {"submitter_env": {f"V{i}": "" for i in range(1025)}},
            "submitter_env: must have at most 1024 variables (got 1025)",
        ),
    ],
)
def test_launcher_and_env_from_refusals(overrides: dict, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_job_spec(spec_with(**overrides))
    assert str(caught.value) == message


def test_a_torchrun_spec_and_the_submitters_environment_under_the_specs_env() -> None:
    from corral.server.spec import job_env

    model = parse_job_spec(
        spec_with(
            launcher="TorchRun",
            env_from="Submitter",
            submitter_env={
                "PATH": "/venv/bin:/usr/bin",
                "EPOCHS": "1",
                "A": "x" * 40000,
                "B": "y" * 25501,  # 65,536 bytes in all: at the cap
            },
            env={"EPOCHS": 5},
        )
    )
    assert (model.launcher, model.env_from) == ("torchrun", "submitter")
    env = job_env(model)
    assert env["PATH"] == "/venv/bin:/usr/bin" and env["EPOCHS"] == "5"  # the spec's wins
    # without env_from, nothing of a submitter's environment
    assert job_env(parse_job_spec(spec_with(env={"A": "1"}))) == {"A": "1"}


@pytest.mark.parametrize(("priority", "level"), [(5, 5), (-2, -2), (0, 0)])
def test_an_integer_priority_is_a_guaranteed_job_s_level(priority: int, level: int) -> None:
    model = parse_job_spec(spec_with(priority=priority))
    assert (model.priority, model.level) == ("guaranteed", level)


def test_a_boolean_priority_is_not_an_integer_one() -> None:
    with pytest.raises(SpecError, match=r"^priority: "):
        parse_job_spec(spec_with(priority=True))
