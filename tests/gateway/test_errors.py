"""Error mapping and gateway-side truncation, checked without the gateway running: Triton's gRPC
errors to TEI kinds, both body shapes, and truncation against `tokenizers`' own truncation."""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace

import numpy as np
import orjson
import pytest
from tokenizers import Tokenizer
from tritonclient.utils import InferenceServerException

from prensa.gateway.backends import triton as triton_client
from prensa.gateway.backends.triton import translate_error
from prensa.gateway.core.tokenization import Truncation, as_items, token_id_limit, tokenize_items
from prensa.gateway.errors import ErrorKind, ErrorShape, GatewayError, error_body


@pytest.mark.parametrize(("status", "message", "kind", "code"), [
    ("StatusCode.UNAVAILABLE", "failed to connect to all addresses", ErrorKind.UNHEALTHY, 503),
    ("StatusCode.DEADLINE_EXCEEDED", "Deadline Exceeded", ErrorKind.UNHEALTHY, 503),
    ("StatusCode.UNAVAILABLE", "Exceeds maximum queue size", ErrorKind.OVERLOADED, 429),
    ("StatusCode.INTERNAL", "Failed to process the request(s) for model 'm_encode'", ErrorKind.BACKEND, 424),
    ("StatusCode.INVALID_ARGUMENT", "unexpected shape for input 'text'", ErrorKind.BACKEND, 424),
    # a stage whose stub died, and a model unloaded while `prensa serve` reloads it
    ("StatusCode.INTERNAL", "in ensemble 'm', Stub process 'm_encode_0_0' is not healthy.", ErrorKind.UNHEALTHY, 503),
    ("StatusCode.NOT_FOUND", "Request for unknown model: 'm' has no available versions", ErrorKind.UNHEALTHY, 503),
    ("StatusCode.NOT_FOUND", "Request for unknown model: 'nope' is not found", ErrorKind.BACKEND, 424),
])
def test_triton_errors_map_to_tei_kinds(status, message, kind, code):
    error = translate_error(InferenceServerException(message, status), "127.0.0.1:8001", 30)
    assert error.kind is kind and error.status == code


def test_a_503_for_a_model_down_says_when_to_come_back(monkeypatch):
    """The first outage of a model: about a reload; later ones: what the last outage had left."""
    clock = [100.0]
    monkeypatch.setattr(triton_client.time, "monotonic", lambda: clock[0])
    outages = triton_client.Outages()
    unloaded = InferenceServerException("Request for unknown model: 'm' has no available versions", "StatusCode.NOT_FOUND")

    def retry_after() -> int | None:
        error = translate_error(unloaded, "127.0.0.1:8001", 30, lambda: outages.down("m"))
        assert error.status == 503 and error.message.endswith(f"; retry in {error.retry_after_s} s"), error.message
        assert error.headers == {"Retry-After": str(error.retry_after_s)}
        return error.retry_after_s

    assert retry_after() == math.ceil(triton_client.FIRST_OUTAGE_S)
    clock[0] += 2.5
    assert retry_after() == 1  # past the expected end: at least a second
    clock[0] += 5.0
    outages.up("m")  # down 7.5 s
    clock[0] += 600.0
    assert retry_after() == 8
    clock[0] += 4.0
    assert retry_after() == 4
    assert outages.down("other") == math.ceil(triton_client.FIRST_OUTAGE_S)  # each model its own
    failed = InferenceServerException("Failed to process the request(s) for model 'm_encode'", "StatusCode.INTERNAL")
    assert translate_error(failed, "127.0.0.1:8001", 30, lambda: outages.down("m")).headers is None  # 424: no hint


class FlakyTriton:
    """Stands in for tritonclient's aio client: raises `failures` in turn, then answers."""

    def __init__(self, *failures: InferenceServerException) -> None:
        self.failures, self.calls = list(failures), 0

    async def infer(self, model, inputs, **kwargs):
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return SimpleNamespace(as_numpy=lambda name: np.ones((1, 4), np.float32))


@pytest.mark.parametrize(("failures", "calls", "status"), [
    # met a dead stub: tried once more, answered
    ([("in ensemble 'm', Stub process 'm_encode_0_0' is not healthy.", "StatusCode.INTERNAL")], 2, 200),
    # met a dead stub twice: the second failure is the client's 503
    ([("in ensemble 'm', Stub process 'm_encode_0_0' is not healthy.", "StatusCode.INTERNAL")] * 2, 2, 503),
    # unloaded for a reload: 503 at once, no second try
    ([("Request for unknown model: 'm' has no available versions", "StatusCode.NOT_FOUND")], 1, 503),
    # the request's own error: 424, no second try
    ([("Failed to process the request(s) for model 'm_encode'", "StatusCode.INTERNAL")], 1, 424),
])
def test_a_request_that_met_a_dead_stub_is_tried_once_more(failures, calls, status):
    async def call() -> int:
        client = triton_client.TritonClient("127.0.0.1:1", timeout_s=30, probe_timeout_s=2)
        client._client = FlakyTriton(*(InferenceServerException(m, s) for m, s in failures))
        try:
            await client.infer("m", {"text": np.asarray([[b"q"]], dtype=object)}, ["dense"])
            return 200
        except GatewayError as exc:
            return exc.status
        finally:
            assert client._client.calls == calls

    assert asyncio.run(call()) == status


def test_both_body_shapes():
    error = GatewayError(ErrorKind.OVERLOADED, "Model is overloaded")
    assert orjson.loads(error_body(error)) == {"error": "Model is overloaded", "error_type": "Overloaded"}
    assert orjson.loads(error_body(error, ErrorShape.OPENAI)) == {"message": "Model is overloaded", "code": 429,
                                                                    "type": "Overloaded"}


def test_inputs_as_a_batch():
    assert as_items("a") == ["a"]
    assert as_items([1, 2]) == [[1, 2]]
    assert as_items(["a", [1, 2]]) == ["a", [1, 2]]
    assert as_items([]) == []


MINILM_VOCAB = 30522  # bert-base-uncased's vocabulary, which all-MiniLM-L6-v2 uses


@pytest.fixture(scope="module")
def minilm_tokenizer(minilm_dir) -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def reference(path: str, max_length: int, direction: str, strategy: str = "longest_first") -> Tokenizer:
    tokenizer = Tokenizer.from_file(path)
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length, strategy=strategy, direction=direction)
    return tokenizer


@pytest.mark.parametrize("direction", ["right", "left"])
def test_truncation_matches_tokenizers(minilm_tokenizer, minilm_dir, direction):
    texts = ["short text", "a much longer text about Berlin and its many museums " * 5]
    rows = tokenize_items(minilm_tokenizer, texts, None, 16, Truncation(True, direction), MINILM_VOCAB)
    expected = reference(str(minilm_dir / "tokenizer.json"), 16, direction).encode_batch(texts)
    assert rows.ids == [e.ids for e in expected] and rows.cut
    queries, passages = ["what is in Berlin?"] * 2, ["museums", "Berlin has many museums and galleries " * 5]
    pairs = tokenize_items(minilm_tokenizer, queries, passages, 20, Truncation(True, direction), MINILM_VOCAB)
    expected = reference(str(minilm_dir / "tokenizer.json"), 20, direction).encode_batch(
        list(zip(queries, passages)))
    assert pairs.ids == [e.ids for e in expected] and pairs.type_ids == [e.type_ids for e in expected]


def test_token_ids_are_used_as_given(minilm_tokenizer):
    rows = tokenize_items(minilm_tokenizer, [[101, 7592, 2088, 102], "hi"], None, 3, Truncation(True, "left"),
                          MINILM_VOCAB)
    assert rows.ids[0] == [7592, 2088, 102] and rows.type_ids[0] == [0, 0, 0] and rows.cut
    with pytest.raises(GatewayError, match="Given: 4"):
        tokenize_items(minilm_tokenizer, [[101, 7592, 2088, 102]], None, 3, Truncation(False, "right"), MINILM_VOCAB)
    with pytest.raises(GatewayError, match="token ids must lie in"):
        tokenize_items(minilm_tokenizer, [[-1]], None, 3, Truncation(True, "right"), MINILM_VOCAB)
    assert token_id_limit(minilm_tokenizer) == MINILM_VOCAB
    tokenize_items(minilm_tokenizer, [[MINILM_VOCAB - 1]], None, 3, Truncation(True, "right"), MINILM_VOCAB)
    with pytest.raises(GatewayError, match="token ids must lie in"):
        tokenize_items(minilm_tokenizer, [[MINILM_VOCAB]], None, 3, Truncation(True, "right"), MINILM_VOCAB)
