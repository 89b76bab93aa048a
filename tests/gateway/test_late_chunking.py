"""Jina's late chunking on all-MiniLM-L6-v2 through a real gateway and Triton: each chunk's vector
is the mean of its own tokens' states in one pass over the whole document (the model's own
transformer, read with sentence-transformers, is the reference), and that is why a user wants it: a
chunk that says "its" of an earlier chunk's city is found by a question about that city."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.triton

CHUNKS = ["Berlin is the capital and largest city of Germany.",
          "Its more than 3.85 million inhabitants make it the most populous city of the European Union.",
          "The city is also one of the states of Germany."]
QUERY = "How many people live in Berlin?"


def reference(minilm_dir) -> np.ndarray:
    """Each chunk's mean token state in one pass over [CLS] + the chunks' tokens + [SEP]."""
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm_dir), device="cpu")
    tokenizer = model.tokenizer
    pieces = [tokenizer(chunk, add_special_tokens=False)["input_ids"] for chunk in CHUNKS]
    ids = [tokenizer.cls_token_id, *(i for piece in pieces for i in piece), tokenizer.sep_token_id]
    with torch.no_grad():
        states = model[0].auto_model(input_ids=torch.tensor([ids])).last_hidden_state[0].numpy()
    vectors, start = [], 1
    for piece in pieces:
        vectors.append(states[start : start + len(piece)].mean(axis=0))
        start += len(piece)
    vectors = np.stack(vectors)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def embed(http, inputs, **fields) -> np.ndarray:
    answer = http.post("/v1/embeddings", json={"model": "minilm", "input": inputs, **fields})
    assert answer.status_code == 200, answer.text
    return np.asarray([d["embedding"] for d in answer.json()["data"]])


def test_late_chunks_equal_the_models_own_states_and_find_the_pronoun(http, minilm_dir):
    late = embed(http, CHUNKS, late_chunking=True)
    np.testing.assert_allclose(late, reference(minilm_dir), atol=1e-4)
    alone = embed(http, CHUNKS)
    query = embed(http, [QUERY])[0]
    # the second chunk names no city: alone it is the query's worst match, read in its document the best
    assert int(np.argmax(alone @ query)) != 1 and int(np.argmax(late @ query)) == 1, (alone @ query, late @ query)
    assert late[1] @ query > alone[1] @ query + 0.1
