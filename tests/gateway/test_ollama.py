"""Ollama's clients, unchanged, against a real gateway and Triton: the `ollama` package and
langchain-ollama, every vector compared with a direct Triton call."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from prensa.manifest import Manifest
from tests.gateway.test_clients import TEXTS, unit

pytestmark = pytest.mark.triton


def test_ollama_client_embed_and_its_options(gateway, direct, tokenizer):
    import ollama

    client = ollama.Client(host=gateway)
    expected = direct("minilm", TEXTS)["dense"]
    response = client.embed(model="minilm", input=TEXTS)
    np.testing.assert_allclose(response.embeddings, expected, atol=1e-5)
    assert response.model == "minilm"
    assert response.prompt_eval_count == sum(len(tokenizer("minilm").encode(t).ids) for t in TEXTS)
    # one text, Ollama's tag on the name, Matryoshka dimensions re-normalised
    short = client.embed(model="minilm:latest", input=TEXTS[0], dimensions=8).embeddings
    np.testing.assert_allclose(short, unit(expected[:1, :8]), atol=1e-5)
    assert client.embed(model="minilm", input=TEXTS[0], dimensions=10_000).embeddings[0] == pytest.approx(
        expected[0].tolist(), abs=1e-5)  # past the embedding size: ignored, as Ollama does
    assert client.embed(model="minilm", input=[]).embeddings == []
    assert len(client.embed(model="minilm", input=TEXTS[0], options={"num_ctx": 4096, "temperature": 0},
                            keep_alive="5m").embeddings) == 1


def test_ollama_client_older_route_is_not_normalised(gateway, direct, http):
    import ollama

    vector = np.asarray(ollama.Client(host=gateway).embeddings(model="minilm", prompt=TEXTS[0]).embedding)
    np.testing.assert_allclose(unit(vector), direct("minilm", TEXTS[:1])["dense"][0], atol=1e-5)
    raw = http.post("/embed", json={"inputs": TEXTS[0], "normalize": False, "model": "minilm"}).json()[0]
    np.testing.assert_allclose(vector, raw, atol=1e-5)
    assert abs(np.linalg.norm(vector) - 1) > 1e-3, "all-MiniLM-L6-v2 normalises: the raw vector's norm is not 1"


def test_ollama_errors_reach_its_client(gateway):
    import ollama

    client = ollama.Client(host=gateway)
    with pytest.raises(ollama.ResponseError) as unknown:
        client.embed(model="nope", input="a")
    assert unknown.value.status_code == 404 and "nope" in unknown.value.error
    with pytest.raises(ollama.ResponseError) as short_context:
        client.embed(model="minilm", input="a", options={"num_ctx": 16})
    assert short_context.value.status_code == 422 and "num_ctx" in short_context.value.error
    with pytest.raises(ollama.ResponseError) as too_long:
        client.embed(model="minilm", input="word " * 2000, truncate=False)
    assert too_long.value.status_code == 422
    with pytest.raises(ollama.ResponseError) as not_an_embedder:
        client.embed(model="reranker", input="a")
    assert not_an_embedder.value.status_code == 422


def test_ollama_model_routes(gateway, exports):
    import ollama

    client = ollama.Client(host=gateway)
    listed = {m.model for m in client.list().models}
    assert {"minilm:latest", "bge-m3:latest", "reranker:latest"} <= listed
    shown = client.show("minilm:latest")
    manifest = Manifest.read(exports["minilm"])
    assert shown.capabilities == ["embedding"]
    assert shown.modelinfo["embed.context_length"] == manifest.max_length
    assert shown.modelinfo["embed.embedding_length"] == len(client.embed(model="minilm", input="a").embeddings[0])
    assert client.show("reranker").capabilities == []
    with pytest.raises(ollama.ResponseError) as unknown:
        client.show("nope")
    assert unknown.value.status_code == 404


def test_langchain_ollama(gateway, direct):
    from langchain_ollama import OllamaEmbeddings

    embeddings = OllamaEmbeddings(model="minilm", base_url=gateway, validate_model_on_init=True)
    np.testing.assert_allclose(embeddings.embed_documents(TEXTS), direct("minilm", TEXTS)["dense"], atol=1e-5)
    np.testing.assert_allclose(embeddings.embed_query(TEXTS[1]), direct("minilm", TEXTS[1:])["dense"][0], atol=1e-5)


def test_ollama_routes_need_the_api_key(start_gateway):
    url = start_gateway(api_key="secret")
    assert httpx.post(f"{url}/api/embed", json={"model": "minilm", "input": "a"}).status_code == 401
    assert httpx.get(f"{url}/api/tags").status_code == 401
    assert httpx.get(f"{url}/api/tags", headers={"Authorization": "Bearer secret"}).status_code == 200
