"""Nothing a client sends can crash, hang or exhaust the manager: bodies too large, NUL
characters, JSON nested too deep or with a key given twice, numbers beyond what the database holds,
specs beyond their caps; listings are paginated, never read specs, and many at once get no 5xx;
the OpenAPI document says what the API answers. On a live server (HTTP on 127.0.0.1), SQLite and
PostgreSQL."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from corral import client as client_module
from corral.client import Client
from corral.server import limits
from corral.server.boot import RunningServer
from corral.server.spec import (
    MAX_ARGUMENT_BYTES,
    MAX_ARGUMENTS,
    MAX_ENV_VARS,
    MAX_SPEC_BYTES,
    MAX_WORKDIR_BYTES,
    SpecError,
    parse_job_spec,
)
from corral.server.store import MAX_JOB_ID, Store, jobs_table
from tests.server.helpers import admin_token, api
from tests.server.inert import start_inert

SPEC = {"name": "probe", "gpus": 1, "command": "true"}
MIB = 1 << 20


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    data_dir = tmp_path_factory.mktemp("limits") / "corral"
    server = start_inert(data_dir)
    try:
        yield server, data_dir
    finally:
        server.stop()


@pytest.fixture
def client(live: tuple[RunningServer, Path]) -> Iterator[httpx.Client]:
    server, data_dir = live
    with api(server.url, admin_token(data_dir)) as opened:
        yield opened


def refused(response: httpx.Response, status: int, detail: str | None = None) -> str:
    """The one-line detail of a refusal with `status` (and that detail, when given)."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    found = response.json()["detail"]
    assert isinstance(found, str) and "\n" not in found, found
    if detail is not None:
        assert found == detail
    return found


def job_count(client: httpx.Client) -> int:
    return len(client.get("/api/v1/jobs", params={"limit": 10_000}).json())


def rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakMemory:
    """The most this process's resident memory grew while in the block (sampled every 5 ms):
    the server runs in this process."""

    def __init__(self) -> None:
        self.grew = 0
        self._done = threading.Event()

    def __enter__(self) -> PeakMemory:
        self._start = rss_bytes()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._done.wait(0.005):
            self.grew = max(self.grew, rss_bytes() - self._start)

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()
        self.grew = max(self.grew, rss_bytes() - self._start)


class Sent:
    """How many MiB a streamed body had produced when the answer came."""

    def __init__(self) -> None:
        self.mib = 0


def megabytes(count: int, sent: Sent | None = None) -> Iterator[bytes]:
    """`count` MiB, one MiB at a time (the test never holds more)."""
    chunk = b"x" * MIB
    for _ in range(count):
        if sent is not None:
            sent.mib += 1
        yield chunk


# -- request bodies -------------------------------------------------------------------------------


def test_a_200_mb_body_is_refused_within_a_second_without_being_read(
    client: httpx.Client,
) -> None:
    before = job_count(client)
    sent = Sent()
    with PeakMemory() as memory:
        started = time.monotonic()
        response = client.post(
            "/api/v1/jobs",
            content=megabytes(200, sent),
            headers={"Content-Length": str(200 * MIB)},
        )
        took = time.monotonic() - started
    detail = refused(response, 413)
    assert detail == f"the request body is too large ({200 * MIB} bytes); at most {MIB} bytes"
    assert response.headers["connection"] == "close"
    # Decided from the header: the answer comes while the client is still sending (the socket
    # buffers take a few MiB), so it takes milliseconds, whatever the body's size.
    assert sent.mib < 200, sent.mib
    assert took < 1.0, took
    assert memory.grew < 50 * MIB, memory.grew
    assert client.get("/api/v1/whoami").status_code == 200  # the server is fine
    assert job_count(client) == before


def test_a_chunked_body_is_refused_once_it_passes_the_limit(client: httpx.Client) -> None:
    with PeakMemory() as memory:
        started = time.monotonic()
        response = client.post("/api/v1/jobs", content=megabytes(200))  # no Content-Length
        took = time.monotonic() - started
    assert response.request.headers["transfer-encoding"] == "chunked"
    refused(response, 413, f"the request body is too large; at most {MIB} bytes")
    assert took < 2.0, took
    assert memory.grew < 50 * MIB, memory.grew
    # The same for a route whose body FastAPI reads itself.
    refused(client.post("/api/v1/tokens", content=megabytes(3)), 413)
    assert client.get("/api/v1/whoami").status_code == 200


def test_the_body_limit_is_a_setting(tmp_path: Path) -> None:
    server = start_inert(tmp_path / "corral", max_body_bytes=4096)
    try:
        with api(server.url, admin_token(tmp_path / "corral")) as client:
            padded = {**SPEC, "env": {"PAD": "x" * 5000}}
            refused(client.post("/api/v1/jobs", json=padded), 413)
            small = {**SPEC, "env": {"PAD": "x" * 3000}}
            assert client.post("/api/v1/jobs", json=small).status_code == 201
    finally:
        server.stop()


# -- NUL characters -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "detail"),
    [
        ("/api/v1/jobs?vc=a%00b", "vc: must not contain a NUL character"),
        ("/api/v1/jobs?user=%00", "user: must not contain a NUL character"),
        ("/api/v1/jobs?status=RUNNING%00", "status: must not contain a NUL character"),
        ("/api/v1/jobs?x%00=1", "x\\x00: must not contain a NUL character"),
        ("/api/v1/jobs/1%00", "path: must not contain a NUL character"),
        ("/api/v1/jobs/1/logs?stream=std%00out", "stream: must not contain a NUL character"),
        ("/index.html%00", "path: must not contain a NUL character"),
    ],
)
def test_a_nul_character_in_the_path_or_a_parameter_is_refused(
    client: httpx.Client, path: str, detail: str
) -> None:
    refused(client.get(path), 422, detail)


@pytest.mark.parametrize(
    ("fields", "detail"),
    [
        ({"command": "tr\0ue"}, "command: must not contain a NUL character"),
        ({"command": ["echo", "a\0b"]}, "command.1: must not contain a NUL character"),
        ({"workdir": "/tmp\0/x"}, "workdir: must not contain a NUL character"),
        ({"env": {"A": "1\0"}}, "env.A: must not contain a NUL character"),
        (
            {"env": {"A\0": "1"}},
            "env.A\\x00: a variable name must not contain '=' or a NUL character",
        ),
        ({"vc": "de\0fault"}, "vc: must not contain a NUL character"),
        ({"gpu_type": ["gpu", "a\0"]}, "gpu_type.1: must not contain a NUL character"),
        ({"name": "a\0"}, "name: must be 1-63 characters of letters, digits, '.', '_' and '-'"),
    ],
)
def test_a_nul_character_in_the_spec_is_refused(
    client: httpx.Client, fields: dict[str, Any], detail: str
) -> None:
    refused(client.post("/api/v1/jobs", json={**SPEC, **fields}), 422, detail)


@pytest.mark.parametrize(
    ("submitted", "detail"),
    [
        (
            {"CORRAL_TOKEN": "stolen"},
            "submitter_env.CORRAL_TOKEN: corral's own variables (its credentials, what it sets "
            "per worker) are never passed",
        ),
        (
            {"A;rm -rf /": "x"},
            "submitter_env.A;rm -rf /: a variable name must be letters, digits and '_', not "
            "starting with a digit",
        ),
        (
            {"X\u2028Y": "x"},
            "submitter_env.X\\u2028Y: a variable name must be letters, digits and '_', not "
            "starting with a digit",
        ),
        ({"BIG": "x" * 70000}, "submitter_env: must be at most 65536 bytes in all (got 70004)"),
    ],
)
def test_a_hostile_submitter_environment_is_refused_in_one_line(
    client: httpx.Client, submitted: dict[str, str], detail: str
) -> None:
    before = client.get("/api/v1/jobs").json()
    body = {**SPEC, "env_from": "submitter", "submitter_env": submitted}
    refused(client.post("/api/v1/jobs", json=body), 422, detail)
    assert client.get("/api/v1/jobs").json() == before  # nothing stored


# -- JSON: duplicate keys, nesting ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (
            '{"name": "a", "gpus": 1, "gpus": 2, "command": "true"}',
            "gpus: duplicate key (given twice)",
        ),
        (
            '{"name": "a", "gpus": 1, "command": "true", "env": {"A": "1", "A": "2"}}',
            "env.A: duplicate key (given twice)",
        ),
        (
            '{"name": "a", "gpus": 1, "command": ["x", {"k": 1, "k": 2}]}',
            "command.1.k: duplicate key (given twice)",
        ),
    ],
)
def test_a_key_given_twice_is_refused_and_named(
    client: httpx.Client, body: str, detail: str
) -> None:
    refused(client.post("/api/v1/jobs", content=body), 422, detail)


def test_a_key_given_twice_is_refused_on_every_route(client: httpx.Client) -> None:
    body = '{"user": "alice", "user": "mallory"}'
    refused(client.post("/api/v1/tokens", content=body), 422, "user: duplicate key (given twice)")


DEEP = "the body nests arrays and objects more than 32 deep"


@pytest.mark.parametrize(
    "body",
    [
        "[" * 1000 + "]" * 1000,
        "[" * 100_000 + "]" * 100_000,
        "[" * 1000 + "}" * 1000,  # unbalanced: refused without the parser recursing
        '{"a": ' * 1000 + "1" + "}" * 1000,
        json.dumps({**SPEC, "env": {"A": json.loads("[" * 31 + "1" + "]" * 31)}}),  # 33 levels
    ],
)
def test_nesting_deeper_than_32_is_refused_before_parsing(client: httpx.Client, body: str) -> None:
    refused(client.post("/api/v1/jobs", content=body), 422, DEEP)


def test_nesting_within_the_limit_and_brackets_in_strings_are_fine(client: httpx.Client) -> None:
    # 32 levels: the body's object, env's, and 30 arrays.
    nested = json.dumps({**SPEC, "env": {"A": json.loads("[" * 30 + "1" + "]" * 30)}})
    refused(client.post("/api/v1/jobs", content=nested), 422, "env.A: must be a string")
    brackets = {**SPEC, "command": "echo '" + "[{" * 5000 + '\\"' + "'"}
    response = client.post("/api/v1/jobs", json=brackets)
    assert response.status_code == 201, response.text


def test_invalid_json_is_one_line(client: httpx.Client) -> None:
    detail = refused(client.post("/api/v1/jobs", content=b'{"name": '), 422)
    assert detail.startswith("the body is not valid JSON: ")
    refused(client.post("/api/v1/jobs", content=b"\xff\xfe"), 422, "the body is not UTF-8 (byte 0)")
    refused(
        client.post("/api/v1/jobs", content=b""),
        422,
        "the body is empty: a JSON document is expected",
    )


@pytest.mark.parametrize(
    ("text", "deeper"),
    [
        ("[]", False),
        ("[" * 32 + "]" * 32, False),
        ("[" * 33 + "]" * 33, True),
        ('["' + "[" * 100 + '"]', False),  # in a string
        ('["\\"' + "[" * 100 + '"]', False),  # after an escaped quote, still in the string
        ("[" + "{}, [], " * 1000 + "1]", False),  # wide, not deep
        ("[{" * 17 + "}]" * 17, True),  # 34 levels, alternating
    ],
)
def test_the_depth_scan(text: str, deeper: bool) -> None:
    assert limits.json_depth_exceeds(text) is deeper


# -- workdir --------------------------------------------------------------------------------------


def test_the_workdir_must_be_an_existing_directory_on_the_manager(
    client: httpx.Client, tmp_path: Path
) -> None:
    missing = tmp_path / "gone"
    refused(
        client.post("/api/v1/jobs", json={**SPEC, "workdir": str(missing)}),
        422,
        f"workdir: {missing} does not exist on the manager's machine",
    )
    file = tmp_path / "file"
    file.write_text("")
    refused(
        client.post("/api/v1/jobs", json={**SPEC, "workdir": str(file)}),
        422,
        f"workdir: {file} is not a directory (on the manager's machine)",
    )
    refused(
        client.post("/api/v1/jobs", json={**SPEC, "workdir": "work"}),
        422,
        "workdir: must be an absolute path on the manager's machine (got work)",
    )
    accepted = client.post("/api/v1/jobs", json={**SPEC, "workdir": str(tmp_path)})
    assert accepted.status_code == 201, accepted.text


# -- numbers and ids ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "detail"),
    [
        ("/api/v1/jobs?limit=9223372036854775808", "limit: must be less than or equal to 10000"),
        ("/api/v1/jobs?limit=10001", "limit: must be less than or equal to 10000"),
        ("/api/v1/jobs?limit=0", "limit: must be greater than or equal to 1"),
        ("/api/v1/jobs?limit=1e3", None),
        (
            "/api/v1/jobs?before_id=2147483649",
            "before_id: must be less than or equal to 2147483648",
        ),
        ("/api/v1/jobs?before_id=" + "9" * 5000, None),
        ("/api/v1/queue?limit=18446744073709551616", "limit: must be less than or equal to 10000"),
        ("/api/v1/jobs/1/logs?offset=" + str(2**63), None),
        ("/api/v1/jobs/1/logs?rank=" + str(2**63), None),
        ("/api/v1/jobs/1/logs?attempt=" + str(2**64), None),
    ],
)
def test_integer_parameters_beyond_their_bounds_are_refused(
    client: httpx.Client, path: str, detail: str | None
) -> None:
    refused(client.get(path), 422, detail)


@pytest.mark.parametrize("offset", [2**44, 2**62])
def test_a_log_offset_far_past_the_end_is_no_server_error(
    client: httpx.Client, offset: int
) -> None:
    job_id = client.post("/api/v1/jobs", json=SPEC).json()["id"]
    response = client.get(f"/api/v1/jobs/{job_id}/logs", params={"offset": offset})
    assert response.status_code < 500, response.text


BIG_IDS = [
    str(MAX_JOB_ID + 1),
    "9999999999",
    str(2**63),
    str(2**64),
    "1" + "0" * 30,
    "0" * 5000 + "1" * 20,
]


def check_big_ids(client: httpx.Client) -> None:
    for job_id in BIG_IDS:
        shown = job_id if len(job_id) <= limits.MAX_ECHO_CHARS else job_id[:64] + "..."
        for response in (
            client.get(f"/api/v1/jobs/{job_id}"),
            client.post(f"/api/v1/jobs/{job_id}/cancel"),
            client.get(f"/api/v1/jobs/{job_id}/logs"),
        ):
            refused(response, 404, f"no job {shown}")


def test_a_job_id_beyond_the_database_column_is_no_job(client: httpx.Client) -> None:
    check_big_ids(client)


# -- listings -------------------------------------------------------------------------------------


def test_listings_are_pages_with_a_next_page_header(tmp_path: Path, monkeypatch: Any) -> None:
    server = start_inert(tmp_path / "corral")
    try:
        token = admin_token(tmp_path / "corral")
        with api(server.url, token) as client:
            ids = [client.post("/api/v1/jobs", json=SPEC).json()["id"] for _ in range(7)]
            newest_first = ids[::-1]
            pages: list[list[str]] = []
            params: dict[str, Any] = {"limit": 3}
            while True:
                response = client.get("/api/v1/jobs", params=params)
                assert response.status_code == 200
                pages.append([job["id"] for job in response.json()])
                after = response.headers.get("X-Corral-Next-Before-Id")
                if after is None:
                    break
                assert after == pages[-1][-1]
                params["before_id"] = after
            assert pages == [newest_first[:3], newest_first[3:6], newest_first[6:]]
            everything = client.get("/api/v1/jobs")  # the default page holds them all
            assert "X-Corral-Next-Before-Id" not in everything.headers
            assert len(everything.json()) == 7
        monkeypatch.setattr(client_module, "PAGE_SIZE", 2)
        with Client(server.url, token) as sdk:
            assert [job["id"] for job in sdk.jobs()] == newest_first  # every page
            assert [job["id"] for job in sdk.jobs(limit=5)] == newest_first[:5]
    finally:
        server.stop()


def test_a_listing_reads_no_spec(tmp_path: Path) -> None:
    store = Store(Store.sqlite_url(tmp_path))
    for job_id, workers in ((1, 2), (2, 4), (3, 1)):
        spec = {**SPEC, "gpus": 4, "workers": workers}
        store.insert_job(
            job_id,
            name=f"j{job_id}",
            user="u",
            vc="default",
            priority="guaranteed",
            gpus=4,
            spec=spec,
            submitted_at=1.0,
        )
    engine = sa.create_engine(Store.sqlite_url(tmp_path), poolclass=NullPool)
    with engine.begin() as connection:
        # Job 1: a spec that cannot be decoded; a listing never notices.
        connection.execute(jobs_table.update().where(jobs_table.c.id == 1).values(spec="{not json"))
        # Job 2: stored before the workers column: the database reads it from the spec.
        connection.execute(jobs_table.update().where(jobs_table.c.id == 2).values(workers=None))
    engine.dispose()
    listed = store.list_jobs()
    assert [(row.id, row.workers) for row in listed] == [("3", 1), ("2", 4), ("1", 2)]
    assert not hasattr(listed[0], "spec")
    assert [row.id for row in store.list_jobs(ids=["3", "1", "x", str(2**70)])] == ["3", "1"]
    assert [row.id for row in store.list_jobs(before_id=3, limit=1)] == ["2"]
    with pytest.raises(ValueError):
        store.get_job(1)  # the full row does decode its spec
    store.close()


def test_sixty_concurrent_listings_of_big_specs_get_no_server_error(
    tmp_path: Path,
) -> None:
    server = start_inert(tmp_path / "corral")
    try:
        token = admin_token(tmp_path / "corral")
        with api(server.url, token) as client:
            big = {**SPEC, "env": {f"V{n}": "x" * 60_000 for n in range(4)}}  # 240 KB each
            for _ in range(40):
                assert client.post("/api/v1/jobs", json=big).status_code == 201

        def listing(_: int) -> list[int]:
            with api(server.url, token) as own:
                return [
                    own.get("/api/v1/jobs", params={"limit": 10_000}).status_code for _ in range(3)
                ]

        with ThreadPoolExecutor(max_workers=64) as pool:
            statuses = [code for codes in pool.map(listing, range(64)) for code in codes]
        assert statuses == [200] * 192
    finally:
        server.stop()


# -- the OpenAPI document and unknown paths -------------------------------------------------------


def test_the_openapi_document_tells_every_error(client: httpx.Client) -> None:
    document = client.get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    assert schemas["ErrorBody"]["required"] == ["detail"]
    assert "HTTPValidationError" not in schemas and "ValidationError" not in schemas
    for path, item in document["paths"].items():
        for method, operation in item.items():
            responses = operation["responses"]
            where = f"{method.upper()} {path}"
            if not path.startswith("/api/"):
                continue
            assert {"401", "422"} <= set(responses), where
            for status, response in responses.items():
                if status.startswith("4"):
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (where, status)
            if "{" in path:
                assert "404" in responses, where
            if "requestBody" in operation:
                assert "413" in responses, where
    assert "403" in document["paths"]["/api/v1/jobs"]["post"]["responses"]
    assert "403" in document["paths"]["/api/v1/jobs/{job_id}/cancel"]["post"]["responses"]
    listed = document["paths"]["/api/v1/jobs"]["get"]
    limit = next(p for p in listed["parameters"] if p["name"] == "limit")["schema"]
    assert (limit["minimum"], limit["maximum"]) == (1, 10_000)
    assert "X-Corral-Next-Before-Id" in listed["responses"]["200"]["headers"]


def test_the_job_spec_schema_carries_its_constraints(client: httpx.Client) -> None:
    spec = client.get("/openapi.json").json()["components"]["schemas"]["JobSpec"]
    fields = spec["properties"]
    assert spec["additionalProperties"] is False
    assert fields["name"]["pattern"] == "^[A-Za-z0-9._-]+$" and fields["name"]["maxLength"] == 63
    whole, share = fields["gpus"]["anyOf"]  # whole GPUs, or a share of one GPU
    assert (whole["type"], whole["minimum"], whole["maximum"]) == ("integer", 1, 1_000_000)
    assert (share["exclusiveMinimum"], share["exclusiveMaximum"]) == (0, 1)
    sized, _, _ = fields["gpu_memory"]["anyOf"]
    assert (sized["minimum"], sized["maximum"]) == (1, 1 << 20)
    string, listed = fields["command"]["anyOf"]
    assert string["maxLength"] == MAX_ARGUMENT_BYTES and listed["maxItems"] == MAX_ARGUMENTS
    assert fields["env"]["maxProperties"] == MAX_ENV_VARS
    assert fields["env"]["propertyNames"]["pattern"] == "^[^=\\x00]+$"
    assert fields["workdir"]["anyOf"][0]["maxLength"] == MAX_WORKDIR_BYTES
    assert fields["grace_seconds"]["minimum"] == 0


@pytest.mark.parametrize(
    ("method", "path", "status", "detail"),
    [
        ("GET", "/api/v2/x", 404, "no such API path: /api/v2/x"),
        ("GET", "/api/v1/nope", 404, "no such API path: /api/v1/nope"),
        ("POST", "/api/v1/nope", 404, "no such API path: /api/v1/nope"),
        ("GET", "/api/index.html", 404, "no such API path: /api/index.html"),
        ("DELETE", "/api/v1/jobs", 405, "DELETE /api/v1/jobs: not allowed; use GET, POST"),
        ("GET", "/api/v1/jobs/1/cancel", 405, "GET /api/v1/jobs/1/cancel: not allowed; use POST"),
    ],
)
def test_an_unknown_api_path_is_a_json_error_not_the_dashboard(
    client: httpx.Client, method: str, path: str, status: int, detail: str
) -> None:
    refused(client.request(method, path), status, detail)


def test_the_dashboard_is_still_served(client: httpx.Client) -> None:
    response = client.get("/")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")


# -- the spec's caps ------------------------------------------------------------------------------

ARG = "x" * MAX_ARGUMENT_BYTES


@pytest.mark.parametrize(
    ("fields", "detail"),
    [
        (
            {"command": ARG + "x"},
            f"command: must be at most {MAX_ARGUMENT_BYTES} bytes (got 131072)",
        ),
        (
            {"command": "é" * (MAX_ARGUMENT_BYTES // 2 + 1)},
            f"command: must be at most {MAX_ARGUMENT_BYTES} bytes (got 131072)",
        ),
        (
            {"command": ["echo", ARG + "x"]},
            f"command.1: must be at most {MAX_ARGUMENT_BYTES} bytes (got 131072)",
        ),
        ({"command": ["x"] * 4097}, "command: must have at most 4096 arguments (got 4097)"),
        (
            {"env": {f"V{n}": "1" for n in range(MAX_ENV_VARS + 1)}},
            "env: must have at most 1024 variables (got 1025)",
        ),
        (
            {"env": {"N" * 256: "1"}},
            f"env.{'N' * 96}...: a variable name must be at most 255 bytes (got 256)",
        ),
        (
            {"env": {"AB": "x" * (MAX_ARGUMENT_BYTES - 2)}},  # AB=... is a byte too long
            f"env.AB: must be at most {MAX_ARGUMENT_BYTES - 3} bytes (got 131069)",
        ),
        (
            {"workdir": "/" + "d" * MAX_WORKDIR_BYTES},
            f"workdir: must be at most {MAX_WORKDIR_BYTES} bytes (got 4096)",
        ),
        ({"vc": "v" * 129}, "vc: must be at most 128 characters (got 129)"),
        ({"gpu_type": ["a"] * 65}, "gpu_type: must list at most 64 GPU types (got 65)"),
        ({"signal": "SIG" + "X" * 100}, "signal: must be a signal name such as SIGTERM"),
        ({"command": "echo \ud800"}, "command: must be Unicode text (it holds a lone surrogate)"),
        ({"z" * 5000: 1}, "z" * 100 + "...: unknown field"),
        ({"co\nlour\ud800": 1}, "co\\nlour\\ud800: unknown field"),
    ],
)
def test_a_spec_beyond_a_cap_is_refused_in_one_line(fields: dict[str, Any], detail: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_job_spec({**SPEC, **fields})
    assert str(caught.value) == detail


def test_the_caps_themselves_are_accepted_and_the_whole_spec_is_capped() -> None:
    assert parse_job_spec({**SPEC, "command": ARG}).command == ARG
    assert parse_job_spec({**SPEC, "env": {"A": "x" * (MAX_ARGUMENT_BYTES - 2)}})
    parse_job_spec({**SPEC, "command": ["x"] * MAX_ARGUMENTS})
    big = {f"V{n}": "x" * 100_000 for n in range(3)}  # each within its cap, 300 KB in all
    with pytest.raises(SpecError) as caught:
        parse_job_spec({**SPEC, "env": big})
    assert str(caught.value).startswith("the job spec is 300")
    assert str(caught.value).endswith(f"bytes as JSON; at most {MAX_SPEC_BYTES}")


def test_the_whole_spec_is_capped_at_the_byte_as_the_store_writes_it() -> None:
    """The cap counts the JSON the store keeps, to the byte: ASCII (an é is 6 characters, a
    character outside the BMP 12), nested specs (elastic, dataset) and every default included."""
    fields: dict[str, Any] = {
        **SPEC,
        "gpus": 2,
        "elastic": {"min_gpus": 2, "max_gpus": 4},
        "dataset": {"name": "imagenet", "size_gb": 150.5},
        "gpu_type": ["A100", "h100"],
        "after": [1, 2],
        "command": ["python", "-c", "print('\u00e9\U0001f600')"],
    }

    def sized(pad: int) -> dict[str, Any]:  # the env's values: "é" * 1,000 and `pad` x's
        half = pad // 2
        return {**fields, "env": {"E": "\u00e9" * 1000, "A": "x" * half, "B": "x" * (pad - half)}}

    def stored(spec: dict[str, Any]) -> int:
        return len(json.dumps(parse_job_spec(spec).model_dump(mode="json")))

    pad = MAX_SPEC_BYTES - stored(sized(0))
    assert stored(sized(pad)) == MAX_SPEC_BYTES  # at the cap: accepted
    with pytest.raises(SpecError) as caught:
        parse_job_spec(sized(pad + 1))
    assert str(caught.value) == (
        f"the job spec is {MAX_SPEC_BYTES + 1} bytes as JSON; at most {MAX_SPEC_BYTES}"
    )
    for more, size in [("\u00e9", 6), ("\U0001f600", 12)]:  # one character more: 6, 12 bytes
        spec = sized(pad)
        spec["env"]["E"] += more
        with pytest.raises(SpecError, match=f"^the job spec is {MAX_SPEC_BYTES + size} bytes"):
            parse_job_spec(spec)


# -- PostgreSQL -----------------------------------------------------------------------------------


def test_big_ids_nul_filters_and_listings_on_postgresql(postgres_url: str, tmp_path: Path) -> None:
    server = start_inert(tmp_path / "corral", db_url=postgres_url)
    try:
        with api(server.url, admin_token(tmp_path / "corral")) as client:
            check_big_ids(client)
            for name in ("vc", "user", "status"):
                refused(
                    client.get(f"/api/v1/jobs?{name}=a%00"),
                    422,
                    f"{name}: must not contain a NUL character",
                )
            refused(client.get("/api/v1/jobs?before_id=" + str(2**40)), 422)
            ids = [
                client.post("/api/v1/jobs", json={**SPEC, "gpus": 2, "workers": 2}).json()["id"]
                for _ in range(3)
            ]
            engine = sa.create_engine(postgres_url, poolclass=NullPool)
            with engine.begin() as connection:  # as if stored before the workers column
                connection.execute(
                    jobs_table.update().where(jobs_table.c.id == int(ids[0])).values(workers=None)
                )
            engine.dispose()
            first = client.get("/api/v1/jobs", params={"limit": 2})
            assert [job["id"] for job in first.json()] == ids[:0:-1]
            after = first.headers["X-Corral-Next-Before-Id"]
            rest = client.get("/api/v1/jobs", params={"limit": 2, "before_id": after}).json()
            assert [(job["id"], job["workers"]) for job in rest] == [(ids[0], 2)]
            assert client.get("/api/v1/jobs/" + str(MAX_JOB_ID)).status_code == 404
    finally:
        server.stop()


# -- corral up ------------------------------------------------------------------------------------


def test_corral_up_takes_the_body_limit(tmp_path: Path, monkeypatch: Any) -> None:
    from click.testing import CliRunner

    from corral.cli.main import app  # (before corral.cli.up, which it imports)
    from corral.server.manager import Manager

    seen: list[int] = []

    def serve(manager: Manager, options: object) -> None:
        seen.append(manager.settings.max_body_bytes)
        manager.stop()

    monkeypatch.setattr("corral.cli.up.serve", serve)
    args = ["up", "--gpus", "1", "--single-user", "--data-dir", str(tmp_path / "d")]
    result = CliRunner().invoke(app, [*args, "--max-body-bytes", "65536"])
    assert result.exit_code == 0, result.output
    assert seen == [65536]
    result = CliRunner().invoke(app, [*args, "--max-body-bytes", "10"])
    assert result.exit_code == 2 and "--max-body-bytes" in result.output


def test_a_mib_of_brackets_is_refused_without_hanging_the_server(client: httpx.Client) -> None:
    # The worst case of the depth scan: a MiB of arrays 31 deep, side by side, in one array.
    wide = b"[" + b",".join([b"[" * 31 + b"]" * 31] * 15_000) + b"]"
    deep = b"[" * (MIB // 2) + b"]" * (MIB // 2)
    for body, detail in (
        (wide, "the job spec must be a mapping of fields"),
        (deep, DEEP),
    ):
        assert len(body) <= MIB
        started = time.monotonic()
        refused(client.post("/api/v1/jobs", content=body), 422, detail)
        # A guard against a scan that hangs (a naive one is quadratic), not a speed claim:
        # milliseconds on an idle machine, seconds on a loaded one.
        assert time.monotonic() - started < 60.0
