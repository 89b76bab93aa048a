"""Prompts from a model's sentence-transformers config: `prompt_name` (TEI), `input_type` (NIM,
Cohere), `--default-prompt-name` / `--default-prompt`, against sentence-transformers' own
`encode(prompt_name=...)` on the same weights."""

from __future__ import annotations

from dataclasses import replace

import httpx
import numpy as np
import pytest

from tests.gateway.conftest import running_gateway
from tests.tiny_models import PROMPTS

pytestmark = pytest.mark.triton

TEXTS = ["how are module attributes looked up?", "Attributes are looked up in the module's namespace dictionary."]
MODEL = "minilm-prompts"


@pytest.fixture(scope="module")
def oracle(prompted_dir):
    """sentence-transformers' vectors of TEXTS under each prompt name (None: no prompt)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(prompted_dir), device="cpu")
    assert PROMPTS.items() <= model.prompts.items()
    return {name: model.encode(TEXTS, prompt_name=name, normalize_embeddings=True)
            for name in (None, "query", "passage")}


def test_prompt_name_on_tei_routes(http, oracle):
    for name in ("query", "passage"):
        vectors = http.post("/embed", json={"inputs": TEXTS, "model": MODEL, "prompt_name": name}).json()
        np.testing.assert_allclose(vectors, oracle[name], atol=1e-5)
    plain = http.post("/embed", json={"inputs": TEXTS, "model": MODEL}).json()
    np.testing.assert_allclose(plain, oracle[None], atol=1e-5)
    assert not np.allclose(oracle["query"], oracle[None], atol=1e-3)  # the prompt changes the vector
    similarity = http.post("/similarity", json={"model": MODEL, "inputs": {"source_sentence": TEXTS[0],
                                                                           "sentences": [TEXTS[1]]},
                                                "parameters": {"prompt_name": "query"}}).json()
    np.testing.assert_allclose(similarity, [oracle["query"][1] @ oracle["query"][0]], atol=1e-5)
    tokens = http.post("/tokenize", json={"inputs": TEXTS[0], "model": MODEL, "prompt_name": "query"}).json()[0]
    assert [t["text"] for t in tokens[1:3]] == ["query", ":"]


def test_unknown_prompts_are_refused(http):
    unknown = http.post("/embed", json={"inputs": TEXTS, "model": MODEL, "prompt_name": "nope"})
    assert unknown.status_code == 422
    assert "nope" in unknown.json()["error"] and "passage, query" in unknown.json()["error"]
    none_defined = http.post("/embed", json={"inputs": TEXTS, "model": "minilm", "prompt_name": "query"})
    assert none_defined.status_code == 422 and "its prompts: none" in none_defined.json()["error"]


@pytest.mark.parametrize("path, body_of, vectors_of, refused", [
    ("/v1/embeddings", lambda t: {"input": TEXTS, "model": MODEL, "input_type": t},
     lambda a: [d["embedding"] for d in a["data"]], 422),
    ("/v2/embed", lambda t: {"texts": TEXTS, "model": MODEL, "input_type": t}, lambda a: a["embeddings"]["float"],
     400),  # Cohere's status for a body it cannot read
])
def test_input_types_pick_the_prompt_of_their_role(http, oracle, path, body_of, vectors_of, refused):
    roles = {"query": "query", "search_query": "query", "passage": "passage", "search_document": "passage",
             "document": "passage", "clustering": None}
    for input_type, prompt in roles.items():
        response = http.post(path, json=body_of(input_type))
        assert response.status_code == 200, response.text
        np.testing.assert_allclose(vectors_of(response.json()), oracle[prompt], atol=1e-5, err_msg=input_type)
    assert http.post(path, json=body_of("questions")).status_code == refused
    # A model without prompts embeds the text as given, whatever the input type says.
    symmetric = http.post(path, json={**body_of("search_query"), "model": "minilm"}).json()
    np.testing.assert_allclose(vectors_of(symmetric), oracle[None], atol=1e-5)


def test_default_prompt_flags(settings, oracle):
    with running_gateway(replace(settings, default_prompt_name="passage")) as url:
        vectors = httpx.post(f"{url}/embed", json={"inputs": TEXTS, "model": MODEL}).json()
        np.testing.assert_allclose(vectors, oracle["passage"], atol=1e-5)
        named = httpx.post(f"{url}/embed", json={"inputs": TEXTS, "model": MODEL, "prompt_name": "query"}).json()
        np.testing.assert_allclose(named, oracle["query"], atol=1e-5)  # the request's own name wins
        untouched = httpx.post(f"{url}/embed", json={"inputs": TEXTS, "model": "minilm"}).json()
        np.testing.assert_allclose(untouched, oracle[None], atol=1e-5)  # no such prompt there: none
    with running_gateway(replace(settings, default_prompt=PROMPTS["query"])) as url:
        vectors = httpx.post(f"{url}/embed", json={"inputs": TEXTS, "model": MODEL}).json()
        np.testing.assert_allclose(vectors, oracle["query"], atol=1e-5)
    with pytest.raises(AssertionError, match="did not start"), \
            running_gateway(replace(settings, default_prompt_name="no-such-prompt")):
        pass
