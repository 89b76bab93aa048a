"""The official `openai` client against `/v1/embeddings`, compared with direct Triton calls."""

from __future__ import annotations

import base64

import numpy as np
import openai
import pytest

from tests.bodies import error_of

pytestmark = pytest.mark.triton

TEXTS = ["What is the capital of Germany?", "Berlin is the capital of Germany.", "ok",
         "Émilie a mangé une pomme à Montréal; 東京は日本の首都です。"]


@pytest.fixture(scope="module")
def client(gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0)


def as_vector(embedding: list[float] | str) -> np.ndarray:
    """The client decodes base64 itself only when it chose the format; decode it here otherwise."""
    if isinstance(embedding, str):
        return np.frombuffer(base64.b64decode(embedding), dtype="<f4")
    return np.asarray(embedding, dtype=np.float32)


@pytest.mark.parametrize("encoding_format", ["float", "base64", openai.NOT_GIVEN])
def test_openai_client_gets_triton_vectors(client, direct, encoding_format):
    response = client.embeddings.create(model="minilm", input=TEXTS, encoding_format=encoding_format)
    expected = direct("minilm", TEXTS)
    got = np.stack([as_vector(item.embedding) for item in sorted(response.data, key=lambda d: d.index)])
    np.testing.assert_allclose(got, expected["dense"], atol=1e-6)
    assert [d.index for d in response.data] == list(range(len(TEXTS)))
    assert response.model == "minilm" and response.object == "list"
    assert response.usage.prompt_tokens == response.usage.total_tokens == int(expected["num_tokens"].sum())


def test_base64_is_little_endian_float32(http, direct):
    body = http.post("/v1/embeddings", json={"input": "ok", "model": "bge-m3", "encoding_format": "base64"}).json()
    vector = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(vector, direct("bge-m3", ["ok"])["dense"][0], atol=1e-6)


def test_usage_counts_special_tokens(client, tokenizer):
    response = client.embeddings.create(model="minilm", input="hello world")
    assert response.usage.prompt_tokens == len(tokenizer("minilm").encode("hello world").ids) == 4  # [CLS] .. [SEP]


def test_token_id_inputs_match_their_text(client, direct, tokenizer):
    ids = [tokenizer("minilm").encode(text).ids for text in TEXTS[:2]]
    batch = client.embeddings.create(model="minilm", input=ids, encoding_format="float")
    single = client.embeddings.create(model="minilm", input=ids[0], encoding_format="float")
    expected = direct("minilm", TEXTS[:2])["dense"]
    np.testing.assert_allclose([d.embedding for d in batch.data], expected, atol=1e-5)
    np.testing.assert_allclose(single.data[0].embedding, expected[0], atol=1e-5)


def test_dimensions_truncate_then_renormalise(client, direct):
    response = client.embeddings.create(model="minilm", input=TEXTS[:2], dimensions=64, encoding_format="float")
    full = direct("minilm", TEXTS[:2])["dense"][:, :64]
    expected = full / np.linalg.norm(full, axis=1, keepdims=True)
    got = np.array([d.embedding for d in response.data])
    assert got.shape == (2, 64)
    np.testing.assert_allclose(got, expected, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)


@pytest.mark.parametrize("dimensions", [0, 385])
def test_bad_dimensions_are_422(client, dimensions):
    with pytest.raises(openai.UnprocessableEntityError) as error:
        client.embeddings.create(model="minilm", input="ok", dimensions=dimensions)
    assert error.value.body["type"] == "Validation"


def test_default_model_and_alias_route(http, direct):
    body = http.post("/embeddings", json={"input": ["ok"]}).json()
    assert body["model"] == "minilm"
    np.testing.assert_allclose(body["data"][0]["embedding"], direct("minilm", ["ok"])["dense"][0], atol=1e-6)


def test_unknown_model_is_openai_404(client, http):
    with pytest.raises(openai.NotFoundError) as error:
        client.embeddings.create(model="no-such-model", input="ok")
    assert "no-such-model" in error.value.message
    body = error_of(http.post("/v1/embeddings", json={"input": "ok", "model": "no-such-model"}))
    assert set(body) == {"message", "code", "type"} and body["code"] == 404


def test_openai_error_shapes(http):
    empty = http.post("/v1/embeddings", json={"input": [], "model": "minilm"})
    assert empty.status_code == 400 and error_of(empty) == {"message": "`inputs` cannot be empty", "code": 400,
                                                          "type": "Empty"}
    wrong = http.post("/v1/embeddings", json={"input": {"text": "ok"}})
    assert wrong.status_code == 422 and wrong.json()["type"] == "Validation"
    bad_format = http.post("/v1/embeddings", json={"input": "ok", "encoding_format": "hex"})
    assert bad_format.status_code == 422
