"""Error mapping and gateway-side truncation, checked without the gateway running: Triton's gRPC
errors to TEI kinds, both body shapes, and truncation against `tokenizers`' own truncation."""

from __future__ import annotations

import orjson
import pytest
from tokenizers import Tokenizer
from tritonclient.utils import InferenceServerException

from prensa.gateway.errors import ErrorKind, GatewayError, error_body
from prensa.gateway.tokenization import Truncation, as_items, token_id_limit, tokenize_items
from prensa.gateway.triton_client import translate_error


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


def test_both_body_shapes():
    error = GatewayError(ErrorKind.OVERLOADED, "Model is overloaded")
    assert orjson.loads(error_body(error, "/embed")) == {"error": "Model is overloaded", "error_type": "Overloaded"}
    assert orjson.loads(error_body(error, "/v1/embeddings")) == {"message": "Model is overloaded", "code": 429,
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
    expected = reference(str(minilm_dir / "tokenizer.json"), 20, direction, "only_second").encode_batch(
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
