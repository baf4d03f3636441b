"""corral.client's tries, without a manager: which failed calls are made again, and the decoding
of a log stream cut anywhere (the live tests are tests/server/test_sdk_restart.py and
test_log_stream.py)."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from corral.client import Client, ClientError, JsonClient, _Decoder

URL = "http://corral.test:8470"


def scripted(answers: list[httpx.Response | Exception], seen: list[str]) -> httpx.MockTransport:
    """A transport that answers each request with the next of `answers` (an exception is
    raised instead), and records each request as `METHOD PATH`."""

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}")
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    return httpx.MockTransport(handle)


def test_a_503_is_tried_again_until_the_manager_answers() -> None:
    # Two 503s (a manager starting, a store outage), then the answer: three requests, one
    # answer, and the pauses between (0.1 s backoff, jittered to 0.05-0.1, then 0.1-0.2)
    # are short.
    seen: list[str] = []
    answers: list[httpx.Response | Exception] = [
        httpx.Response(503, json={"detail": "the store is unavailable"}),
        httpx.Response(503, json={"detail": "the store is unavailable"}),
        httpx.Response(200, json={"user": "admin"}),
    ]
    with Client(URL, "t", transport=scripted(answers, seen)) as client:
        began = time.monotonic()
        assert client.whoami() == {"user": "admin"}
        assert time.monotonic() - began < 5
    assert seen == ["GET /api/v1/whoami"] * 3


def test_a_call_that_may_not_be_repeated_is_not_once_sent() -> None:
    # A release whose connection broke after it was sent: made again, it would be refused
    # (not held) or act twice, so the error is raised at once (one request). A hold is made
    # again (holding a held job changes nothing): two requests.
    seen: list[str] = []
    broken = httpx.ReadError("connection reset")
    answers: list[httpx.Response | Exception] = [broken]
    with Client(URL, "t", transport=scripted(answers, seen)) as client:
        with pytest.raises(ClientError) as caught:
            client.release("7")
    assert (
        caught.value.message
        == f"cannot reach corral at {URL}: is `corral up` running? (CORRAL_URL)"
    )
    assert seen == ["POST /api/v1/jobs/7/release"]
    seen.clear()
    summary = {
        "id": "7", "name": "n", "user": "u", "vc": "a", "status": "PENDING", "gpus": 1,
        "workers": 1, "priority": "normal", "submitted_at": 0.0, "started_at": None,
        "finished_at": None, "attempts": 0, "preemptions": 0, "failures": 0, "placement": [],
        "reason": "held by u", "exit_code": None,
    }  # fmt: skip
    answers = [broken, httpx.Response(200, json=summary)]
    with Client(URL, "t", transport=scripted(answers, seen)) as client:
        assert client.hold("7").reason == "held by u"
    assert seen == ["POST /api/v1/jobs/7/hold"] * 2


def test_a_refusal_is_raised_at_once() -> None:
    # A 4xx other than 503 is the manager's answer: raised, never tried again.
    seen: list[str] = []
    answers: list[httpx.Response | Exception] = [
        httpx.Response(422, json={"detail": "gpus: must be a positive integer"}),
    ]
    with Client(URL, "t", transport=scripted(answers, seen)) as client:
        with pytest.raises(ClientError) as caught:
            client.submit({"name": "x", "gpus": 0, "command": ["true"]})
    assert (caught.value.status, caught.value.message) == (422, "gpus: must be a positive integer")
    assert seen == ["POST /api/v1/jobs"]


def test_a_manager_never_reached_fails_at_once() -> None:
    # One URL where nothing listens, never reached: not a restart, so no tries for 60 s.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    for kind in (Client, JsonClient):
        with kind(url, "t", failover_s=60) as client:
            began = time.monotonic()
            with pytest.raises(ClientError) as caught:
                client.whoami()
            assert time.monotonic() - began < 10
            assert caught.value.message.startswith(f"cannot reach corral at {url}")


def test_a_stream_cut_inside_a_character_resumes_at_its_first_byte() -> None:
    # "é→x" is 2 + 3 + 1 bytes. Cut after each byte: the text so far holds only whole
    # characters, and the offset (where a new stream would start) is that of the first byte
    # of the cut character, so reading on from it gives the rest exactly.
    data = "é→x".encode()
    for cut in range(len(data) + 1):
        decoder = _Decoder(100)
        text = decoder.decode(data[:cut])
        start = decoder.offset - 100
        assert data[:start].decode() == text
        assert text + data[start:].decode() == "é→x"
        assert start == {0: 0, 1: 0, 2: 2, 3: 2, 4: 2, 5: 5, 6: 6}[cut]
