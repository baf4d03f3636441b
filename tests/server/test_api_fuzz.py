"""schemathesis against a live manager (HTTP on 127.0.0.1), with an admin's token and with a
user's (of a VC): requests made from the OpenAPI document, valid and invalid, never get a 5xx,
and every answer is one the document gives for that operation, with the body it documents (a
user's 403s included).

The jobs it submits are accepted and queued as any would be, but an executor that runs nothing
ends them at once: the fuzzer's random commands are never run. CORRAL_FUZZ_EXAMPLES sets the
cases per operation, mode and token (12 by default; a longer hunt: 200).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import APIOperation, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from corral.server.boot import RunningServer
from tests.server.helpers import admin_token
from tests.server.inert import start_inert

#: Cases per operation, mode (valid, invalid) and token: about 60 s on 2 cores in all.
EXAMPLES = int(os.environ.get("CORRAL_FUZZ_EXAMPLES", "12"))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    response_schema_conformance,
    content_type_conformance,
]


@pytest.fixture(scope="module")
def live(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[RunningServer, dict[str, str]]]:
    """The server, and a token by role: `admin`, and `user` (alice of VC `default`)."""
    data_dir = tmp_path_factory.mktemp("fuzz") / "corral"
    server = start_inert(data_dir)
    try:
        admin = admin_token(data_dir)
        made = httpx.post(
            f"{server.url}/api/v1/tokens",
            json={"user": "alice", "vc": "default"},
            headers={"Authorization": f"Bearer {admin}"},
            timeout=30,
        )
        assert made.status_code == 201, made.text
        yield server, {"admin": admin, "user": made.json()["token"]}
    finally:
        server.stop()


def fuzz(operation: APIOperation, mode: GenerationMode, token: str) -> None:
    """Hypothesis runs of `operation`'s cases (schemathesis's pytest plugin does the same per
    operation; it is not used: its 4.x releases need pytest's private `_nodeid`)."""

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,  # the same cases each run: a failure here is never a fluke
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: schemathesis.Case) -> None:
        case.call_and_validate(headers={"Authorization": f"Bearer {token}"}, checks=CHECKS)

    run()


@pytest.mark.parametrize("role", ["admin", "user"])
def test_the_api_answers_every_request_as_its_openapi_document_says(
    live: tuple[RunningServer, dict[str, str]], role: str
) -> None:
    server, tokens = live
    token = tokens[role]
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10, [op.label for op in operations]
    failed: list[str] = []
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                fuzz(operation, mode, token)
            # Every operation is tried, and every failure reported (schemathesis's is a
            # BaseExceptionGroup).
            except (Exception, BaseExceptionGroup) as error:
                failed.append(f"{operation.label} ({mode.value}): {error}")
    assert not failed, "\n\n".join(failed)
