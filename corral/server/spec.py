"""The user's job spec (YAML or JSON), validated into a JobSpecModel.

Every refusal is a SpecError whose message is one line, ``[SOURCE: ]FIELD: reason``, naming the
first problem found: an unknown field first (it often explains a "missing" one: ``gpu`` for
``gpus``), then the declared fields in order, then the checks across fields (workers divide gpus).

    name: train-resnet          # required; 1-63 of [A-Za-z0-9._-]
    gpus: 4                     # required
    command: python train.py    # required; a string runs through /bin/sh -c, a list is argv
    workers: 2                  # each worker gets gpus/workers GPUs
    gpu_type: [a100, h100]      # acceptable GPU types, any case
    env: {EPOCHS: 10}           # numbers and booleans become strings
"""

from __future__ import annotations

import difflib
import math
import signal as signals
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from corral.config_file import YamlFileError, read_yaml_file
from corral.core.job import JobSpec, Priority

NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
MAX_NAME_LENGTH = 63
# A count this large is a typo, and it would overflow a 32-bit INTEGER column in PostgreSQL.
MAX_COUNT = 1_000_000
SIGNAL_EXAMPLES = "use e.g. SIGTERM, SIGINT, SIGUSR1"


class SpecError(ValueError):
    """A refused job spec; str() is one line: ``[SOURCE: ]FIELD: reason``."""

    def __init__(self, field: str, reason: str, source: str | None = None) -> None:
        self.field = field
        self.reason = reason
        self.source = source
        parts = [part for part in (source, field) if part] + [reason]
        super().__init__(": ".join(parts).replace("\r", "\\r").replace("\n", "\\n"))

    @classmethod
    def from_validation_error(cls, error: ValidationError, source: str | None = None) -> SpecError:
        """The first of pydantic's errors for a JobSpecModel, in the words of this module."""
        order = list(JobSpecModel.model_fields)
        details = error.errors(include_url=False)

        def rank(detail: Any) -> tuple[int, int]:
            loc = detail["loc"]
            if detail["type"] == "extra_forbidden":
                return (0, 0)
            if not loc:  # a check across fields runs only once every field is valid
                return (2, 0)
            return (1, order.index(loc[0]) if loc[0] in order else len(order))

        first = min(details, key=rank)  # min() is stable: pydantic's order breaks ties
        loc = [str(part) for part in first["loc"]]
        kind = first["type"]
        ctx = first.get("ctx") or {}
        if kind == "extra_forbidden":
            return cls(".".join(loc), "unknown field" + _did_you_mean(loc[-1], order), source)
        if kind == "missing":
            return cls(".".join(loc), "field required", source)
        if kind == "model_type":
            return cls("", "the job spec must be a mapping of fields", source)
        if kind == "spec":
            path = [*loc, ctx["path"]] if ctx.get("path") else loc
            if ctx.get("field"):
                path = [ctx["field"]]
            return cls(".".join(path), ctx["reason"], source)
        return cls(".".join(loc), str(first["msg"]), source)


def _did_you_mean(key: str, fields: list[str]) -> str:
    close = difflib.get_close_matches(key, fields, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _refuse(reason: str, path: str = "") -> PydanticCustomError:
    # The reason travels in ctx, not in the message template, so braces in user text are safe.
    return PydanticCustomError("spec", "{reason}", {"reason": reason, "path": path})


# -- one validator per field ----------------------------------------------------------------------


def _count(least: int, wording: str) -> Any:
    def check(value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise _refuse(f"must be a {wording} integer")
        if value > MAX_COUNT:
            raise _refuse(f"must be at most {MAX_COUNT}")
        return value

    return check


def _name(value: object) -> str:
    if not isinstance(value, str):
        raise _refuse("must be a string")
    if not 1 <= len(value) <= MAX_NAME_LENGTH or not NAME_CHARS.issuperset(value):
        raise _refuse(
            f"must be 1-{MAX_NAME_LENGTH} characters of letters, digits, '.', '_' and '-'"
        )
    return value


def _non_empty_text(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _refuse("must be a non-empty string")
    return value


def _choice(*choices: str) -> Any:
    wording = ", ".join(choices[:-1]) + " or " + choices[-1]

    def check(value: object) -> str:
        if isinstance(value, str) and value.lower() in choices:
            return value.lower()
        raise _refuse(f"must be {wording}")

    return check


def _gpu_types(value: object) -> str | list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        if not value.strip():
            raise _refuse("must not be empty")
        return value.strip().lower()
    if not isinstance(value, list):
        raise _refuse("must be a GPU type or a list of GPU types")
    if not value:
        raise _refuse("must not be an empty list")
    types: list[str] = []
    for index, item in enumerate(value):
        if not isinstance(item, str) or not item.strip():
            raise _refuse("must be a non-empty string", str(index))
        if item.strip().lower() not in types:
            types.append(item.strip().lower())
    return types


def _scalar_text(value: object) -> str | None:
    """A YAML scalar as the text the user meant (`10` -> "10", `true` -> "true"); None if not one."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return None


def _command(value: object) -> str | list[str]:
    if isinstance(value, str):
        if not value.strip():
            raise _refuse("must not be empty")
        return value
    if not isinstance(value, list):
        raise _refuse("must be a string (run by /bin/sh -c) or a list of arguments")
    if not value:
        raise _refuse("must not be empty")
    arguments: list[str] = []
    for index, item in enumerate(value):
        text = _scalar_text(item)
        if text is None:
            raise _refuse("must be a string", str(index))
        if "\0" in text:
            raise _refuse("must not contain a NUL character", str(index))
        arguments.append(text)
    if not arguments[0].strip():
        raise _refuse("must not be empty (it is the program to run)", "0")
    return arguments


def _env(value: object) -> dict[str, str]:
    if not isinstance(value, dict):
        raise _refuse("must be a mapping of variable names to strings")
    env: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise _refuse(f"variable names must be non-empty strings (got {key!r})")
        if "=" in key or "\0" in key:
            raise _refuse("a variable name must not contain '=' or a NUL character", key)
        text = _scalar_text(item)
        if text is None:
            raise _refuse("must be a string", key)
        if "\0" in text:
            raise _refuse("must not contain a NUL character", key)
        env[key] = text
    return env


def _workdir(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise _refuse("must be a non-empty path")
    return value


def _signal(value: object) -> str:
    if not isinstance(value, str):
        raise _refuse("must be a signal name such as SIGTERM")
    name = value.strip().upper()
    if not name.startswith("SIG"):
        name = "SIG" + name
    if name not in signals.Signals.__members__:
        raise _refuse(f"unknown signal {value!r}; {SIGNAL_EXAMPLES}")
    return name


def _grace(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _refuse("must be a non-negative number of seconds")
    if not math.isfinite(value) or value < 0:
        raise _refuse("must be a non-negative number of seconds")
    return float(value)


Name = Annotated[str, PlainValidator(_name, json_schema_input_type=str)]
Text = Annotated[str, PlainValidator(_non_empty_text, json_schema_input_type=str)]
Positive = Annotated[int, PlainValidator(_count(1, "positive"), json_schema_input_type=int)]
NonNegative = Annotated[int, PlainValidator(_count(0, "non-negative"), json_schema_input_type=int)]
PriorityName = Annotated[
    Literal["guaranteed", "opportunistic"],
    PlainValidator(
        _choice("guaranteed", "opportunistic"),
        json_schema_input_type=Literal["guaranteed", "opportunistic"],
    ),
]
Locality = Annotated[
    Literal["node", "rack", "any"],
    PlainValidator(
        _choice("node", "rack", "any"), json_schema_input_type=Literal["node", "rack", "any"]
    ),
]
GpuTypes = Annotated[
    str | list[str] | None,
    PlainValidator(_gpu_types, json_schema_input_type=str | list[str] | None),
]
Command = Annotated[
    str | list[str], PlainValidator(_command, json_schema_input_type=str | list[str])
]
Env = Annotated[dict[str, str], PlainValidator(_env, json_schema_input_type=dict[str, str])]
Workdir = Annotated[str | None, PlainValidator(_workdir, json_schema_input_type=str | None)]
SignalName = Annotated[str, PlainValidator(_signal, json_schema_input_type=str)]
Seconds = Annotated[float, PlainValidator(_grace, json_schema_input_type=float)]


class JobSpecModel(BaseModel):
    """A job as the user submits it: a gang of `workers` processes sharing `gpus` GPUs."""

    model_config = ConfigDict(extra="forbid")

    name: Name = Field(description="1-63 characters of [A-Za-z0-9._-]")
    vc: Text = Field("default", description="the virtual cluster (team) the job runs in")
    priority: PriorityName = Field(
        "guaranteed",
        description="guaranteed jobs use their VC's GPUs; opportunistic ones borrow idle GPUs",
    )
    gpus: Positive = Field(description="total GPUs, all held at once")
    workers: Positive = Field(1, description="processes; each gets gpus/workers GPUs")
    gpu_type: GpuTypes = Field(None, description="acceptable GPU types (any case)")
    locality: Locality = Field("node", description="preferred spread, relaxed after waiting")
    command: Command = Field(description="a string runs through /bin/sh -c; a list is argv")
    env: Env = Field(default_factory=dict, description="extra environment variables")
    workdir: Workdir = Field(None, description="working directory of every worker")
    max_retries: NonNegative = Field(0, description="failed attempts retried before FAILED")
    signal: SignalName = Field("SIGTERM", description="sent on preemption or cancel")
    grace_seconds: Seconds = Field(30.0, description="seconds between the signal and SIGKILL")

    @model_validator(mode="after")
    def _workers_divide_gpus(self) -> JobSpecModel:
        if self.gpus % self.workers:
            raise PydanticCustomError(
                "spec",
                "{reason}",
                {
                    "field": "workers",
                    "reason": f"must divide gpus ({self.workers} does not divide {self.gpus})",
                },
            )
        return self


# -- entry points ---------------------------------------------------------------------------------


def parse_job_spec(data: object, source: str | None = None) -> JobSpecModel:
    """Validate an already-loaded spec; SpecError naming `source` (e.g. the file) if refused."""
    if not isinstance(data, Mapping):
        raise SpecError("", "the job spec must be a mapping of fields", source)
    try:
        return JobSpecModel.model_validate(dict(data))
    except ValidationError as error:
        raise SpecError.from_validation_error(error, source) from None


def load_job_spec_file(path: str | Path) -> JobSpecModel:
    """Read and validate a YAML (or JSON: YAML reads it too) job spec file."""
    file = str(path)
    try:
        data = read_yaml_file(path)
    except YamlFileError as error:
        raise SpecError("", str(error), file) from None
    return parse_job_spec(data, file)


def to_core_spec(model: JobSpecModel, job_id: str, submit_time: float, user: str) -> JobSpec:
    """The scheduling core's view of the job (the core needs no command, env or signal)."""
    if model.gpu_type is None:
        gpu_types = None
    elif isinstance(model.gpu_type, str):
        gpu_types = frozenset({model.gpu_type.lower()})
    else:
        gpu_types = frozenset(kind.lower() for kind in model.gpu_type)
    return JobSpec(
        id=job_id,
        submit_time=submit_time,
        gpus=model.gpus,
        user=user,
        vc=model.vc,
        gpu_types=gpu_types,
        priority=Priority(model.priority),
        max_retries=model.max_retries,
        gpus_per_worker=model.gpus // model.workers,
    )


def signal_number(model: JobSpecModel) -> int:
    return int(signals.Signals[model.signal])


def argv(model: JobSpecModel) -> list[str]:
    if isinstance(model.command, str):
        return ["/bin/sh", "-c", model.command]
    return list(model.command)
