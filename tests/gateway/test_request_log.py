"""Request ids and the per-request log line: the client's `x-request-id` (or its `traceparent`'s
trace id) comes back on every response, rejections included, and the log line of that request
carries it with the model, inputs, tokens and stage times; JSON lines parse."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import orjson
import pytest

from prensa.gateway.logs import JsonLines, request_id
from tests.log_records import Records, records_of

pytestmark = pytest.mark.triton
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.fixture
def access_log() -> Iterator[Records]:
    with records_of("prensa.access") as handler:
        yield handler


def access_lines(access_log: Records, rid: str) -> list[dict]:
    return [r.fields for r in access_log.records if r.fields["request_id"] == rid]


def test_the_clients_request_id_comes_back_and_is_logged(http, access_log):
    response = http.post("/embed", json={"inputs": ["one text", "two texts"]}, headers={"x-request-id": "rag-42"})
    assert response.status_code == 200 and response.headers["x-request-id"] == "rag-42"
    (line,) = access_lines(access_log, "rag-42")
    assert line["status"] == 200 and line["path"] == "/embed" and line["model"] == "minilm"
    assert line["inputs"] == 2 and line["tokens"] == int(response.headers["x-compute-tokens"]) > 0
    assert line["total_ms"] >= line["inference_ms"] > 0


def test_errors_and_rejections_carry_the_id_and_their_reason(http, access_log):
    invalid = http.post("/embed", json={"inputs": [""]}, headers={"x-request-id": "bad-1"})
    assert invalid.status_code == 422 and invalid.headers["x-request-id"] == "bad-1"
    assert invalid.json()["request_id"] == "bad-1"
    assert access_lines(access_log, "bad-1")[0]["error"] == invalid.json()["error"]
    not_json = http.post("/embed", content=b"x", headers={"x-request-id": "bad-2", "content-type": "text/plain"})
    assert not_json.status_code == 415 and not_json.headers["x-request-id"] == "bad-2"
    assert not_json.json()["request_id"] == "bad-2"  # answered by middleware.JsonBody, before any route
    assert "Content-Type" in access_lines(access_log, "bad-2")[0]["error"]
    unknown = http.post("/v1/embeddings", json={"input": "x", "model": "nope"}, headers={"x-request-id": "bad-3"})
    assert unknown.status_code == 404 and unknown.json()["request_id"] == "bad-3"  # OpenAI's shape too


def test_a_traceparent_or_nothing_gives_an_id(http):
    traced = http.post("/embed", json={"inputs": "x"}, headers={"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"})
    assert traced.headers["x-request-id"] == TRACE
    first, second = (http.get("/health").headers["x-request-id"] for _ in range(2))
    assert first != second and len(first) == 32


def test_unsafe_client_ids_are_replaced():
    assert request_id([(b"x-request-id", b"ok-1")]) == "ok-1"
    for unsafe in (b"two words", b"a\r\nb", b"x" * 200, b""):
        replaced = request_id([(b"x-request-id", unsafe)])
        assert replaced != unsafe.decode("latin-1") and len(replaced) == 32


def test_json_lines_parse():
    record = logging.LogRecord("prensa.access", logging.INFO, __file__, 1, "POST /embed 200", None, None)
    record.fields = {"request_id": "r", "status": 200}
    line = orjson.loads(JsonLines().format(record))
    assert line["message"] == "POST /embed 200" and line["request_id"] == "r" and line["level"] == "INFO"
