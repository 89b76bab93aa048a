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


def test_every_dialect_a_shared_path_picks_has_its_own_body_and_operation(http):
    """The route table is complete: each dialect a rule picks on a shared route has a body model
    and an operation there, and the OpenAPI body of the path is one of those models."""
    from prensa.gateway.apis.shared import SHARED

    spec = http.get("/openapi.json").json()
    for path, _, dialect in BODIES:
        if path in SHARED:
            assert dialect in SHARED[path].operations, (path, dialect)
    for path, shared in SHARED.items():
        body = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        named = {ref["$ref"].split("/")[-1] for ref in body["oneOf"]}
        assert named == {operation.request.__name__ for operation in shared.operations.values()}, path


@pytest.mark.parametrize(("path", "body", "foreign", "vllm"), [
    ("/rerank", {"query": "q", "texts": ["a"], "return_documents": True}, "return_documents", False),
    ("/rerank", {"query": "q", "documents": ["a"], "return_text": True}, "return_text", True),
    ("/rerank", {"query": "q", "documents": ["a"], "truncation_direction": "left"}, "truncation_direction", True),
    ("/rerank", {"query": "q", "documents": ["a"], "raw_scores": True, "truncate_prompt_tokens": 4},
     "truncate_prompt_tokens", False),  # Infinity's body: TEI's error shape
    ("/tokenize", {"inputs": "a", "return_token_strs": True}, "return_token_strs", False),
    ("/score", {"text_1": "q", "text_2": ["a"], "weights": [1, 0, 0]}, "weights", True),
    ("/classify", {"input": "a", "raw_scores": True, "use_activation": True}, "use_activation", False),
])
def test_a_field_of_another_dialects_body_is_refused_by_name(http, path, body, foreign, vllm):
    """A body is read as one dialect's by its fields; a field only another dialect's body has on the
    same path would be silently ignored there, so it is refused, named, in the body's dialect."""
    model = {"/rerank": "rerank", "/tokenize": "embed", "/score": "rerank", "/classify": "classify"}[path]
    answer = http.post(path, json={**body, "model": model})
    if vllm:
        assert answer.status_code == 400 and answer.json()["error"]["type"] == "BadRequestError", answer.text
        message = answer.json()["error"]["message"]
    else:
        assert answer.status_code == 422 and answer.json()["error_type"] == "Validation", answer.text
        message = answer.json()["error"]
    assert f"`{foreign}`" in message, message
    own = {key: value for key, value in body.items() if key != foreign}
    assert http.post(path, json={**own, "model": model}).status_code == 200


def test_a_failed_field_is_named_without_the_dialect_pydantic_tags_it_with(http):
    answer = http.post("/rerank", json={"query": "q", "documents": "not a list", "model": "rerank"})
    assert answer.status_code == 400 and "`documents`:" in answer.json()["error"]["message"], answer.text
    tei = http.post("/rerank", json={"query": "q", "texts": [1], "model": "rerank"})
    assert tei.status_code == 422 and "`texts.0`:" in tei.json()["error"], tei.text


def test_a_hybrid_score_is_served_unchanged_whatever_its_activation(http):
    """bge-m3's `/score` has no activation to leave out: `use_activation: false` serves the same scores."""
    body = {"model": "m3", "query": "the capital of france", "passages": ["paris is the capital", "the dog"]}
    plain = http.post("/score", json=body)
    raw = http.post("/score", json={**body, "use_activation": False})
    assert plain.status_code == raw.status_code == 200, raw.text
    assert plain.json() == raw.json()


def test_invocations_reads_a_shared_paths_body_in_its_dialect(http):
    """SageMaker's route runs a shared path's operation as that path reads the body: Infinity's
    `/classify` body gets Infinity's answer there too, vLLM's gets vLLM's."""
    infinity = http.post("/invocations", json={"input": ["a dog"], "raw_scores": True, "model": "classify"})
    assert infinity.status_code == 200 and infinity.json()["object"] == "classify", infinity.text
    assert infinity.json()["data"] == http.post("/classify", json={"input": ["a dog"], "raw_scores": True,
                                                                   "model": "classify"}).json()["data"]
    vllm = http.post("/invocations", json={"input": ["a dog"], "model": "classify"})
    assert vllm.status_code == 200 and vllm.json()["object"] == "list" and "probs" in vllm.json()["data"][0]
    mixed = http.post("/invocations", json={"input": ["a dog"], "raw_scores": True, "use_activation": True,
                                            "model": "classify"})
    # SageMaker's path answers an `input` body's errors as vLLM's `/invocations` does
    assert mixed.status_code == 400 and "`use_activation`" in mixed.json()["error"]["message"], mixed.text
