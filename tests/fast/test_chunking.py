"""Long inputs chunked on the server (opt-in): an input three times the model's window gives what
encoding its windows yourself and combining them gives; without chunking, truncation as before."""

from __future__ import annotations

import numpy as np
from tokenizers import Tokenizer

from tests.fast.conftest import MAX_LENGTH

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "in", "the", "city", "of", "berlin", "and", "paris"]
LONG = " ".join(WORDS[i % len(WORDS)] for i in range(3 * MAX_LENGTH))
SHORT = "the capital of germany"
OVERLAP = 4


def windows_by_hand(tokenizer: Tokenizer, text: str) -> list[str]:
    """The documented rule: spans of max_length - 2 tokens ([CLS] and [SEP] added), `OVERLAP` shared."""
    body = MAX_LENGTH - 2
    offsets = tokenizer.encode(text, add_special_tokens=False).offsets
    starts = range(0, len(offsets), body - OVERLAP)
    spans = []
    for start in starts:
        end = min(start + body, len(offsets))
        spans.append(text[offsets[start][0]:offsets[end - 1][1]])
        if end == len(offsets):
            break
    return spans


def unit(vector: np.ndarray) -> np.ndarray:
    return vector / np.linalg.norm(vector)


def test_dense_is_the_token_weighted_mean_of_the_windows(http, served):
    tokenizer = Tokenizer.from_file(str(served.exports["embed"] / "tokenizer.json"))
    spans = windows_by_hand(tokenizer, LONG)
    assert len(spans) >= 3
    chunked = http.post("/embed", json={"inputs": [SHORT, LONG], "chunking": {"overlap": OVERLAP}})
    assert chunked.status_code == 200, chunked.text
    assert chunked.headers["x-prensa-chunks"] == f"1,{len(spans)}"
    pieces = [http.post("/embed", json={"inputs": span}) for span in spans]
    tokens = np.asarray([int(p.headers["x-compute-tokens"]) for p in pieces], dtype=np.float64)
    vectors = np.asarray([p.json()[0] for p in pieces])
    expected = unit((vectors * tokens[:, None]).sum(0) / tokens.sum())
    np.testing.assert_allclose(chunked.json()[1], expected, atol=1e-5)
    np.testing.assert_allclose(chunked.json()[0], http.post("/embed", json={"inputs": SHORT}).json()[0], atol=1e-6)


def test_without_chunking_long_inputs_are_truncated_as_before(http, start_gateway):
    truncated = http.post("/embed", json={"inputs": LONG})
    assert "x-prensa-chunks" not in truncated.headers
    off = http.post("/embed", json={"inputs": LONG, "chunking": {"enabled": False}})
    assert off.json() == truncated.json()
    assert http.post("/embed", json={"inputs": LONG, "truncate": False}).status_code == 422
    server_wide = start_gateway(chunk_long_inputs=True)
    chunked = server_wide.post("/embed", json={"inputs": LONG, "truncate": False})
    assert chunked.status_code == 200 and int(chunked.headers["x-prensa-chunks"]) >= 3
    assert not np.allclose(chunked.json()[0], truncated.json()[0], atol=1e-3)


def test_m3_windows_combine_sparse_by_max_and_concatenate_colbert(http, served):
    tokenizer = Tokenizer.from_file(str(served.exports["m3"] / "tokenizer.json"))
    spans = windows_by_hand(tokenizer, LONG)
    body = {"inputs": LONG, "model": "m3", "chunking": {"overlap": OVERLAP}}
    (row,) = http.post("/embed_m3", json=body).json()
    pieces = http.post("/embed_m3", json={"inputs": spans, "model": "m3"}).json()
    assert row["chunks"] == len(spans) and row["num_tokens"] == sum(p["num_tokens"] for p in pieces)
    best: dict[int, float] = {}
    for piece in pieces:
        for weight in piece["sparse"]:
            best[weight["index"]] = max(best.get(weight["index"], 0.0), weight["value"])
    assert [w["index"] for w in row["sparse"]] == sorted(best)
    np.testing.assert_allclose([w["value"] for w in row["sparse"]], [best[i] for i in sorted(best)], atol=1e-6)
    np.testing.assert_allclose(row["colbert"], [v for p in pieces for v in p["colbert"]], atol=1e-6)
    tokens = np.asarray([p["num_tokens"] for p in pieces], dtype=np.float64)
    dense = np.asarray([p["dense"] for p in pieces])
    np.testing.assert_allclose(row["dense"], unit((dense * tokens[:, None]).sum(0) / tokens.sum()), atol=1e-5)


def test_openai_embeddings_say_how_many_windows_each_input_took(http):
    body = {"input": [SHORT, LONG], "model": "embed", "chunking": {"overlap": OVERLAP}}
    data = http.post("/v1/embeddings", json=body).json()["data"]
    tei = http.post("/embed", json={"inputs": [SHORT, LONG], "chunking": {"overlap": OVERLAP}})
    assert [d["chunks"] for d in data] == [int(c) for c in tei.headers["x-prensa-chunks"].split(",")]
    np.testing.assert_allclose([d["embedding"] for d in data], tei.json(), atol=1e-6)
    assert "chunks" not in http.post("/v1/embeddings", json={"input": LONG, "model": "embed"}).json()["data"][0]
