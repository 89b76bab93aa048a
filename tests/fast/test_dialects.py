"""Which vendor's body a request on a shared path is (`apis.dialects`, the one place that tells
them apart), and that each is answered and refused as its vendor's server answers: a vLLM body's
bad request is vLLM's 400 with OpenAI's error object, which the OpenAI SDK raises as
BadRequestError; TEI's body on the same path keeps TEI's 422."""

from __future__ import annotations

import pytest

from prensa.gateway.apis.dialects import SHARED_PATHS, Dialect, dialect_of

# (path, the body's fields, its dialect): every ambiguous body pinned
BODIES = [
    ("/rerank", {"query", "texts"}, Dialect.TEI),
    ("/rerank", {"query", "texts", "raw_scores", "truncate"}, Dialect.TEI),
    ("/rerank", {"query", "documents"}, Dialect.VLLM),
    ("/rerank", {"query", "documents", "return_documents", "top_n"}, Dialect.VLLM),  # LiteLLM's hosted_vllm/
    ("/rerank", {"query", "documents", "return_documents", "raw_scores"}, Dialect.INFINITY),
    ("/classify", {"input", "model"}, Dialect.VLLM),
    ("/classify", {"input", "model", "raw_scores"}, Dialect.INFINITY),
    ("/score", {"query", "passages"}, Dialect.BGE_M3),
    ("/score", {"text_1", "text_2"}, Dialect.VLLM),
    ("/score", {"queries", "items"}, Dialect.VLLM),
    ("/tokenize", {"inputs"}, Dialect.TEI),
    ("/tokenize", {"prompt"}, Dialect.VLLM),
    ("/pooling", {"input"}, Dialect.VLLM),
    ("/v1/embeddings", {"input", "model", "dimensions"}, Dialect.OPENAI),
    ("/v1/embeddings", {"input", "input_type", "truncate"}, Dialect.OPENAI),  # NIM's
    ("/v1/embeddings", {"input", "embed_dtype", "encoding_format"}, Dialect.VLLM),
    ("/v1/embeddings", {"input", "truncate_prompt_tokens"}, Dialect.VLLM),
    ("/embeddings", {"input", "use_activation"}, Dialect.VLLM),
    ("/embeddings", {"input"}, Dialect.OPENAI),
    ("/invocations", {"inputs"}, Dialect.TEI),
    ("/invocations", {"input"}, Dialect.VLLM),
    ("/invocations", {"text_1", "text_2"}, Dialect.VLLM),
    ("/", {"query", "texts"}, Dialect.TEI),
]


@pytest.mark.parametrize(("path", "fields", "dialect"), BODIES)
def test_each_ambiguous_body_is_pinned_to_its_dialect(path, fields, dialect):
    assert dialect_of(path, fields) is dialect


def test_every_shared_path_is_pinned_and_others_are_their_routes():
    assert {path for path, _, _ in BODIES} == set(SHARED_PATHS)
    assert dialect_of("/embed", {"inputs"}) is None and dialect_of("/v1/rerank", {"documents"}) is None


def test_the_openai_sdk_raises_vllms_bad_request_for_a_vllm_body(http):
    """vLLM's `embed_dtype` on `/v1/embeddings`: 400 and OpenAI's error object, which the SDK reads
    as BadRequestError with the message; the same mistake in OpenAI's own fields stays TEI's 422."""
    import openai

    client = openai.OpenAI(base_url=f"{http.base_url}/v1", api_key="unused", http_client=http, max_retries=0)
    with pytest.raises(openai.BadRequestError) as raised:
        client.embeddings.create(input="dog", model="embed", extra_body={"embed_dtype": "int4"})
    assert raised.value.status_code == 400 and "embed_dtype" in raised.value.message
    with pytest.raises(openai.UnprocessableEntityError):
        client.embeddings.create(input="dog", model="embed", dimensions=-1)


def test_a_vllm_body_that_does_not_parse_is_refused_as_vllm_refuses_it(http):
    """The dialect is the body's even where it fails validation before any route runs."""
    answer = http.post("/rerank", json={"query": "q", "documents": ["a"], "top_n": -1, "model": "rerank"})
    assert answer.status_code == 400 and answer.json()["error"]["type"] == "BadRequestError", answer.text
    tei = http.post("/rerank", json={"query": "q", "texts": ["a"], "top_n": -1, "model": "rerank"})
    assert tei.status_code == 422 and tei.json()["error_type"] == "Validation", tei.text
