"""The user's job spec (YAML or JSON), validated into a JobSpecModel.

Every refusal is a SpecError whose message is one line, ``[SOURCE: ]FIELD: reason``, naming the
first problem found: an unknown field first (it often explains a "missing" one: ``gpu`` for
``gpus``), then the declared fields in order, then the checks across fields (workers divide gpus).

    name: train-resnet          # required; 1-63 of [A-Za-z0-9._-]
    gpus: 4                     # required; or a share of one GPU: 0.5 (at most 3 decimals)
    gpu_memory: 8GiB            # GPU memory it needs (a share may grow to hold it)
    memory: 16GiB               # each worker's memory limit (RAM and swap), all it starts too
    cpus: 4                     # each worker's CPU limit (CPU seconds per second)
    command: python train.py    # required; a string runs through /bin/sh -c, a list is argv
    workers: 2                  # each worker gets gpus/workers GPUs
    gpu_type: [a100, h100]      # acceptable GPU types, any case
    env: {EPOCHS: 10}           # numbers and booleans become strings
    launcher: torchrun          # corral runs torchrun per worker; command is the script
    env_from: submitter         # corral submit sends the submitter's environment

Sizes are capped (see the constants below and docs/job-spec.md), so that no spec can exhaust the
manager or fail at exec time: a command string or argument, and each NAME=value of `env`, at most
the kernel's MAX_ARG_STRLEN; the whole spec, as the JSON the store keeps, at most MAX_SPEC_BYTES.
No string may hold a NUL character (the kernel and PostgreSQL refuse it) or a lone surrogate (it
is not UTF-8).

**A share of one GPU.** `gpus` below 1 (0.001 to 0.999) asks for that share of one GPU, in
milli-GPU (0.5 is 500; the core's `JobSpec(gpus=1, gpu_milli=500)`), with one worker; other jobs'
shares may run on the same GPU. `gpu_memory` (`8GiB`, `512MiB`, or an integer of MiB) is the GPU
memory the job needs: with the memory of the GPU types it may run on known to the manager, a share
becomes max(gpus, gpu_memory / the smallest such GPU's memory), rounded up to a milli-GPU (a whole
GPU at most), and a job asking for more memory than such a GPU has is refused; with any of them
unknown, `gpu_memory` is refused (`share_milli`, `to_core_spec`).
"""

from __future__ import annotations

import difflib
import json
import math
import re
import shlex
import signal as signals
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    PrivateAttr,
    ValidationError,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import PydanticCustomError

from corral import submitenv
from corral.config_file import YamlFileError, read_yaml_file
from corral.core.cluster import MILLI  # milli-GPU in one GPU: a share is given in thousandths
from corral.core.job import Elastic, JobSpec, Priority

NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
MAX_NAME_LENGTH = 63
# A count this large is a typo, and it would overflow a 32-bit INTEGER column in PostgreSQL.
MAX_COUNT = 1_000_000
SIGNAL_EXAMPLES = "use e.g. SIGTERM, SIGINT, SIGUSR1"
#: A command string, one argument, and one NAME=value of `env`, in UTF-8 bytes: the kernel's
#: MAX_ARG_STRLEN (32 pages of 4 KiB) counts the terminating NUL; longer fails execve (E2BIG).
MAX_ARGUMENT_BYTES = 128 * 1024 - 1
#: Arguments of a list command.
MAX_ARGUMENTS = 4096
#: Variables of `env`, and the bytes of one name.
MAX_ENV_VARS = 1024
MAX_ENV_NAME_BYTES = 255
#: `vc` and each GPU type, in characters; GPU types in the list.
MAX_TEXT_CHARS = 128
MAX_GPU_TYPES = 64
#: `workdir` in bytes: PATH_MAX (4096) counts the terminating NUL.
MAX_WORKDIR_BYTES = 4095
#: A signal name (SIGRTMIN is the longest the system knows).
MAX_SIGNAL_CHARS = 32
#: The whole spec as the JSON the store keeps: a command of MAX_ARGUMENT_BYTES and a large env.
MAX_SPEC_BYTES = 256 * 1024
#: A job array's tasks (`array: "0-99%10"`), and its largest index (corral.server.limits).
MAX_ARRAY_TASKS = 10_000
MAX_ARRAY_INDEX = 1_000_000
#: Jobs one job may wait for (`after`).
MAX_AFTER = 1024
#: `level`, the integer priority within a VC: -MAX_LEVEL to MAX_LEVEL.
MAX_LEVEL = 1_000_000
ARRAY_RULE = "must be indexes such as 0-99, 1,3,5-7 or 0-99%10 (at most 10 running)"
#: The longest a pre-run (`precheck: true`) may take before the job gets its gang anyway.
DEFAULT_PRECHECK_S = 300.0
#: `gpu_memory` in MiB: 1 TiB is beyond any GPU.
MAX_GPU_MEMORY_MIB = 1 << 20
_MEMORY_UNITS = {"mib": 1, "gib": 1 << 10, "tib": 1 << 20}
_MEMORY = re.compile(r"^\s*([0-9]{1,9}(?:\.[0-9]{1,9})?)\s*([MmGgTt][Ii][Bb])\s*$")
GPU_MEMORY_RULE = "must be a size such as 8GiB or 512MiB, or a whole number of MiB"
#: `memory` in MiB: 64 TiB is beyond any one machine's memory.
MAX_MEMORY_MIB = 64 << 20
#: `cpus`: at most this many, in thousandths (Kubernetes' milli-CPU), at least 0.01 (the
#: kernel's smallest CPU quota, 1 ms in 100 ms).
MAX_CPUS = 4096
MIN_CPUS = 0.01
#: JSON schema patterns: no NUL; and, for text that must not be blank, a non-space character.
NO_NUL = r"^[^\x00]*$"
NOT_BLANK = r"^[^\x00]*[^\s\x00][^\x00]*$"
#: Characters escaped when user text is echoed in a message (a message is one line of UTF-8).
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029]")


def one_line(text: str, limit: int | None = None) -> str:
    """User text made safe to echo in a one-line message: control characters, line breaks and
    lone surrogates escaped (a response is UTF-8, which cannot carry a lone surrogate), and cut
    to `limit` characters."""
    if limit is not None and len(text) > limit:
        text = text[:limit] + "..."
    return _UNSAFE.sub(lambda match: match.group().encode("unicode_escape").decode(), text)


class SpecError(ValueError):
    """A refused job spec; str() is one line: ``[SOURCE: ]FIELD: reason``."""

    def __init__(self, field: str, reason: str, source: str | None = None) -> None:
        self.field = field
        self.reason = reason
        self.source = source
        parts = [part for part in (source, one_line(field, 100)) if part] + [reason]
        super().__init__(one_line(": ".join(parts), 1000))

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
            # a top-level field may be a misspelling of another; a nested one is not of these
            hint = _did_you_mean(loc[-1], order) if len(loc) == 1 else ""
            return cls(".".join(loc), "unknown field" + hint, source)
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


def _checked_text(value: str, max_bytes: int, path: str = "", what: str = "") -> str:
    """`value` if it holds no NUL, is UTF-8 (no lone surrogate) and fits in `max_bytes`."""
    if "\0" in value:
        raise _refuse("must not contain a NUL character", path)
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise _refuse("must be Unicode text (it holds a lone surrogate)", path) from None
    if size > max_bytes:
        raise _refuse(f"{what or 'must be'} at most {max_bytes} bytes (got {size})", path)
    return value


def _count(least: int, wording: str) -> Any:
    def check(value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise _refuse(f"must be a {wording} integer")
        if value > MAX_COUNT:
            raise _refuse(f"must be at most {MAX_COUNT}")
        return value

    return check


def _gpus(value: object) -> int | float:
    """A positive integer (whole GPUs), or a share of one GPU: 0 < gpus < 1, in thousandths."""
    if isinstance(value, float) and 0 < value < 1:
        milli = round(value * MILLI)
        if milli < 1 or milli >= MILLI or abs(value * MILLI - milli) > 1e-6:
            raise _refuse(
                f"a share of one GPU has at most 3 decimals (0.001 to 0.999), got {value!r}"
            )
        return milli / MILLI
    if isinstance(value, float) and math.isfinite(value) and value > 1 and not value.is_integer():
        raise _refuse(
            f"must be a positive integer, or a share of one GPU between 0 and 1 (got {value!r})"
        )
    whole: int = _count(1, "positive")(value)
    return whole


def gpu_memory_mib(value: object) -> int | None:
    """`gpu_memory` in MiB: "8GiB", "1.5GiB", "512MiB" (MiB, GiB, TiB, any case), or an integer
    of MiB; a whole number of MiB, at least 1 and at most 1 TiB."""
    return _size_mib(value, MAX_GPU_MEMORY_MIB)


def memory_mib(value: object) -> int | None:
    """`memory` in MiB: as `gpu_memory_mib`, at most 64 TiB."""
    return _size_mib(value, MAX_MEMORY_MIB)


def _size_mib(value: object, most: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise _refuse(GPU_MEMORY_RULE)
    if isinstance(value, int):
        mib: float = value
    else:
        found = _MEMORY.match(value) if len(value) <= 32 else None
        if found is None:
            raise _refuse(f"{GPU_MEMORY_RULE} (got {one_line(repr(value), 40)})")
        mib = float(found.group(1)) * _MEMORY_UNITS[found.group(2).lower()]
        if not mib.is_integer():
            raise _refuse(f"must be a whole number of MiB (got {one_line(repr(value), 40)})")
    if mib < 1:
        raise _refuse("must be at least 1MiB")
    if mib > most:
        raise _refuse(f"must be at most {most >> 20}TiB ({most} MiB)")
    return int(mib)


def _cpus(value: object) -> float | None:
    """`cpus`: a number of CPUs, 0.01 to MAX_CPUS, at most 3 decimals (milli-CPUs)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _refuse(
            f"must be a number of CPUs such as 4 or 0.5 (got {one_line(repr(value), 40)})"
        )
    if value < MIN_CPUS:
        raise _refuse(f"must be at least {MIN_CPUS:g} (got {value!r})")
    if value > MAX_CPUS:
        raise _refuse(f"must be at most {MAX_CPUS} (got {value!r})")
    milli = round(value * 1000)
    if abs(value * 1000 - milli) > 1e-6:
        raise _refuse(f"must have at most 3 decimals (got {value!r})")
    return milli / 1000


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
    _short_text(value)
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
        _short_text(value)
        return value.strip().lower()
    if not isinstance(value, list):
        raise _refuse("must be a GPU type or a list of GPU types")
    if not value:
        raise _refuse("must not be an empty list")
    if len(value) > MAX_GPU_TYPES:
        raise _refuse(f"must list at most {MAX_GPU_TYPES} GPU types (got {len(value)})")
    types: list[str] = []
    for index, item in enumerate(value):
        if not isinstance(item, str) or not item.strip():
            raise _refuse("must be a non-empty string", str(index))
        _short_text(item, str(index))
        if item.strip().lower() not in types:
            types.append(item.strip().lower())
    return types


def _short_text(value: str, path: str = "") -> None:
    """A `vc` or a GPU type: at most MAX_TEXT_CHARS characters, and `_checked_text`."""
    if len(value) > MAX_TEXT_CHARS:
        raise _refuse(f"must be at most {MAX_TEXT_CHARS} characters (got {len(value)})", path)
    _checked_text(value, 4 * MAX_TEXT_CHARS, path)


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
        return _checked_text(value, MAX_ARGUMENT_BYTES)
    if not isinstance(value, list):
        raise _refuse("must be a string (run by /bin/sh -c) or a list of arguments")
    if not value:
        raise _refuse("must not be empty")
    if len(value) > MAX_ARGUMENTS:
        raise _refuse(f"must have at most {MAX_ARGUMENTS} arguments (got {len(value)})")
    arguments: list[str] = []
    for index, item in enumerate(value):
        text = _scalar_text(item)
        if text is None:
            raise _refuse("must be a string", str(index))
        arguments.append(_checked_text(text, MAX_ARGUMENT_BYTES, str(index)))
    if not arguments[0].strip():
        raise _refuse("must not be empty (it is the program to run)", "0")
    return arguments


def _env(value: object) -> dict[str, str]:
    if not isinstance(value, dict):
        raise _refuse("must be a mapping of variable names to strings")
    if len(value) > MAX_ENV_VARS:
        raise _refuse(f"must have at most {MAX_ENV_VARS} variables (got {len(value)})")
    env: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise _refuse(
                f"variable names must be non-empty strings (got {one_line(repr(key), 40)})"
            )
        if "=" in key or "\0" in key:
            raise _refuse("a variable name must not contain '=' or a NUL character", key)
        _checked_text(key, MAX_ENV_NAME_BYTES, key, "a variable name must be")
        text = _scalar_text(item)
        if text is None:
            raise _refuse("must be a string", key)
        # The kernel's limit is on the whole NAME=value string.
        _checked_text(text, MAX_ARGUMENT_BYTES - len(key.encode()) - 1, key)
        env[key] = text
    return env


def _submitter_env(value: object) -> dict[str, str]:
    """`env`'s rules, and: names the shells agree on, none of corral's own, the account's or the
    login session's, nor one that looks like a secret (corral.submitenv); at most
    submitenv.MAX_BYTES in all."""
    env = _env(value)
    for key in env:
        problem = submitenv.refusal(key)
        if problem is not None:
            raise _refuse(problem, key)
    size = sum(len(f"{key}={text}".encode()) for key, text in env.items())
    if size > submitenv.MAX_BYTES:
        raise _refuse(f"must be at most {submitenv.MAX_BYTES} bytes in all (got {size})")
    return env


def _workdir(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise _refuse("must be a non-empty path")
    return _checked_text(value, MAX_WORKDIR_BYTES)


def _signal(value: object) -> str:
    if not isinstance(value, str) or len(value) > MAX_SIGNAL_CHARS:
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


def _positive_seconds(value: object) -> float | None:
    if value is None:
        return None
    seconds = _grace(value)
    if seconds <= 0:
        raise _refuse("must be a positive number of seconds")
    return seconds


def _deadline(value: object) -> float | str | None:
    """Seconds after submission (a number), or an ISO 8601 instant (a string; UTC unless it
    names its offset)."""
    if value is None:
        return None
    if isinstance(value, str):
        if len(value) > 64:
            raise _refuse("must be an ISO 8601 date and time, e.g. 2026-12-01T18:00:00Z")
        try:
            instant = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise _refuse(
                "must be seconds after submission or an ISO 8601 date and time, "
                "e.g. 2026-12-01T18:00:00Z"
            ) from None
        if instant.tzinfo is None:
            instant = instant.replace(tzinfo=UTC)
        return instant.isoformat()
    return _positive_seconds(value)


def _precheck(value: object) -> bool | float | None:
    if value is None or isinstance(value, bool):
        return value
    if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise _refuse("must be true, false or a positive number of seconds")
    return float(value)


def _level(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > MAX_LEVEL:
        raise _refuse(f"must be an integer from -{MAX_LEVEL} to {MAX_LEVEL}")
    return value


_ARRAY_ITEM = re.compile(r"^([0-9]{1,7})(?:-([0-9]{1,7}))?$")


def array_tasks(text: str) -> tuple[list[int], int | None]:
    """The indexes of an `array` string ("0-99%10", "1,3,5-7") and its cap on running tasks
    (None: no cap); ValueError with the reason, for the field's message."""
    body, percent, cap_text = text.strip().partition("%")
    cap = None
    if percent:
        if not cap_text.isascii() or not cap_text.isdigit() or len(cap_text) > 7:
            raise ValueError(f"the cap after '%' must be a positive integer (got {cap_text!r})")
        cap = int(cap_text)
        if cap < 1:
            raise ValueError("the cap after '%' must be at least 1")
    indexes: list[int] = []
    seen: set[int] = set()
    for item in body.split(","):
        found = _ARRAY_ITEM.match(item.strip())
        if found is None:
            raise ValueError(f"{ARRAY_RULE} (got {text!r})")
        low = int(found.group(1))
        high = int(found.group(2)) if found.group(2) is not None else low
        if high < low:
            raise ValueError(f"the range {item.strip()} goes down")
        if high > MAX_ARRAY_INDEX:
            raise ValueError(f"an index is at most {MAX_ARRAY_INDEX} (got {high})")
        if len(indexes) + high - low + 1 > MAX_ARRAY_TASKS:
            raise ValueError(f"at most {MAX_ARRAY_TASKS} tasks")
        for index in range(low, high + 1):
            if index in seen:
                raise ValueError(f"index {index} is given twice")
            seen.add(index)
            indexes.append(index)
    return indexes, cap


def _array(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 4096:
        raise _refuse(ARRAY_RULE)
    try:
        array_tasks(value)
    except ValueError as error:
        raise _refuse(str(error)) from None
    return "".join(value.split())


def _after(value: object) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _refuse("must be a list of job ids")
    if len(value) > MAX_AFTER:
        raise _refuse(f"must name at most {MAX_AFTER} jobs (got {len(value)})")
    ids: list[int] = []
    for index, item in enumerate(value):
        if isinstance(item, str) and item.isascii() and item.isdigit() and len(item) <= 12:
            item = int(item)
        if isinstance(item, bool) or not isinstance(item, int) or item < 1:
            raise _refuse("must be a job id (a positive integer)", str(index))
        if item not in ids:
            ids.append(item)
    return ids


def _signal_before_limit(value: object) -> str | None:
    if value is None:
        return None
    rule = "must be SIGNAL@SECONDS, such as SIGUSR1@120"
    if not isinstance(value, str) or len(value) > 64:
        raise _refuse(rule)
    name, at, seconds = value.strip().partition("@")
    if not at or not seconds.strip().isascii() or not seconds.strip().isdigit():
        raise _refuse(f"{rule} (got {value!r})")
    number = int(seconds)
    if not 1 <= number <= 1_000_000:
        raise _refuse(f"the seconds must be 1 to 1000000 (got {number})")
    return f"{_signal(name)}@{number}"


def signal_before(model: JobSpecModel) -> tuple[int, float] | None:
    """`signal_before_limit` as (signal number, seconds before the time limit), or None."""
    if model.signal_before_limit is None:
        return None
    name, _, seconds = model.signal_before_limit.partition("@")
    return int(signals.Signals[name]), float(seconds)


def precheck_seconds(model: JobSpecModel) -> float | None:
    """The core's `precheck_s`: None (the cluster's default), 0 (none) or the longest pre-run."""
    if model.precheck is None:
        return None
    if isinstance(model.precheck, bool):
        return DEFAULT_PRECHECK_S if model.precheck else 0.0
    return model.precheck


def deadline_instant(model: JobSpecModel, submit_time: float) -> float | None:
    """The spec's deadline as an instant of the manager's clock (epoch seconds)."""
    if model.deadline is None:
        return None
    if isinstance(model.deadline, str):
        return datetime.fromisoformat(model.deadline).timestamp()
    return submit_time + model.deadline


class ElasticRange(BaseModel):
    """ElasticFlow's range: the job runs on any GPU count between these (multiples of its
    workers' GPUs), resized by a checkpoint-restart."""

    model_config = ConfigDict(extra="forbid")

    min_gpus: Positive = Field(description="the fewest GPUs the job may run on")
    max_gpus: Positive = Field(description="the most GPUs the job may run on")


# Each type's JSON schema states its rules that JSON Schema can (byte caps as lengths: a character
# is at least one byte); the rest is in the descriptions and docs/job-spec.md.


def _string(max_length: int, pattern: str = NO_NUL, min_length: int = 0) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "maxLength": max_length, "pattern": pattern}
    if min_length:
        schema["minLength"] = min_length
    return schema


_SCALAR_ARGUMENT = {
    "anyOf": [_string(MAX_ARGUMENT_BYTES), {"type": "number"}, {"type": "boolean"}],
}
_GPU_TYPE = _string(MAX_TEXT_CHARS, NOT_BLANK, 1)

Name = Annotated[
    str,
    PlainValidator(_name),
    WithJsonSchema(_string(MAX_NAME_LENGTH, r"^[A-Za-z0-9._-]+$", 1)),
]
Text = Annotated[
    str, PlainValidator(_non_empty_text), WithJsonSchema(_string(MAX_TEXT_CHARS, NOT_BLANK, 1))
]
Positive = Annotated[
    int,
    PlainValidator(_count(1, "positive")),
    WithJsonSchema({"type": "integer", "minimum": 1, "maximum": MAX_COUNT}),
]
GpuCount = Annotated[
    int | float,
    PlainValidator(_gpus),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 1, "maximum": MAX_COUNT},
                {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "exclusiveMaximum": 1,
                    "description": "a share of one GPU, at most 3 decimals (0.001 to 0.999)",
                },
            ]
        }
    ),
]
GpuMemory = Annotated[
    int | None,
    PlainValidator(gpu_memory_mib),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 1, "maximum": MAX_GPU_MEMORY_MIB},
                {
                    "type": "string",
                    "maxLength": 32,
                    "pattern": r"^\s*[0-9]{1,9}(\.[0-9]{1,9})?\s*[MmGgTt][Ii][Bb]\s*$",
                },
                {"type": "null"},
            ]
        }
    ),
]
Memory = Annotated[
    int | None,
    PlainValidator(memory_mib),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 1, "maximum": MAX_MEMORY_MIB},
                {
                    "type": "string",
                    "maxLength": 32,
                    "pattern": r"^\s*[0-9]{1,9}(\.[0-9]{1,9})?\s*[MmGgTt][Ii][Bb]\s*$",
                },
                {"type": "null"},
            ]
        }
    ),
]
Cpus = Annotated[
    float | None,
    PlainValidator(_cpus),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "minimum": MIN_CPUS, "maximum": MAX_CPUS},
                {"type": "null"},
            ]
        }
    ),
]
NonNegative = Annotated[
    int,
    PlainValidator(_count(0, "non-negative")),
    WithJsonSchema({"type": "integer", "minimum": 0, "maximum": MAX_COUNT}),
]
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
    PlainValidator(_gpu_types),
    WithJsonSchema(
        {
            "anyOf": [
                _GPU_TYPE,
                {"type": "array", "items": _GPU_TYPE, "minItems": 1, "maxItems": MAX_GPU_TYPES},
                {"type": "null"},
            ]
        }
    ),
]
Command = Annotated[
    str | list[str],
    PlainValidator(_command),
    WithJsonSchema(
        {
            "anyOf": [
                _string(MAX_ARGUMENT_BYTES, NOT_BLANK, 1),
                {
                    "type": "array",
                    "items": _SCALAR_ARGUMENT,
                    "minItems": 1,
                    "maxItems": MAX_ARGUMENTS,
                },
            ]
        }
    ),
]
Env = Annotated[
    dict[str, str],
    PlainValidator(_env),
    WithJsonSchema(
        {
            "type": "object",
            "maxProperties": MAX_ENV_VARS,
            "propertyNames": _string(MAX_ENV_NAME_BYTES, r"^[^=\x00]+$", 1),
            "additionalProperties": _SCALAR_ARGUMENT,
        }
    ),
]
Launcher = Annotated[
    Literal["none", "torchrun"],
    PlainValidator(_choice("none", "torchrun"), json_schema_input_type=Literal["none", "torchrun"]),
]
EnvFrom = Annotated[
    Literal["none", "submitter"],
    PlainValidator(
        _choice("none", "submitter"), json_schema_input_type=Literal["none", "submitter"]
    ),
]
SubmitterEnv = Annotated[
    dict[str, str],
    PlainValidator(_submitter_env),
    WithJsonSchema(
        {
            "type": "object",
            "maxProperties": MAX_ENV_VARS,
            "propertyNames": _string(MAX_ENV_NAME_BYTES, submitenv.NAME.pattern, 1),
            "additionalProperties": {"type": "string"},
        }
    ),
]
Workdir = Annotated[
    str | None,
    PlainValidator(_workdir),
    WithJsonSchema({"anyOf": [_string(MAX_WORKDIR_BYTES, NOT_BLANK, 1), {"type": "null"}]}),
]
Level = Annotated[
    int,
    PlainValidator(_level),
    WithJsonSchema({"type": "integer", "minimum": -MAX_LEVEL, "maximum": MAX_LEVEL}),
]
ArrayText = Annotated[
    str | None,
    PlainValidator(_array),
    WithJsonSchema({"anyOf": [_string(4096, r"^[0-9,%\s-]+$", 1), {"type": "null"}]}),
]
After = Annotated[
    list[int],
    PlainValidator(_after),
    WithJsonSchema(
        {"type": "array", "maxItems": MAX_AFTER, "items": {"type": "integer", "minimum": 1}}
    ),
]
SignalBeforeLimit = Annotated[
    str | None,
    PlainValidator(_signal_before_limit),
    WithJsonSchema({"anyOf": [_string(64, r"^\s*[A-Za-z0-9]+@[0-9]+\s*$", 3), {"type": "null"}]}),
]
SignalName = Annotated[
    str,
    PlainValidator(_signal),
    WithJsonSchema(_string(MAX_SIGNAL_CHARS, r"^\s*[A-Za-z0-9]+\s*$", 1)),
]
Seconds = Annotated[float, PlainValidator(_grace), WithJsonSchema({"type": "number", "minimum": 0})]
PositiveSeconds = Annotated[
    float | None,
    PlainValidator(_positive_seconds),
    WithJsonSchema({"anyOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "null"}]}),
]
Deadline = Annotated[
    float | str | None,
    PlainValidator(_deadline),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "exclusiveMinimum": 0},
                {"type": "string", "maxLength": 64, "format": "date-time"},
                {"type": "null"},
            ]
        }
    ),
]
Precheck = Annotated[
    bool | float | None,
    PlainValidator(_precheck),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "boolean"},
                {"type": "number", "exclusiveMinimum": 0},
                {"type": "null"},
            ]
        }
    ),
]
OptionalText = Annotated[
    str | None,
    PlainValidator(lambda value: None if value is None else _non_empty_text(value)),
    WithJsonSchema({"anyOf": [_string(MAX_TEXT_CHARS, NOT_BLANK, 1), {"type": "null"}]}),
]
OptionalPositive = Annotated[
    int | None,
    PlainValidator(lambda value: None if value is None else _count(1, "positive")(value)),
    WithJsonSchema(
        {"anyOf": [{"type": "integer", "minimum": 1, "maximum": MAX_COUNT}, {"type": "null"}]}
    ),
]


# -- dataset: what the job reads, for the node caches (docs/silod.md#live) ------------------------

#: GB/s a job reads per GPU at full speed when its spec does not say: ImageNet's ~110 KB images at
#: ~900 images/s per GPU (ResNet-50 on a recent GPU). A job that reads slower than its share of
#: the storage bandwidth never waits for storage (the cache then only holds what nobody wants).
DEFAULT_READ_GB_S = 0.1
#: Caps: a data set of a petabyte, a terabyte per second per GPU.
MAX_DATASET_GB = 1e6
MAX_READ_GB_S = 1e3
DATASET_NAME_RULE = (
    f"must be 1-{MAX_NAME_LENGTH} characters of letters, digits, '.', '_' and '-', "
    "starting with a letter or digit"
)


def _dataset_name(value: object) -> str:
    # It names a directory of every node's cache: never "..", never hidden.
    if (
        not isinstance(value, str)
        or not 1 <= len(value) <= MAX_NAME_LENGTH
        or not NAME_CHARS.issuperset(value)
        or not value[0].isalnum()
    ):
        raise _refuse(DATASET_NAME_RULE)
    return value


def _positive_number(most: float) -> Any:
    def check(value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _refuse("must be a positive number")
        if not math.isfinite(value) or value <= 0:
            raise _refuse("must be a positive number")
        if value > most:
            raise _refuse(f"must be at most {most:,.0f}")
        return float(value)

    return check


def _dataset(value: object) -> object:
    if value is not None and not isinstance(value, Mapping):
        raise _refuse("must be a mapping: {name, size_gb, read_gb_s (optional)}")
    return value


class DatasetSpec(BaseModel):
    """The data set the job reads (SiloD's node caches, `corral up --cache-gb-per-node`)."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[
        str,
        PlainValidator(_dataset_name),
        WithJsonSchema(_string(MAX_NAME_LENGTH, r"^[A-Za-z0-9][A-Za-z0-9._-]*$", 1)),
    ] = Field(description="names the data set, and its directory in every node's cache")
    size_gb: Annotated[
        float,
        PlainValidator(_positive_number(MAX_DATASET_GB)),
        WithJsonSchema({"type": "number", "exclusiveMinimum": 0, "maximum": MAX_DATASET_GB}),
    ] = Field(description="its size in GB (1e9 bytes)")
    read_gb_s: Annotated[
        float | None,
        PlainValidator(lambda v: None if v is None else _positive_number(MAX_READ_GB_S)(v)),
        WithJsonSchema(
            {
                "anyOf": [
                    {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_READ_GB_S},
                    {"type": "null"},
                ]
            }
        ),
    ] = Field(
        None,
        description=f"GB/s the job reads per GPU at full speed (default {DEFAULT_READ_GB_S:g})",
    )


Dataset = Annotated[DatasetSpec | None, BeforeValidator(_dataset)]


class JobSpecModel(BaseModel):
    """A job as the user submits it: a gang of `workers` processes sharing `gpus` GPUs.

    Strings hold no NUL character; byte caps count UTF-8 bytes; the whole spec, as JSON, is at
    most 262,144 bytes."""

    # Frozen: the JSON text measured when it was validated (`stored_json`) stays its text.
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The spec as the store keeps it, written by `_fits_in_the_store` (None: not yet).
    _json: str | None = PrivateAttr(None)

    name: Name = Field(description="1-63 characters of [A-Za-z0-9._-]")
    vc: Text = Field(
        "default", description="the virtual cluster (team) the job runs in; 1-128 characters"
    )
    priority: PriorityName = Field(
        "guaranteed",
        description="guaranteed jobs use their VC's GPUs; opportunistic ones borrow idle GPUs",
    )
    level: Level = Field(
        0,
        description="an integer priority within the VC (and class): higher levels wait ahead "
        "of lower ones, the policy's order breaks ties; where the policy preempts, a higher "
        "level may preempt a lower one",
    )
    gpus: GpuCount = Field(
        description="total GPUs, all held at once; or a share of one GPU below 1 (0.5: half "
        "of one GPU, which other jobs' shares may use too; at most 3 decimals, one worker)"
    )
    gpu_memory: GpuMemory = Field(
        None,
        description="GPU memory the job needs on each of its GPUs: 8GiB, 512MiB, or MiB as an "
        "integer; a share grows to hold it (needs the GPU type's memory known)",
    )
    memory: Memory = Field(
        None,
        description="the most memory (RAM and swap) each worker may use, with everything it "
        "starts: 16GiB, 512MiB, or MiB as an integer; at the limit the kernel kills a process "
        "and the attempt fails as 'out of memory' (a limit, not a request: corral places no "
        "job by it)",
    )
    cpus: Cpus = Field(
        None,
        description="the most CPU time each worker may use, with everything it starts, in CPUs "
        "(CPU seconds per second): 4, 0.5; at most 3 decimals; beyond it the kernel throttles "
        "the worker (a limit, not a request)",
    )
    workers: Positive = Field(1, description="processes; each gets gpus/workers GPUs")
    gpu_type: GpuTypes = Field(None, description="acceptable GPU types (any case)")
    locality: Locality = Field("node", description="preferred spread, relaxed after waiting")
    command: Command = Field(
        description="a string runs through /bin/sh -c; a list (at most 4,096 items) is argv; "
        "the string, or each argument, at most 131,071 bytes (the kernel's MAX_ARG_STRLEN)"
    )
    env: Env = Field(
        default_factory=dict,
        description="extra environment variables: at most 1,024; names of at most 255 bytes "
        "without '='; each NAME=value at most 131,071 bytes",
    )
    launcher: Launcher = Field(
        "none",
        description="none: every worker runs command; torchrun: corral runs torchrun per worker "
        "(one process per GPU of the worker) and command is the script and its arguments",
    )
    env_from: EnvFrom = Field(
        "none",
        description="none: the job's environment is the manager's (or the account's); "
        "submitter: the submitter's too, as corral submit sends it in submitter_env",
    )
    submitter_env: SubmitterEnv = Field(
        default_factory=dict,
        description="the submitter's environment, for env_from: submitter (the client fills "
        "it); env overrides it",
    )
    workdir: Workdir = Field(
        None,
        description="working directory of every worker: an absolute path of at most 4,095 "
        "bytes that is a directory on the manager's machine (local executor)",
    )
    max_retries: NonNegative = Field(0, description="failed attempts retried before FAILED")
    signal: SignalName = Field("SIGTERM", description="sent on preemption or cancel")
    grace_seconds: Seconds = Field(30.0, description="seconds between the signal and SIGKILL")
    model: OptionalText = Field(
        None,
        description="what the job trains, the key under which corral keeps its measured "
        "throughput (default: the job's name)",
    )
    total_steps: OptionalPositive = Field(
        None, description="steps the job will run, in the unit its progress reports count"
    )
    time_limit: PositiveSeconds = Field(
        None,
        description="seconds of running after which the job is stopped and fails; also its "
        "length for sjf and srtf (the user's estimate, as in Slurm)",
    )
    signal_before_limit: SignalBeforeLimit = Field(
        None,
        description="SIGNAL@SECONDS (Slurm's --signal): the signal sent to the job's processes "
        "that many seconds before its time_limit, once per attempt (needs time_limit)",
    )
    progress_timeout: PositiveSeconds = Field(
        None,
        description="seconds without a progress report after which an attempt counts as hung: "
        "it is stopped and retried as the infrastructure's failure",
    )
    deadline: Deadline = Field(
        None,
        description="when the job should be done: seconds after submission, or an ISO 8601 "
        "date and time (edf and elasticflow order by it)",
    )
    elastic: ElasticRange | None = Field(
        None, description="ElasticFlow: the range of GPU counts the job may be resized within"
    )
    precheck: Precheck = Field(
        None,
        description="run the job first as one worker until its first progress report, before "
        f"it holds its whole gang (Philly's pre-run): true ({DEFAULT_PRECHECK_S:g} s at most), "
        "false (none, whatever the cluster's default), or the most seconds it may take",
    )
    dataset: Dataset = Field(
        None,
        description="the data set the job reads, cached on the nodes it runs on: "
        "{name, size_gb, read_gb_s} (docs/silod.md#live)",
    )
    array: ArrayText = Field(
        None,
        description=f"a job array: one task per index, such as 0-99, 1,3,5-7 or 0-99%10 (at "
        f"most 10 running at once); at most {MAX_ARRAY_TASKS} tasks, each an ordinary job that "
        "gets CORRAL_ARRAY_INDEX and CORRAL_ARRAY_JOB_ID",
    )
    after: After = Field(
        default_factory=list,
        description="ids of jobs that must succeed before this one starts (Slurm's afterok); "
        "if one fails or is cancelled, this job fails without starting",
    )

    @model_validator(mode="before")
    @classmethod
    def _integer_priority(cls, data: Any) -> Any:
        """`priority: 5`, the integer priority of Slurm and Kueue: a guaranteed job at level 5."""
        if not isinstance(data, dict):
            return data
        value = data.get("priority")
        if not isinstance(value, int) or isinstance(value, bool):
            return data
        reason = None
        if "level" in data:
            reason = "an integer priority is the job's level: give priority or level, not both"
        elif abs(value) > MAX_LEVEL:
            reason = f"an integer priority must be from -{MAX_LEVEL} to {MAX_LEVEL}"
        if reason is not None:
            raise PydanticCustomError("spec", "{reason}", {"field": "priority", "reason": reason})
        return {**data, "priority": "guaranteed", "level": value}

    @model_validator(mode="after")
    def _workers_divide_gpus(self) -> JobSpecModel:
        if isinstance(self.gpus, float):  # a share of one GPU: one process
            if self.workers != 1:
                raise PydanticCustomError(
                    "spec",
                    "{reason}",
                    {
                        "field": "workers",
                        "reason": f"must be 1 for a share of one GPU (gpus {self.gpus:g})",
                    },
                )
            return self
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

    @model_validator(mode="after")
    def _torchrun_command(self) -> JobSpecModel:
        """Under torchrun a command string is split into words, as the shell would (no shell
        runs it): refused at once if it cannot be."""
        if self.launcher != "torchrun" or not isinstance(self.command, str):
            return self
        try:
            words = shlex.split(self.command)
        except ValueError as error:
            reason = f"cannot be split into torchrun's arguments ({error})"
        else:
            if words:
                return self
            reason = "must name the script torchrun runs"
        raise PydanticCustomError("spec", "{reason}", {"field": "command", "reason": reason})

    @model_validator(mode="after")
    def _submitter_env_wanted(self) -> JobSpecModel:
        if self.submitter_env and self.env_from != "submitter":
            raise PydanticCustomError(
                "spec",
                "{reason}",
                {"field": "submitter_env", "reason": "is used only with env_from: submitter"},
            )
        return self

    @model_validator(mode="after")
    def _elastic_range(self) -> JobSpecModel:
        if self.elastic is None:
            return self
        if isinstance(self.gpus, float):
            raise PydanticCustomError(
                "spec",
                "{reason}",
                {
                    "field": "elastic",
                    "reason": f"a share of one GPU (gpus {self.gpus:g}) is not resized",
                },
            )
        unit = self.gpus // self.workers
        low, high = self.elastic.min_gpus, self.elastic.max_gpus
        problem = None
        if not low <= self.gpus <= high:
            problem = f"must hold gpus ({self.gpus}) between min_gpus ({low}) and max_gpus ({high})"
        elif low % unit or high % unit:
            problem = f"min_gpus and max_gpus must be multiples of one worker's GPUs ({unit})"
        if problem is not None:
            raise PydanticCustomError("spec", "{reason}", {"field": "elastic", "reason": problem})
        return self

    @model_validator(mode="after")
    def _signal_needs_a_limit(self) -> JobSpecModel:
        if self.signal_before_limit is None:
            return self
        seconds = float(self.signal_before_limit.partition("@")[2])
        problem = None
        if self.time_limit is None:
            problem = "needs time_limit (the signal is sent that many seconds before it)"
        elif seconds >= self.time_limit:
            problem = f"must come before the time_limit ({seconds:g} s >= {self.time_limit:g} s)"
        if problem is not None:
            raise PydanticCustomError(
                "spec", "{reason}", {"field": "signal_before_limit", "reason": problem}
            )
        return self

    @model_validator(mode="after")
    def _fits_in_the_store(self) -> JobSpecModel:
        # What the store keeps: the spec as JSON (ASCII). The fields' own values are what
        # `model_dump` gives for every plain value (str, int, float, None, lists, dicts), so
        # their JSON is measured without it; any other value, or a spec found too long that
        # way, is measured as the store will write it.
        try:
            text = _PLAIN_JSON.encode(self.__dict__)
        except _NotPlain:
            text = json.dumps(self.model_dump(mode="json"))
        size = len(text)
        if size > MAX_SPEC_BYTES:
            size = len(json.dumps(self.model_dump(mode="json")))
        if size > MAX_SPEC_BYTES:
            raise PydanticCustomError(
                "spec",
                "{reason}",
                {"reason": f"the job spec is {size} bytes as JSON; at most {MAX_SPEC_BYTES}"},
            )
        self._json = text  # (what the store writes: encoded once)
        return self

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Any:
        """A copy, whose JSON text is written again when it is stored (it may differ)."""
        copied = super().model_copy(update=update, deep=deep)
        copied._json = None
        return copied


class _NotPlain(Exception):
    """A field's value that json cannot write as `model_dump(mode="json")` would."""


def _plain_fields(value: object) -> dict[str, Any]:
    """json's `default` for a spec's own values: a nested model's fields (as `model_dump`
    gives them); _NotPlain for anything else."""
    if isinstance(value, BaseModel):
        return value.__dict__
    raise _NotPlain


#: `json.dumps`'s encoder (the same separators, ASCII), nested models written as their fields.
_PLAIN_JSON = json.JSONEncoder(default=_plain_fields)


def stored_json(model: JobSpecModel) -> str:
    """The spec as the store keeps it: `json.dumps(model.model_dump(mode="json"))`, written
    from the fields' own values where they are all plain (as `_fits_in_the_store` measures
    it), without `model_dump`, which calls a Python function per validated field."""
    if model._json is not None:
        return model._json
    try:
        return _PLAIN_JSON.encode(model.__dict__)
    except _NotPlain:
        return json.dumps(model.model_dump(mode="json"))


#: The types whose values `model_dump(mode="json")` gives as they are.
_JSON_TYPES = frozenset({str, int, float, bool, type(None), list, dict})


def stored_dict(model: JobSpecModel) -> dict[str, Any]:
    """`model_dump(mode="json")`, as the stored JSON reads back: the fields' own values when
    they are all plain (no nested model), else the stored JSON read back."""
    fields = model.__dict__
    if all(type(value) in _JSON_TYPES for value in fields.values()):
        return dict(fields)
    parsed: dict[str, Any] = json.loads(stored_json(model))
    return parsed


# -- entry points ---------------------------------------------------------------------------------


def parse_job_spec(data: object, source: str | None = None) -> JobSpecModel:
    """Validate an already-loaded spec; SpecError naming `source` (e.g. the file) if refused."""
    if not isinstance(data, Mapping):
        raise SpecError("", "the job spec must be a mapping of fields", source)
    for key in data:  # (pydantic cannot even read a key that is not UTF-8)
        if isinstance(key, str) and _UNSAFE.search(key) and key not in JobSpecModel.model_fields:
            raise SpecError(key, "unknown field", source)
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


def model_key(model: JobSpecModel) -> str:
    """The key of the job's measured throughput: its `model`, else its name."""
    return model.model or model.name


def whole_gpus(model: JobSpecModel) -> int:
    """The GPUs the job holds: `gpus`, or the one GPU a share is on."""
    return model.gpus if isinstance(model.gpus, int) else 1


def _gpu_types(model: JobSpecModel) -> frozenset[str] | None:
    if model.gpu_type is None:
        return None
    if isinstance(model.gpu_type, str):
        return frozenset({model.gpu_type.lower()})
    return frozenset(kind.lower() for kind in model.gpu_type)


def _mib(mib: int) -> str:
    return f"{mib // 1024}GiB" if mib % 1024 == 0 else f"{mib}MiB"


def share_milli(
    model: JobSpecModel,
    gpu_memory: Mapping[str, int | None] | None = None,
) -> int:
    """Milli-GPU on each of the job's GPUs: 1000 for whole GPUs; for a share, `gpus` in
    thousandths, raised to hold `gpu_memory` on the smallest GPU it may run on.

    `gpu_memory` maps each GPU type of the cluster to its memory in MiB (None: not known). A
    job asking for `gpu_memory` is refused (SpecError, field `gpu_memory`) when the memory of a
    type it may run on is not known, or is smaller than it asks. The types it may run on are
    those of the cluster it accepts; with none of them, nothing is checked here (the cluster's
    refusal names the types)."""
    milli = MILLI if isinstance(model.gpus, int) else round(model.gpus * MILLI)
    if model.gpu_memory is None:
        return milli
    known = dict(gpu_memory or {})
    accepted = _gpu_types(model)
    types = sorted(t for t in known if accepted is None or t in accepted)
    if not known:
        raise SpecError(
            "gpu_memory",
            "this manager does not know its GPUs' memory (declare it: corral up --gpu-memory SIZE)",
        )
    unknown = [t for t in types if known[t] is None]
    if unknown:
        raise SpecError(
            "gpu_memory",
            f"the memory of GPU type {unknown[0]} is not known here (declare it: corral up "
            "--gpu-memory SIZE)",
        )
    sized = [(known[t] or 0, t) for t in types]
    if not sized:
        return milli
    smallest, kind = min(sized)
    if model.gpu_memory > smallest:
        raise SpecError(
            "gpu_memory",
            f"asks for {_mib(model.gpu_memory)} but a GPU of type {kind} has {_mib(smallest)}",
        )
    if milli < MILLI:
        milli = max(milli, -(-model.gpu_memory * MILLI // smallest))  # rounded up
    return min(milli, MILLI)


def to_core_spec(
    model: JobSpecModel,
    job_id: str,
    submit_time: float,
    user: str,
    *,
    rate: float | None = None,
    spread_slowdown: float | None = None,
    gpu_memory: Mapping[str, int | None] | None = None,
) -> JobSpec:
    """The scheduling core's view of the job (the core needs no command, env or signal).

    Its length (`duration_s`, what sjf and srtf order by) is the user's estimate: `time_limit`,
    else `total_steps` at `rate`, the steps/s measured for its model; `spread_slowdown` is the
    one measured for it (Tiresias's profile placement), 1.0 when not known. A share of one GPU
    is `gpus` 1 with `gpu_milli` below 1000 (`share_milli`, with the GPU types' memory)."""
    gpu_types = _gpu_types(model)
    gpus = whole_gpus(model)
    milli = share_milli(model, gpu_memory)
    duration = model.time_limit
    if duration is None and model.total_steps is not None and rate:
        duration = model.total_steps / rate
    return JobSpec(
        id=job_id,
        submit_time=submit_time,
        gpus=gpus,
        user=user,
        vc=model.vc,
        gpu_types=gpu_types,
        priority=Priority(model.priority),
        max_retries=model.max_retries,
        gpus_per_worker=gpus // model.workers,
        model=model_key(model),
        total_steps=model.total_steps,
        duration_s=duration,
        spread_slowdown=spread_slowdown or 1.0,
        deadline=deadline_instant(model, submit_time),
        precheck_s=precheck_seconds(model),
        elastic=(
            None
            if model.elastic is None
            else Elastic(model.elastic.min_gpus, model.elastic.max_gpus, gpus)
        ),
        gpu_milli=milli,
        level=model.level,
        time_limit_s=model.time_limit,
    )


def signal_number(model: JobSpecModel) -> int:
    return int(signals.Signals[model.signal])


def argv(model: JobSpecModel) -> list[str]:
    """The command of a plain job's workers (a torchrun job's: corral.exec.local.launch_argv)."""
    if isinstance(model.command, str):
        return ["/bin/sh", "-c", model.command]
    return list(model.command)


def job_env(model: JobSpecModel) -> dict[str, str]:
    """The variables every worker gets from the spec: the submitter's environment, for
    `env_from: submitter`, under `env` (corral's own per worker go over both)."""
    if model.env_from != "submitter":
        return dict(model.env)
    return {**model.submitter_env, **model.env}
